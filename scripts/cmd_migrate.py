"""``farm migrate``, ``farm verify``, ``farm mismatches`` and ``farm quarantine``."""

from __future__ import annotations

import sys

import click

from loaders.migration import migrate as migration
from scripts.app import App
from scripts.follow import finish, wait_with_progress
from scripts.options import AS_JSON, MAX_LAG, emit, farm_options, run_option
from scripts.render import echo_lines, mismatch_lines, note
from scripts.summaries import for_people, verify_line
from workers import launch


@click.command("migrate")
@click.option("--chunk-size", default=migration.DEFAULT_CHUNK_ROWS, show_default=True,
              type=click.IntRange(min=1), help="Legacy rows per chunk.")
@click.option("--slice-size", default=migration.DEFAULT_SLICE_ROWS, show_default=True,
              type=click.IntRange(min=1),
              help="Legacy rows a worker holds at once (a chunk is loaded slice by slice).")
@click.option("--wait", is_flag=True, help="Show progress until the run ends; exit 0 if done.")
@MAX_LAG
@AS_JSON
@farm_options
def migrate(app: App, chunk_size: int, slice_size: int, wait: bool,
            max_lag: float | None, as_json: bool) -> None:
    """Load the whole legacy database into the shards as one resumable run.

    Prints {"run_id", "status", "loaded", "quarantined", "failed_chunks"} as the
    last line (at once without --wait). Workers ('farm workers') do the loading.
    """
    run_id = launch.migrate(app.runtime, chunk_size, notice=note, max_lag=max_lag,
                            slice_rows=slice_size)
    finish(app, run_id, wait, as_json)


@click.command("verify")
@run_option("The migrate run to check (default: latest).")
@click.option("--show", default=50, show_default=True, type=click.IntRange(min=0),
              help="Mismatches printed (all of them: 'farm mismatches').")
@AS_JSON
@farm_options
def verify(app: App, run_id: str | None, show: int, as_json: bool) -> None:
    """Compare the target with the legacy source, chunk by chunk; exit 0 only on a full match.

    Runs as a resumable run on the workers, prints each mismatch with its legacy
    key, then the JSON summary as the last line. A note first when the migrate run had
    chunks not done (pending, running or failed): mismatches may be rows not loaded yet
    (in the JSON summary too, as "note").
    """
    rt = app.runtime
    vid, of_run = launch.verify(rt, run_id, notice=note)
    unloaded = launch.unloaded_note(rt, of_run)  # as the verify starts
    outcome = launch.verify_outcome(rt, vid, of_run, wait_with_progress(rt, vid), show)
    if unloaded:
        note(unloaded)
    echo_lines(mismatch_lines(outcome.examples))
    more = outcome.summary["mismatches"] - len(outcome.examples)
    if more > 0:
        click.echo(f"… and {more:,} more mismatch(es): 'farm mismatches --run {vid}' lists "
                   "them all")
    if for_people(as_json):
        click.echo(verify_line(outcome.summary))
    else:  # a script reading only the last line learns of the note too
        emit({**outcome.summary, "note": unloaded} if unloaded else outcome.summary)
    if not outcome.ok:
        sys.exit(1)


@click.command("mismatches")
@run_option("A verify run (default: the latest).")
@click.option("--json", "as_json", is_flag=True, help="JSON lines instead of a table.")
@click.option("--limit", default=100_000, show_default=True, type=click.IntRange(min=1),
              help="At most this many rows.")
@farm_options
def mismatches(app: App, run_id: str | None, as_json: bool, limit: int) -> None:
    """List what a verify run found different, each with its legacy table and key."""
    ledger = app.runtime.ledger
    run_id = ledger.run_or_latest(run_id, "verify", "no verify run yet")
    n, rows = ledger.mismatches.of_run(run_id, limit)
    if as_json:
        for r in rows:
            emit(r)
        return
    echo_lines(mismatch_lines(rows) or [f"no mismatches in {run_id}"])
    if n > len(rows):
        click.echo(f"… and {n - len(rows):,} more (raise --limit)")


@click.command("quarantine")
@run_option("A migrate run (default: the latest).")
@click.option("--json", "as_json", is_flag=True, help="JSON lines instead of a table.")
@click.option("--limit", default=1000, show_default=True, type=click.IntRange(min=1),
              help="At most this many rows.")
@farm_options
def quarantine(app: App, run_id: str | None, as_json: bool, limit: int) -> None:
    """List quarantined legacy rows with their table, legacy key and reason."""
    ledger = app.viewer.ledger
    run_id = ledger.run_or_latest(run_id, "migrate", "no migrate run yet")
    rows = ledger.quarantine.rows(run_id, limit)
    for r in rows:
        if as_json:
            emit({"run_id": run_id, **r})
        else:
            click.echo(f"{r['legacy_table']:<9} {r['legacy_key']:<28} {r['reason']:<22} "
                       f"{r['detail']}")
    if not as_json:
        reasons = ledger.quarantine.reasons(run_id)
        click.echo(f"{sum(n for *_, n in reasons)} quarantined in {run_id}: " + ", ".join(
            f"{t}.{r} {n}" for t, r, n in reasons))


def register(cli: click.Group) -> None:
    """Attach this module's commands."""
    for cmd in (migrate, verify, mismatches, quarantine):
        cli.add_command(cmd)
