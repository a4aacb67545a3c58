"""Start the farm's runs as the ``farm`` commands do: check, plan, record and enqueue.

Each function checks that the shard databases are there and Redis answers, plans the run's
chunks with its loader or exporter, only then creates the control database when missing (a
command refused on a fresh machine leaves nothing behind), records the run in the ledger and
enqueues one job per chunk; it returns the run ID. Workers ('farm workers') do the work.
When no worker is alive, ``notice`` is told so (the run still starts: workers may come later).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from rq import Worker

from exporters import dump
from exporters import export as exporter
from exporters.destinations import checked_destination
from farmcore.identity import farm_id
from farmcore.preflight import check_fleet, ensure_control, preflight
from jobs import runs
from jobs.runtime import Runtime
from jobs.status import read_supervisors, serves_another_farm
from loaders import feeds as feeder
from loaders.mappings import rebalance as rebalancer
from loaders.mappings import reverse as reverser
from loaders.migration import migrate as migration
from loaders.migration import verify as verifier
from workers import cron as scheduler

Notice = Callable[[str], None]
T = TypeVar("T")
NO_WORKERS = "no workers are running; start some with 'farm workers'"


def _silent(line: str) -> None:
    """A ``notice`` that tells no one."""


def warn_without_workers(rt: Runtime, notice: Notice) -> None:
    """Tell ``notice`` when no worker is alive to run the chunks, or when supervisors serve
    another control database (their workers take the run's jobs from the shared queue and
    cannot run them)."""
    if not Worker.count(connection=rt.redis):
        notice(NO_WORKERS)
        return
    ours = farm_id(rt.ledger.pool)
    others = sorted({d["host"] for d in read_supervisors(rt.redis)
                     if serves_another_farm(d, ours)})
    if others:
        notice(f"workers on {', '.join(others[:5])} serve another control database than "
               f"{rt.settings.control_dsn} (check their FARM_CONTROL_DSN): they cannot run "
               "this run's chunks")


def _throttled(params: dict, max_lag: float | None) -> dict:
    """``params`` with ``max_lag`` (``jobs.throttle``) when one is given."""
    return {**params, "max_lag": max_lag} if max_lag else params


def _planned(rt: Runtime, plan: Callable[[], T]) -> T:
    """What ``plan()`` returns, checked before the control database is looked at: the shards
    have their tables and Redis answers, then ``plan`` reads the source or looks at the
    destination, then the control database must exist (``ensure_control``). A run refused on
    a fresh machine leaves nothing behind."""
    check_fleet(rt.router)
    rt.redis.ping()
    planned = plan()
    ensure_control(rt.settings.control_dsn)
    return planned


def _ready(rt: Runtime, notice: Notice) -> None:
    """The databases are there; ``notice`` hears when no worker is."""
    preflight(rt.settings, rt.router)
    warn_without_workers(rt, notice)


def _start(rt: Runtime, kind: str, handler: str, chunks: list, params: dict,
           notice: Notice) -> str:
    """Start a planned run (``notice`` hears when no worker is alive): the note comes after
    planning, so that a usage mistake planning finds is the command's one line."""
    warn_without_workers(rt, notice)
    return runs.start(rt, kind, handler, chunks, params)


def migrate(rt: Runtime, chunk_rows: int = migration.DEFAULT_CHUNK_ROWS,
            notice: Notice = _silent, max_lag: float | None = None,
            slice_rows: int = migration.DEFAULT_SLICE_ROWS) -> str:
    """Start the load of the whole legacy database into the shards as one run.

    The shards, Redis and then the legacy database are checked (and read) before the
    control database is created (``_planned``).
    """
    params, chunks = _planned(
        rt, lambda: migration.plan_source(rt.settings, chunk_rows, slice_rows))
    params = migration.run_params(rt.router, rt.ledger, params)
    if busy := busy_migration_note(rt):
        notice(busy)
    return _start(rt, "migrate", migration.HANDLER, chunks, _throttled(params, max_lag),
                  notice)


def busy_migration_note(rt: Runtime) -> str | None:
    """What to tell whoever starts a migration while another is running or paused: both load
    the same rows (the target ends the same, the work is done twice). ``None`` if none is."""
    busy = rt.ledger.runs(limit=1, active_only=True, kind="migrate")
    if not busy:
        return None
    return (f"migrate run {busy[0]} is not finished: this run loads the same rows beside it (the "
            f"target ends the same, the work is done twice); 'farm cancel {busy[0]}' ends it")


def migrate_run(rt: Runtime, run_id: str | None) -> dict:
    """The ledger's row of migrate run ``run_id`` (default: the latest migrate run)."""
    run_id = rt.ledger.run_or_latest(run_id, "migrate",
                                     "no migrate run to verify: run 'farm migrate' first")
    return rt.ledger.run(run_id)


def unloaded_note(rt: Runtime, run_id: str) -> str | None:
    """What to tell whoever verifies migrate run ``run_id`` while it has chunks pending or
    running, or failed ones: the target may lack rows it has not loaded, and each counts as
    a mismatch. ``None`` when every chunk is done."""
    chunks = rt.ledger.progress(run_id)
    busy = sum(k["pending"] + k["running"] for k in chunks)
    failed = sum(k["failed"] for k in chunks)
    if busy:
        also = f" ({failed:,} failed)" if failed else ""
        return (f"migrate run {run_id} had {busy:,} chunk(s) pending or running{also} when "
                "this verify started: mismatches may be rows it had not loaded yet ('farm "
                f"status --run {run_id}'; verify again once it is done)")
    if failed:
        return (f"migrate run {run_id} ended with {failed:,} failed chunk(s): mismatches may "
                f"be rows those chunks did not load ('farm failed --run {run_id}', then 'farm "
                f"retry-failed --run {run_id}')")
    return None


def start_verify(rt: Runtime, of: dict, extra: dict | None = None) -> str:
    """Start the verify of migrate run ``of`` (its ledger row) over the same chunks.

    ``extra`` is added to the run's params (the demo's tag).
    """
    p = of["params"]
    _, chunks = migration.plan_source(rt.settings, p["chunk_rows"],
                                      p.get("slice_rows", p["chunk_rows"]))
    params = {k: p[k] for k in ("open_shards", "kinds", "chunk_rows", "slice_rows") if k in p}
    return runs.start(rt, "verify", verifier.HANDLER, chunks,
                      {**params, "of_run": of["run_id"], **(extra or {})})


def verify(rt: Runtime, run_id: str | None, notice: Notice = _silent) -> tuple[str, str]:
    """Start the verify of migrate run ``run_id`` (default: the latest).

    Returns the verify run's ID and the migrate run's.
    """
    of = migrate_run(rt, run_id)
    _ready(rt, notice)
    return start_verify(rt, of), of["run_id"]


@dataclass(frozen=True)
class VerifyOutcome:
    """How a verify run ended: its JSON summary and its first mismatches."""

    summary: dict
    examples: list[dict]

    @property
    def ok(self) -> bool:
        """Every chunk done and no mismatch."""
        return runs.ended_well(self.summary)


def verify_outcome(rt: Runtime, vid: str, of_run: str, status: str,
                   limit: int = 50) -> VerifyOutcome:
    """The outcome of verify run ``vid`` of ``of_run`` that ended in ``status``."""
    _, examples = rt.ledger.mismatches.of_run(vid, limit=limit)
    return VerifyOutcome({**runs.summary(rt, vid), "of_run": of_run, "status": status},
                         examples)


def export(rt: Runtime, date: str, dest: str | None, tables: list[str], fmt: str, role: str,
           force: bool, notice: Notice = _silent) -> str:
    """Start the export of every shard of ``tables`` (all: empty) for the ``date`` partition.

    Usage mistakes (a bad date or table) are refused before any server is asked.
    """
    exporter.check_date(date)
    dump.check_tables(tables)
    params, chunks = _planned(rt, lambda: exporter.plan(
        rt.router, date, dest or rt.settings.export_url, tables, fmt, role, force))
    exporter.refuse_overlap(rt.ledger, params)
    warn_without_workers(rt, notice)
    return runs.start(rt, "export", exporter.HANDLER, chunks, params)


def cron_scheduler(rt: Runtime, name: str, at: str, export_args: dict) -> scheduler.Scheduler:
    """The nightly export's scheduler, once its expression, tables, databases and export
    destination are checked (as ``farm export`` checks them: a missing bucket or an endpoint
    that does not answer within FARM_STATUS_TIMEOUT is one line now, not a log line at
    every slot).

    ``export_args``: ``{"dest", "tables", "from", "format"}`` of each export it starts.
    """
    scheduler.check_expression(at)
    tables = dump.check_tables(export_args["tables"])
    _planned(rt, lambda: checked_destination(  # each slot checks its dt= folders
        export_args.get("dest") or rt.settings.export_url, [f"{t}/" for t in tables]))
    return scheduler.Scheduler(rt, name=name, at=at, export_args=export_args)


def feeds(rt: Runtime, user_ids: list[int] | None, chunk_users: int, length: int,
          notice: Notice = _silent) -> str:
    """Start the rebuild of the home feeds of ``user_ids`` (``None``: every active user)."""
    params, chunks = _planned(rt, lambda: feeder.plan(rt.router, chunk_users, length, user_ids))
    return _start(rt, feeder.KIND, feeder.HANDLER, chunks, params, notice)


def reverse(rt: Runtime, tables: list[str], chunk_rows: int, notice: Notice = _silent,
            max_lag: float | None = None) -> str:
    """Start the rebuild of reverse mapping ``tables`` (all: empty) from their forward ones."""
    params, chunks = _planned(rt, lambda: reverser.plan(rt.router, tables, chunk_rows))
    return _start(rt, "reverse", reverser.HANDLER, chunks, _throttled(params, max_lag), notice)


def rebalance(rt: Runtime, table: str, threshold: int, spread: int,
              notice: Notice = _silent, max_lag: float | None = None) -> str:
    """Start spreading the boards of ``table`` above ``threshold`` rows over ``spread`` shards."""
    params, chunks = _planned(rt, lambda: rebalancer.plan(rt.router, table, threshold, spread))
    return _start(rt, "rebalance", rebalancer.HANDLER, chunks, _throttled(params, max_lag),
                  notice)
