"""``farm migrate``, ``farm verify`` and ``farm quarantine``."""

from __future__ import annotations

import sys

import click

from farmcore import control_schema
from jobs import runs
from loaders.migration import migrate as migration
from loaders.migration import verify as verifier
from scripts.app import App
from scripts.cmd_runs import finish
from scripts.options import emit, farm_options
from scripts.render import RunProgress
from shardfarm.errors import ConfigError
from shardfarm.mysql.db import ensure_database


def preflight(app: App) -> None:
    """Refuse to start when the control database or the shard databases are missing."""
    ensure_database(app.settings.control_dsn)
    control_schema.ensure(app.settings.control_dsn)
    m = app.router.shardmap
    for r in m.shard_ranges:
        for shard in {r.lo, r.hi}:
            host = m.master(shard)
            with app.router.connection(host, shard) as conn, conn.cursor() as cur:
                cur.execute("SELECT COUNT(*) FROM information_schema.tables "
                            "WHERE table_schema = %s", (f"db{shard:05d}",))
                if not cur.fetchone()[0]:
                    raise ConfigError(f"shard {shard} has no tables on {host.name}: "
                                      "run 'farm shards init' first")


@click.command("migrate")
@click.option("--chunk-size", default=migration.DEFAULT_CHUNK_ROWS, show_default=True,
              type=click.IntRange(min=1), help="Legacy rows per chunk.")
@click.option("--wait", is_flag=True, help="Show progress until the run ends; exit 0 if done.")
@farm_options
def migrate(app: App, chunk_size: int, wait: bool) -> None:
    """Load the whole legacy database into the shards as one resumable run.

    Prints {"run_id", "status", "loaded", "quarantined", "failed_chunks"} as the
    last line (at once without --wait). Workers ('farm workers') do the loading.
    """
    preflight(app)
    warn_without_workers(app)
    rt = app.runtime
    params, chunks = migration.plan(app.settings, app.router, rt.ledger, chunk_size)
    run_id = runs.start(rt, "migrate", migration.HANDLER, chunks, params)
    finish(app, run_id, wait)


@click.command("verify")
@click.option("--run", "run_id", default=None, help="The migrate run to check (default: latest).")
@farm_options
def verify(app: App, run_id: str | None) -> None:
    """Compare the target with the legacy source, chunk by chunk; exit 0 only on a full match.

    Runs as a resumable run on the workers, prints each mismatch with its legacy
    key, then the JSON summary as the last line.
    """
    rt = app.runtime
    run_id = run_id or rt.ledger.latest_run("migrate")
    if not run_id:
        raise ConfigError("no migrate run to verify: run 'farm migrate' first")
    of = rt.ledger.run(run_id)
    if of["kind"] != "migrate":
        raise ConfigError(f"{run_id} is a {of['kind']} run, not a migrate run")
    preflight(app)
    warn_without_workers(app)
    p = of["params"]
    _, chunks = migration.plan(app.settings, app.router, rt.ledger, p["chunk_rows"])
    params = {k: p[k] for k in ("open_shards", "kinds", "chunk_rows")}
    vid = runs.start(rt, "verify", verifier.HANDLER, chunks, {**params, "of_run": run_id})
    bar = RunProgress(vid)
    try:
        status = runs.wait(rt, vid, on_tick=bar)
    finally:
        bar.close()
    n, examples = rt.ledger.mismatches(vid, limit=50)
    for m in examples:
        click.echo(f"mismatch {m['legacy_table']} {m['legacy_key']} {m['target']}: "
                   f"{m['problem']}")
    summary = runs.summary(rt, vid)
    emit({"run_id": vid, "of_run": run_id, "status": status, "checked": summary["loaded"],
          "mismatches": n, "failed_chunks": summary["failed_chunks"]})
    if status != "done" or n:
        sys.exit(1)


def warn_without_workers(app: App) -> None:
    """One line on stderr when no worker is alive to run the chunks."""
    from rq import Worker
    if not Worker.count(connection=app.runtime.redis):
        click.echo("farm: note: no workers are running; start some with 'farm workers'",
                   err=True)


@click.command("quarantine")
@click.option("--run", "run_id", default=None, help="A migrate run (default: the latest).")
@click.option("--json", "as_json", is_flag=True, help="JSON lines instead of a table.")
@click.option("--limit", default=1000, show_default=True, help="At most this many rows.")
@farm_options
def quarantine(app: App, run_id: str | None, as_json: bool, limit: int) -> None:
    """List quarantined legacy rows with their table, legacy key and reason."""
    ledger = app.runtime.ledger
    run_id = run_id or ledger.latest_run("migrate")
    if not run_id:
        raise ConfigError("no migrate run yet")
    rows = ledger.quarantined(run_id, limit)
    for r in rows:
        if as_json:
            emit({"run_id": run_id, **r})
        else:
            click.echo(f"{r['legacy_table']:<9} {r['legacy_key']:<28} {r['reason']:<22} "
                       f"{r['detail']}")
    if not as_json:
        reasons = ledger.quarantine_reasons(run_id)
        click.echo(f"{sum(n for *_, n in reasons)} quarantined in {run_id}: " + ", ".join(
            f"{t}.{r} {n}" for t, r, n in reasons))


def register(cli: click.Group) -> None:
    """Attach this module's commands."""
    for cmd in (migrate, verify, quarantine):
        cli.add_command(cmd)
