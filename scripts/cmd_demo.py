"""``farm demo``: the whole story end to end on the default setup."""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager

import click

from exporters import export as exporter
from jobs import runs
from loaders import feeds as feeder
from loaders import migrate as migration
from loaders import rebalance as rebalancer
from loaders import reverse as reverser
from loaders.generate import generate
from scripts.app import App
from scripts.cmd_migrate import preflight
from scripts.cmd_shards import init_all
from scripts.demo_report import (
    board_page_lines,
    clean_everything,
    export_lines,
    hot_board_lines,
    quarantine_lines,
    table_lines,
)
from scripts.options import emit, farm_options
from scripts.render import RunProgress
from shardfarm.errors import FarmError
from sharding import ids
from sharding.hotspot import FOLLOWERS

DEMO_SEED = 42
HOT_THRESHOLD = 1000
HOT_SPREAD = 4


class Phases:
    """Times each phase and prints a banner for it."""

    def __init__(self) -> None:
        self.times: dict[str, tuple[float, int | None]] = {}

    @contextmanager
    def phase(self, name: str, rows: int | None = None):
        """Time the ``with`` block as phase ``name``."""
        click.echo(f"==> {name}", err=True)
        t0 = time.monotonic()
        yield
        self.times[name] = (time.monotonic() - t0, rows)

    def set_rows(self, name: str, rows: int) -> None:
        """Record how many rows a phase moved (for its rate)."""
        self.times[name] = (self.times[name][0], rows)

    def lines(self) -> list[str]:
        """``phase  seconds  rows/s`` lines."""
        out = []
        for name, (secs, rows) in self.times.items():
            rate = f"{rows / secs:>10,.0f} rows/s" if rows and secs > 0 else ""
            out.append(f"  {name:<24}{secs:>7.1f} s  {rate}")
        return out


@contextmanager
def own_workers(app: App, count: int):
    """Run ``farm workers --count N`` for the demo and stop it (warm) at the end."""
    env = dict(os.environ)
    env.update({"FARM_REDIS_URL": app.settings.redis_url,
                "FARM_CONTROL_DSN": app.settings.control_dsn.url(),
                "FARM_LEGACY_DSN": app.settings.legacy_dsn.url(),
                "FARM_SHARDMAP": str(app.settings.shardmap_path or ""),
                "FARM_EXPORT_URL": app.settings.export_url})
    proc = subprocess.Popen([sys.executable, "-m", "scripts", "workers", "--count", str(count)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def _previous_demo(app: App) -> dict | None:
    """The data set of the last demo migration, ``{}`` if the last migration was not a demo."""
    import pymysql
    try:
        last = app.runtime.ledger.latest_run("migrate")
    except (FarmError, pymysql.MySQLError):
        return None  # no control database yet: nothing to clean
    return app.runtime.ledger.run(last)["params"].get("demo", {}) if last else None


def _wait(app: App, run_id: str) -> str:
    bar = RunProgress(run_id)
    try:
        return runs.wait(app.runtime, run_id, on_tick=bar)
    finally:
        bar.close()


@click.command("demo")
@click.option("--users", default=5000, show_default=True, help="Legacy users (~40 rows each).")
@click.option("--workers", "n_workers", default=2, show_default=True, help="Workers to start.")
@click.option("--clean", is_flag=True, help="Remove everything the demo made, then exit.")
@farm_options
def demo(app: App, users: int, n_workers: int, clean: bool) -> None:
    """Run the whole story on the default setup (localhost MariaDB and Redis).

    Generates a legacy database, creates the shards, starts its own workers,
    migrates with a progress bar, verifies, rebuilds the reverse mappings,
    rebalances hot boards, rebuilds home feeds, exports yesterday's partition
    to FARM_EXPORT_URL (./exports) and prints a report. Safe to run again;
    --clean removes what it made.
    """
    if clean:
        emit(clean_everything(app))
        return
    p = Phases()
    with p.phase("shards init"):
        if _previous_demo(app) not in (None, {"users": users, "seed": DEMO_SEED}):
            click.echo("    (the last demo used another data set: starting from clean)", err=True)
            clean_everything(app)
        init_all(app, tune=True)
    with p.phase("legacy generate"):
        gen = generate(app.settings.legacy_dsn, users, DEMO_SEED)
    p.set_rows("legacy generate", sum(gen["rows"].values()))
    preflight(app)
    rt = app.runtime
    with own_workers(app, n_workers):
        with p.phase("migrate"):
            params, chunks = migration.plan(app.settings, app.router, rt.ledger)
            params["demo"] = {"users": users, "seed": DEMO_SEED}
            run_id = runs.start(rt, "migrate", migration.HANDLER, chunks, params)
            status = _wait(app, run_id)
        summary = runs.summary(rt, run_id)
        p.set_rows("migrate", sum(summary["loaded"].values())
                   + sum(summary["quarantined"].values()))
        with p.phase("verify"):
            verified = _verify(app, run_id)
        with p.phase("reverse mappings"):
            rev = _run(app, "reverse", reverser.HANDLER, *reverser.plan(app.router, []))
        p.set_rows("reverse mappings", sum(rev["loaded"].values()))
        spread = min(HOT_SPREAD, len(list(app.router.shardmap.shards())) - 1)
        with p.phase("rebalance hot boards"):
            reb = _run(app, "rebalance", rebalancer.HANDLER,
                       *rebalancer.plan(app.router, FOLLOWERS, HOT_THRESHOLD, spread))
        p.set_rows("rebalance hot boards", sum(reb["loaded"].values()))
        with p.phase("home feeds"):
            fed = _run(app, "feeds", feeder.HANDLER, *feeder.plan(app.router))
        p.set_rows("home feeds", fed["loaded"].get("feeds", 0))
        date = (dt.datetime.now(dt.UTC).date() - dt.timedelta(days=1)).isoformat()
        with p.phase("export"):
            params, chunks = exporter.plan(app.router, date, app.settings.export_url,
                                           force=True)
            exp = _run(app, "export", exporter.HANDLER, {**params, "demo": True}, chunks)
        p.set_rows("export", sum(exp["loaded"].values()))
    _report(app, p, summary, status, verified, date)


def _run(app: App, kind: str, handler: str, params: dict, chunks: list) -> dict:
    """Start a run, show its progress, return its summary."""
    run_id = runs.start(app.runtime, kind, handler, chunks, params)
    _wait(app, run_id)
    return runs.summary(app.runtime, run_id)


def _verify(app: App, run_id: str) -> dict:
    from loaders import verify as verifier
    rt = app.runtime
    of = rt.ledger.run(run_id)["params"]
    _, chunks = migration.plan(app.settings, app.router, rt.ledger, of["chunk_rows"])
    params = {k: of[k] for k in ("open_shards", "floors", "kinds", "chunk_rows")}
    vid = runs.start(rt, "verify", verifier.HANDLER, chunks, {**params, "of_run": run_id})
    status = _wait(app, vid)
    n, _ = rt.ledger.mismatches(vid, limit=0)
    return {"run_id": vid, "status": status, "mismatches": n}


def _report(app: App, p: Phases, summary: dict, status: str, verified: dict,
            date: str) -> None:
    rt = app.runtime
    out = ["", "shardfarm demo", "=" * 60,
           f"migration {summary['run_id']}: {status}, {summary['failed_chunks']} failed chunks",
           *table_lines(summary), "", "time per phase:", *p.lines(), "",
           "quarantined rows by reason:", *quarantine_lines(rt, summary["run_id"]), "",
           f"verify {verified['run_id']}: {verified['status']}, "
           f"{verified['mismatches']} mismatches", ""]
    page, board = board_page_lines(app)
    out += page
    out += ["", *hot_board_lines(app)]
    if board:
        out += ["", f"decoded board ID {board}: {ids.decode(board).as_dict()}"]
    out += ["", *export_lines(app, date)]
    for line in out:
        click.echo(line)


def register(cli: click.Group) -> None:
    """Attach this module's commands."""
    cli.add_command(demo)
