"""``farm sync`` (follow the legacy binlog), ``farm sync status`` and ``farm cutover``."""

from __future__ import annotations

import os
import signal
import socket

import click

from farmcore.preflight import preflight
from loaders.migration import follower
from scripts.app import App
from scripts.cmd_runs import sync_view
from scripts.options import Seconds, emit, farm_options
from scripts.render import note
from workers import cutover as cutting


@click.group("sync", invoke_without_command=True)
@click.option("--until-caught-up", is_flag=True,
              help="Stop once every change the legacy server has logged is applied.")
@farm_options
@click.pass_context
def sync_group(ctx: click.Context, app: App, until_caught_up: bool) -> None:
    """Follow the legacy server's binary log and apply every change to the target.

    Any number may run: one leads (a lease in the control database), the others take
    over when it stops. Stops cleanly on SIGTERM or Ctrl-C.
    """
    if ctx.invoked_subcommand is not None:
        if until_caught_up:
            raise click.UsageError(f"--until-caught-up goes with 'farm sync' itself, not with "
                                   f"'farm sync {ctx.invoked_subcommand}'")
        return
    preflight(app.settings, app.router)
    f = follower.Follower(app.settings, app.router, app.runtime.ledger,
                          owner=f"{socket.gethostname()}:{os.getpid()}",
                          host=socket.gethostname(), until_caught_up=until_caught_up)
    signal.signal(signal.SIGTERM, lambda *_: f.stop.set())
    try:
        f.run()
    except KeyboardInterrupt:
        f.stop.set()
    emit(follower.status(app.runtime.ledger, None))


@sync_group.command("status")
@farm_options
def sync_status(app: App) -> None:
    """Lag (seconds and transactions), keys applied per table, quarantine by reason, the
    leader and its host, as one JSON line."""
    emit(sync_view(app) or {"state": "never run"})


@click.command("cutover")
@click.option("--freeze", is_flag=True,
              help="Set the legacy server read-only first (restored if the cut-over fails).")
@click.option("--timeout", default=600.0, show_default=True, type=Seconds(min=1),
              help="Seconds to wait for sync to apply everything.")
@farm_options
def cutover(app: App, freeze: bool, timeout: float) -> None:
    """Wait until sync has applied everything, verify, and print one verdict line.

    Exit 0 only when the target is exact (0 mismatches).
    """
    verdict = cutting.cutover(app.runtime, freeze, timeout, notice=note)
    click.echo(verdict.line())
    if not verdict.ok:
        raise SystemExit(1)


def register(cli: click.Group) -> None:
    """Attach this module's commands."""
    cli.add_command(sync_group)
    cli.add_command(cutover)
