"""Operating runs: ``status``, ``runs``, ``resume``, ``pause``, ``unpause``, ``cancel``,
``failed``, ``retry-failed``."""

from __future__ import annotations

import json
import time
from functools import partial

import click

from farmcore import ledger_size, prune
from farmcore.ledger_size import size_line
from farmcore.progress import read_progress
from jobs import recovery, runs, status
from loaders.migration import follower
from loaders.migration.runwatch import KIND as MIGRATE
from scripts.app import App
from scripts.follow import finish, goes_on, paused_line, show_summary
from scripts.options import AS_JSON, emit, farm_options, run_option, shared_flags
from scripts.render import compact, echo_lines, note, runs_lines, status_lines
from sharding import fencing

KEEP_LATEST = (MIGRATE,)  # the newest run of these kinds is never pruned


@click.command("status")
@run_option("Only this run.")
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of a table.")
@click.option("--watch", is_flag=True, help="Refresh every 2 seconds until Ctrl-C.")
@farm_options
def status_cmd(app: App, run_id: str | None, as_json: bool, watch: bool) -> None:
    """Where runs stand: chunks done/total, rows/s, ETA, failures, workers, queue depths."""
    while True:
        view = status.farm_view(app.viewer, run_id)
        view["sync"] = sync_view(app)
        if as_json:
            emit(view)
        else:
            if watch:
                click.clear()
            echo_lines(status_lines(view))
        if not watch:
            return
        time.sleep(2)


def sync_view(app: App) -> dict | None:
    """``farm sync``'s state, with its lag when the legacy server answers (else without);
    read within FARM_STATUS_TIMEOUT."""
    return follower.view(app.viewer.ledger, app.settings.legacy_dsn)


@click.group("runs", invoke_without_command=True)
@click.option("--kind", default=None, metavar="KIND",
              help="Only runs of this kind (migrate, verify, reverse, rebalance, feeds, export).")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 100_000),
              help="The newest this many runs.")
@click.option("--json", "as_json", is_flag=True, help="JSON lines instead of a table.")
@shared_flags
@click.pass_context
def runs_cmd(ctx: click.Context, **options: object) -> None:
    """List runs, newest first: kind, state, chunks done, rows written, when; and the
    ledger's size per chunk row. 'farm runs prune' drops runs that ended long ago."""
    if ctx.invoked_subcommand is None:
        _list_runs(**options)


@farm_options
def _list_runs(app: App, kind: str | None, limit: int, as_json: bool) -> None:
    """The body of ``farm runs`` (the group's own listing)."""
    listed = app.viewer.ledger.list_runs(kind, limit)
    if kind and not listed:  # a mistyped kind ('migration') is not an empty ledger
        known = app.viewer.ledger.run_kinds()
        note(f"no run has kind {kind[:40]!r} (the kinds there are: {', '.join(known) or 'none'})")
    if not as_json:
        echo_lines(runs_lines(listed))
        echo_lines([size_line(ledger_size.size(app.viewer.ledger.pool))])
        return
    for r in listed:
        emit({**r, "created_at": str(r["created_at"]),
              "finished_at": str(r["finished_at"]) if r["finished_at"] else None})


@runs_cmd.command("prune")
@click.option("--older-than", "older_than", required=True, metavar="AGE",
              help="Prune runs that ended more than AGE ago: 30d, 12h, 90m, 2w.")
@click.option("--dry-run", is_flag=True, help="Only count what would go.")
@click.option("--include-failed", is_flag=True,
              help="Failed runs too (default: only runs whose every chunk is done, and "
                   "cancelled runs).")
@click.option("--batch", default=5000, show_default=True, type=click.IntRange(1, 100_000),
              help="Rows per DELETE (each commits on its own).")
@farm_options
def prune_cmd(app: App, older_than: str, dry_run: bool, include_failed: bool,
              batch: int) -> None:
    """Delete the chunks, quarantined rows and verify findings of runs that ended more than
    AGE ago, in bounded batches, keeping a one-row summary of each in runs_archive; then the
    fence rows of pruned runs on every shard and mod bucket, a day after each run ended at
    the earliest (until then they refuse a stalled worker's late writes). Runs done or
    cancelled go; failed runs only with --include-failed; a run with a chunk pending or
    running is never touched, nor the newest migrate run ('farm quarantine' shows it) or
    the run 'farm sync' follows. Prints what went as JSON."""
    age = prune.parse_age(older_than)
    report = prune.PruneReport(dry_run=dry_run)
    try:
        prune.prune(app.runtime.ledger.pool, age, dry_run=dry_run, batch=batch,
                    include_failed=include_failed, report=report, keep_latest=KEEP_LATEST,
                    fences=partial(fencing.forget, app.runtime.router))
    finally:  # what went, also when a step failed
        emit(report.as_dict())


@click.command("resume")
@click.argument("run_id")
@click.option("--wait", is_flag=True, help="Show progress until the run ends; exit 0 if done.")
@AS_JSON
@farm_options
def resume(app: App, run_id: str, wait: bool, as_json: bool) -> None:
    """Re-enqueue every chunk of RUN_ID that is pending or running without a job (e.g. after
    Redis restarted empty); failed chunks: 'farm retry-failed --run RUN_ID'."""
    n = runs.resume(app.runtime, run_id)
    with goes_on(run_id):  # from here a Ctrl-C leaves the resumed run going
        click.echo(f"re-enqueued {n} unfinished chunk(s) of {run_id}", err=True)
        _resume_notes(app, run_id)
        finish(app, run_id, wait, as_json)


def _resume_notes(app: App, run_id: str) -> None:
    """What 'farm resume' did not do: a paused run's chunks wait for 'farm unpause', failed
    chunks for 'farm retry-failed'."""
    if app.runtime.ledger.run(run_id)["paused"]:
        note(paused_line(run_id))
    if failed := read_progress(app.runtime.ledger, run_id).chunks_failed:
        note(f"{failed:,} failed chunk(s) of {run_id} are not resumed: 'farm retry-failed "
             f"--run {run_id}' tries them again")


@click.command("summary")
@click.argument("run_id")
@AS_JSON
@farm_options
def summary(app: App, run_id: str, as_json: bool) -> None:
    """A run's summary: a few lines on a terminal, else (or with --json) its JSON line, with
    every board a rebalance moved and every part an export left unchanged."""
    show_summary(app.viewer, run_id, as_json)


@click.command("pause")
@click.argument("run_id")
@farm_options
def pause(app: App, run_id: str) -> None:
    """Workers take no new chunks of RUN_ID; chunks in hand finish."""
    app.runtime.ledger.set_paused(run_id, True)
    emit({"run_id": run_id, "paused": True})


@click.command("unpause")
@click.argument("run_id")
@farm_options
def unpause(app: App, run_id: str) -> None:
    """Let workers take chunks of RUN_ID again (each unfinished chunk is dispatched once)."""
    n = runs.unpause(app.runtime, run_id)
    emit({"run_id": run_id, "paused": False, "enqueued": n})


@click.command("cancel")
@click.argument("run_id")
@farm_options
def cancel(app: App, run_id: str) -> None:
    """End RUN_ID: its chunks not done fail as cancelled, and a worker holding one stops at
    its next lease renewal; what chunks wrote stays, and the run's status is 'cancelled'.
    'farm retry-failed --run RUN_ID' takes the run up again (a 'farm retry-failed' of every
    run leaves it alone)."""
    n = app.runtime.ledger.cancel(run_id)
    if not n:
        note(f"{run_id} had no chunk left to cancel")
    emit({"run_id": run_id, "cancelled_chunks": n})


@click.command("failed")
@run_option("Only this run.")
@click.option("--json", "as_json", is_flag=True, help="JSON lines instead of a table.")
@farm_options
def failed(app: App, run_id: str | None, as_json: bool) -> None:
    """List failed chunks (and failed enqueued items) with their reasons."""
    if run_id:
        app.viewer.ledger.run(run_id)  # a mistyped run is an error, not "no failures"
    rows = app.viewer.ledger.failures(run_id)
    if not run_id:
        rows += status.failed_items(app.viewer)
    for r in rows:
        if as_json:
            emit(r)
        else:
            where = f"{r['run_id']} chunk {r['chunk_id']}" if "chunk_id" in r else r["where"]
            reason = r["last_error"] or "no reason recorded"
            click.echo(f"{where} ({r['kind']}, {r['attempts']} attempts): {reason}")
            click.echo(f"    arguments: {compact(_arguments(r['args']))}")
    if not rows and not as_json:
        click.echo("no failures")


def _arguments(args: object) -> object:
    """A chunk's arguments as stored (JSON text in the ledger), or an item's as they are."""
    if isinstance(args, str | bytes):
        try:
            return json.loads(args)
        except ValueError:
            return args
    return args


@click.command("retry-failed")
@run_option("Only this run (default: every run).")
@farm_options
def retry_failed(app: App, run_id: str | None) -> None:
    """Re-enqueue failed chunks with a fresh attempt budget, and every unfinished chunk that
    has no job (and failed enqueued items)."""
    retried = recovery.retry_failed(app.runtime, run_id)
    for line in retried.not_retried:
        click.echo(f"farm: not retried: {line}", err=True)
    emit(retried.as_dict())


def register(cli: click.Group) -> None:
    """Attach this module's commands."""
    for cmd in (status_cmd, runs_cmd, summary, resume, pause, unpause, cancel, failed,
                retry_failed):
        cli.add_command(cmd)
