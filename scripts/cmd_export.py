"""``farm export`` and ``farm cron`` (the nightly scheduler)."""

from __future__ import annotations

import signal
import threading

import click

from exporters import export as exporter
from scripts.app import App
from scripts.follow import finish
from scripts.options import AS_JSON, CommaList, emit, farm_options
from scripts.render import note
from shardfarm import tuning
from shardfarm.errors import UsageError
from shardfarm.redact import redact_url
from shardfarm.settings import export_url_problem
from workers import cron as scheduler
from workers import launch


def _dest(ctx: click.Context, param: click.Parameter, url: str | None) -> str | None:
    """``--dest`` checked as ``FARM_EXPORT_URL`` is, but a bad one is a usage mistake."""
    problem = None if url is None else export_url_problem(url)
    if problem:
        raise UsageError(f"bad --dest: {redact_url(url)} ({problem})")
    return url


_DEST = click.option("--dest", default=None, metavar="URL", callback=_dest,
                     help="s3://bucket/prefix or file:///abs/dir (default: FARM_EXPORT_URL).")
_TABLES = click.option("--tables", default=None, metavar="T,...", type=CommaList(),
                       help="Only these tables (default: every object and mapping table).")
_FROM = click.option("--from", "role", type=click.Choice(exporter.ROLES), default="master",
                     show_default=True, help="Read each shard from its master or its slave.")
_FORMAT = click.option("--format", "fmt", type=click.Choice(["jsonl", "parquet"]),
                       default="jsonl", show_default=True,
                       help="gzip JSON Lines, or Parquet (needs pyarrow).")


@click.command("export")
@click.option("--date", required=True, metavar="YYYY-MM-DD", help="The dt= partition to write.")
@_DEST
@_TABLES
@_FROM
@_FORMAT
@click.option("--force", is_flag=True, help="Rewrite parts that are already there and intact.")
@click.option("--wait", is_flag=True, help="Show progress until the run ends; exit 0 if done.")
@AS_JSON
@farm_options
def export(app: App, date: str, dest: str | None, tables: list[str] | None, role: str, fmt: str,
           force: bool, wait: bool, as_json: bool) -> None:
    """Export every shard of each table to {dest}/{table}/dt={date}/ for Spark.

    One chunk per table and run of up to 64 shards on one server streams one
    consistent snapshot into a part-{shard:05d}.jsonl.gz per shard; when a
    table's parts are all there, _manifest.json and then _SUCCESS are written.
    Running it again for the same date skips intact parts (unless --force).
    """
    run_id = launch.export(app.runtime, date, dest, tables or [], fmt, role, force,
                           notice=note)
    finish(app, run_id, wait, as_json)


@click.command("cron")
@click.option("--at", "at", default=None, metavar="CRON",
              help="When to export the previous UTC day: 5 cron fields, UTC. "
                   f"[env: FARM_EXPORT_CRON; default: {scheduler.DEFAULT_AT}]")
@click.option("--once", is_flag=True, help="One round (take the lease, fire what is due), exit.")
@click.option("--name", default="export", show_default=True,
              callback=lambda _ctx, param, name: scheduler.check_name(name, param.opts[0]),
              help="The schedule entry's name (its state and leader lease).")
@_DEST
@_TABLES
@_FROM
@_FORMAT
@farm_options
def cron(app: App, at: str | None, once: bool, name: str, dest: str | None,
         tables: list[str] | None, role: str, fmt: str) -> None:
    """Nightly scheduler: start the export of the previous UTC day at each slot of --at.

    Run as many as you like (the Procfile's 'clock'); one leads through a lease
    in Redis, and the control database makes each slot fire once. Slots missed
    while none ran are caught up on start (up to 7, oldest first). Prints one
    JSON line per export started.
    """
    at = str(tuning.value("FARM_EXPORT_CRON", given=at, flag="--at"))
    export_args = {"dest": dest, "tables": tables or [], "from": role, "format": fmt}
    s = launch.cron_scheduler(app.runtime, name, at, export_args)
    if once:
        emit(s.once())
        return
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    click.echo(f"farm cron: {name} at '{at}' UTC (owner {s.owner})", err=True)
    s.run(stop, on_fire=emit)


def register(cli: click.Group) -> None:
    """Attach this module's commands."""
    cli.add_command(export)
    cli.add_command(cron)
