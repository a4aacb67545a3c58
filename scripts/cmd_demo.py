"""``farm demo``: the whole story end to end on the default setup."""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import click

from demo.legacygen.generate import generate
from exporters import export as exporter
from exporters.dump import EXPORT_TABLES
from jobs import runs
from loaders import feeds as feeder
from loaders.mappings import rebalance as rebalancer
from loaders.mappings import reverse as reverser
from loaders.migration import migrate as migration
from scripts.app import App
from scripts.cmd_migrate import preflight
from scripts.cmd_shards import init_all
from scripts.demo_clean import clean_everything
from scripts.demo_guard import MADE_BY, foreign, previous_data_set, refusal, survey
from scripts.demo_report import (
    RunResult,
    board_page_lines,
    export_lines,
    failure_lines,
    hot_board_lines,
    quarantine_lines,
    run_result,
    safely,
    table_lines,
    verify_result,
)
from scripts.options import emit, farm_options
from scripts.render import RunProgress
from shardfarm.errors import FarmError, FatalError
from sharding import ids
from sharding.hotspot import FOLLOWERS

DEMO_SEED = 42
HOT_THRESHOLD = 1000
HOT_SPREAD = 4


class Phases:
    """Times each phase, prints a banner for it, and keeps how its run ended."""

    def __init__(self) -> None:
        self.times: dict[str, tuple[float, int | None]] = {}
        self.results: dict[str, RunResult] = {}

    @contextmanager
    def phase(self, name: str, rows: int | None = None) -> Iterator[None]:
        """Time the ``with`` block as phase ``name``."""
        click.echo(f"==> {name}", err=True)
        t0 = time.monotonic()
        yield
        self.times[name] = (time.monotonic() - t0, rows)

    def set_rows(self, name: str, rows: int) -> None:
        """Record how many rows a phase moved (for its rate)."""
        self.times[name] = (self.times[name][0], rows)

    def record(self, result: RunResult) -> RunResult:
        """Keep how the run of phase ``result.phase`` ended."""
        self.results[result.phase] = result
        return result

    def failed(self, *names: str) -> RunResult | None:
        """The first of these phases whose run did not end well, if any."""
        return next((r for n in names if (r := self.results.get(n)) and not r.ok), None)

    def lines(self) -> list[str]:
        """``phase  seconds  rows/s`` lines; a phase whose run failed says so instead."""
        out = []
        for name, (secs, rows) in self.times.items():
            if (r := self.results.get(name)) and not r.ok:
                tail = f"FAILED ({r.problem()})"
            else:
                tail = f"{rows / secs:>10,.0f} rows/s" if rows and secs > 0 else ""
            out.append(f"  {name:<24}{secs:>7.1f} s  {tail}")
        return out


@contextmanager
def own_workers(app: App, count: int) -> Iterator[subprocess.Popen]:
    """Run ``farm workers --count N`` for the demo and stop it (warm) at the end."""
    env = dict(os.environ)
    env.update({"FARM_REDIS_URL": app.settings.redis_url,
                "FARM_CONTROL_DSN": app.settings.control_dsn.url(),
                "FARM_LEGACY_DSN": app.settings.legacy_dsn.url(),
                "FARM_SHARDMAP": str(app.settings.shardmap_path or ""),
                "FARM_EXPORT_URL": app.settings.export_url})
    proc = subprocess.Popen([sys.executable, "-m", "scripts", "workers", "--count", str(count)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:  # the supervisor and every worker it started
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _wait(app: App, run_id: str) -> str:
    bar = RunProgress(run_id)
    try:
        return runs.wait(app.runtime, run_id, on_tick=bar)
    finally:
        bar.close()


@click.command("demo")
@click.option("--users", default=5000, show_default=True, type=click.IntRange(min=1),
              help="Legacy users (~40 rows each).")
@click.option("--workers", "n_workers", default=2, show_default=True,
              type=click.IntRange(min=1), help="Workers to start.")
@click.option("--clean", is_flag=True,
              help="Delete what the demo makes (the map's shard and mod databases, the legacy "
                   "and control databases, its exports, the farm's Redis keys), then exit.")
@click.option("--force", is_flag=True,
              help="Run even into shards or a legacy database holding data the demo did not "
                   "make (refused without it).")
@farm_options
def demo(app: App, users: int, n_workers: int, clean: bool, force: bool) -> None:
    """Run the whole story on the default setup (localhost MariaDB and Redis).

    Generates a legacy database, creates the shards, starts its own workers,
    migrates with a progress bar, verifies, rebuilds the reverse mappings,
    rebalances hot boards, rebuilds home feeds, exports yesterday's partition
    to FARM_EXPORT_URL (./exports) and prints a report. Safe to run again on its
    own data; refuses data it did not make unless --force; exits 1 when any run
    failed or verify found a mismatch. --clean removes what it made.
    """
    if clean:
        emit(clean_everything(app))
        return
    tag = _prepare(app, {"users": users, "seed": DEMO_SEED}, force)
    p = Phases()
    with p.phase("shards init"):
        init_all(app, tune=True)
    with p.phase("legacy generate"):
        gen = generate(app.settings.legacy_dsn, users, DEMO_SEED, made_by=MADE_BY)
    p.set_rows("legacy generate", sum(gen["rows"].values()))
    preflight(app)
    with own_workers(app, n_workers):
        mig = _migrate_and_verify(app, p, tag)
        date = _later_phases(app, p, tag)
    _report(app, p, mig, date)
    bad = [r for r in p.results.values() if not r.ok]
    if bad:
        raise FatalError(f"demo: {len(bad)} of {len(p.results)} runs did not end well ("
                         + ", ".join(f"{r.phase} {r.run_id}" for r in bad)
                         + "); the report above says why and what to run next")


def _prepare(app: App, data_set: dict, force: bool) -> dict:
    """Refuse data the demo did not make (unless ``force``); clean another demo data set.

    Returns the ``demo`` tag every run of this demo carries in its params.
    """
    found = survey(app)
    foreign_data = foreign(app, found)
    if foreign_data and not force:
        raise refusal(foreign_data)
    if foreign_data:
        click.echo(f"    (--force: running into {'; '.join(foreign_data.values())})", err=True)
        return {**data_set, "forced": True} if "shards" in foreign_data else data_set
    previous = previous_data_set(found)
    if previous is not None and previous != data_set:
        click.echo("    (the last demo used another data set: starting from clean)", err=True)
        clean_everything(app)
    return data_set


def _migrate_and_verify(app: App, p: Phases, tag: dict) -> RunResult:
    """Migrate the whole legacy database, then verify it; returns how the migration ended."""
    rt = app.runtime
    with p.phase("migrate"):
        params, chunks = migration.plan(app.settings, app.router, rt.ledger)
        run_id = runs.start(rt, "migrate", migration.HANDLER, chunks, {**params, "demo": tag})
        mig = run_result(rt, "migrate", run_id, _wait(app, run_id))
    p.set_rows("migrate", sum(mig.summary["loaded"].values())
               + sum(mig.summary["quarantined"].values()))
    p.record(mig)
    with p.phase("verify"):
        p.record(_verify(app, run_id, tag))
    return mig


def _later_phases(app: App, p: Phases, tag: dict) -> str:
    """Reverse, rebalance, feeds and the export of yesterday; returns the export date."""
    rev = _run(app, p, "reverse mappings", "reverse", reverser.HANDLER, tag,
               *reverser.plan(app.router, []))
    p.set_rows("reverse mappings", sum(rev.summary["loaded"].values()))
    spread = min(HOT_SPREAD, len(list(app.router.shardmap.shards())) - 1)
    reb = _run(app, p, "rebalance hot boards", "rebalance", rebalancer.HANDLER, tag,
               *rebalancer.plan(app.router, FOLLOWERS, HOT_THRESHOLD, spread))
    p.set_rows("rebalance hot boards", sum(reb.summary["loaded"].values()))
    fed = _run(app, p, "home feeds", "feeds", feeder.HANDLER, tag, *feeder.plan(app.router))
    p.set_rows("home feeds", fed.summary["loaded"].get("feeds", 0))
    date = (dt.datetime.now(dt.UTC).date() - dt.timedelta(days=1)).isoformat()
    params, chunks = exporter.plan(app.router, date, app.settings.export_url, force=True)
    exp = _run(app, p, "export", "export", exporter.HANDLER, tag, params, chunks)
    p.set_rows("export", sum(exp.summary["loaded"].values()))
    return date


def _run(app: App, p: Phases, phase: str, kind: str, handler: str, tag: dict, params: dict,
         chunks: list) -> RunResult:
    """Start a run as ``phase``, show its progress, record and return how it ended."""
    with p.phase(phase):
        run_id = runs.start(app.runtime, kind, handler, chunks, {**params, "demo": tag})
        return p.record(run_result(app.runtime, phase, run_id, _wait(app, run_id)))


def _verify(app: App, run_id: str, tag: dict) -> RunResult:
    """Verify migrate run ``run_id``; the result counts its mismatches."""
    from loaders.migration import verify as verifier
    rt = app.runtime
    of = rt.ledger.run(run_id)["params"]
    _, chunks = migration.plan(app.settings, app.router, rt.ledger, of["chunk_rows"])
    params = {k: of[k] for k in ("open_shards", "kinds", "chunk_rows")}
    vid = runs.start(rt, "verify", verifier.HANDLER, chunks,
                     {**params, "of_run": run_id, "demo": tag})
    return verify_result(rt, vid, _wait(app, vid))


def _suspect_tables(p: Phases) -> set[str]:
    """Exported tables written by a run that failed."""
    if p.failed("migrate"):
        return set(EXPORT_TABLES)
    return ((set(reverser.REVERSES) if p.failed("reverse mappings") else set())
            | ({FOLLOWERS} if p.failed("rebalance hot boards") else set()))


def _report(app: App, p: Phases, mig: RunResult, date: str) -> None:
    """Print what the demo made, and what failed with the commands that show the rest."""
    rt = app.runtime
    ver = p.results["verify"]
    failed = [r for r in p.results.values() if not r.ok]
    out = ["", "shardfarm demo" + (" FAILED: see the end of this report" if failed else ""),
           "=" * 60, f"migration {mig.run_id}: {mig.status}, {mig.failed} failed chunks",
           *table_lines(mig.summary), "", "time per phase:", *p.lines(), "",
           "quarantined rows by reason:", *quarantine_lines(rt, mig.run_id), "",
           f"verify {ver.run_id}: {ver.status}, {ver.mismatches} mismatches", ""]
    try:
        page, board = board_page_lines(app)
    except FarmError as exc:
        page, board = [f"(board page not shown: {str(exc).splitlines()[0]})"], None
    out += page
    if bad := p.failed("reverse mappings", "rebalance hot boards"):
        out += ["", f"hot boards not shown: {bad.phase} {bad.problem()}"]
    else:
        out += ["", *safely("hot boards", lambda: hot_board_lines(app))]
    if board:
        out += ["", f"decoded board ID {board}: {ids.decode(board).as_dict()}"]
    out += ["", *safely("exports", lambda: export_lines(app, date, _suspect_tables(p)))]
    out += ["", *failure_lines(rt, list(p.results.values()), mig.run_id)] if failed else []
    for line in out:
        click.echo(line)


def register(cli: click.Group) -> None:
    """Attach this module's commands."""
    cli.add_command(demo)
