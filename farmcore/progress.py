"""How far a run is: rows and chunks done of those expected, rates with paused time left out,
and an ETA for the whole run.

The arithmetic is pure (``kind_progress``, ``run_progress``, ``active_seconds``,
``window_start``) over what ``read_progress`` reads from the control database in three
small queries: per-kind chunk totals, the run's pauses, and the chunks that finished in the
last minute of active time. Times are the database's clock.

Rows are rows *read* from the source (legacy rows, forward mapping rows, users, …): what a
chunk was planned with (``chunks.rows_planned``, counted while planning) and what a finished
chunk reports. A chunk planned without a count is estimated at its kind's average once one
of its kind finished; until then the run's row total is unknown (``rows_expected`` None).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from farmcore.ledger import Ledger
from farmcore.runstate import CANCELLED, RUNNING, has_ended

WINDOW_SECONDS = 60.0


@dataclass(frozen=True)
class Pause:
    """One pause of a run: from ``start`` until ``end`` (None: still paused)."""

    start: datetime
    end: datetime | None = None


@dataclass(frozen=True)
class KindCounts:
    """One chunk kind of a run as the ledger holds it."""

    kind: str
    total: int
    done: int = 0
    failed: int = 0
    running: int = 0
    rows_done: int = 0          # rows read by done chunks
    rows_written: int = 0
    rows_quarantined: int = 0
    planned_open: int = 0       # rows planned of chunks not done (pending, running, failed)
    planned_left: int = 0       # rows planned of chunks still to run (pending, running)
    unplanned_open: int = 0     # chunks not done that were planned without a count
    unplanned_left: int = 0     # of those, pending or running
    first_start: datetime | None = None
    last_finish: datetime | None = None


@dataclass(frozen=True)
class KindProgress:
    """One kind's rows and chunks: ``rows_expected`` None while unknown."""

    kind: str
    rows_done: int
    rows_expected: int | None
    rows_left: int | None
    rows_written: int
    rows_quarantined: int
    chunks_done: int
    chunks_failed: int
    chunks_running: int
    chunks_total: int
    estimated: bool = False     # part of rows_expected is an average, not a count


@dataclass(frozen=True)
class RunProgress:
    """A whole run: totals over its kinds, rates (rows/s) and ETA (seconds, None: unknown);
    its status (``farmcore.runstate``) and, if ``farm cancel`` ended it, when (UTC)."""

    rows_done: int
    rows_expected: int | None
    chunks_done: int
    chunks_failed: int
    chunks_running: int
    chunks_total: int
    active_s: float
    rate_since_start: float
    rate_last_minute: float
    eta_s: float | None
    paused: bool
    finished: bool
    kinds: list[KindProgress] = field(default_factory=list)
    status: str = RUNNING
    cancelled_at: str | None = None  # ``2026-11-24 17:05:00``

    def as_dict(self) -> dict:
        """JSON-safe form (for ``--json`` output and the dashboard)."""
        out = {k: v for k, v in self.__dict__.items() if k != "kinds"}
        out["kinds"] = [k.__dict__.copy() for k in self.kinds]
        return out


def kind_progress(k: KindCounts) -> KindProgress:
    """Rows expected of one kind: done rows, planned rows of the open chunks, and the kind's
    average per done chunk for open chunks planned without a count."""
    avg = k.rows_done / k.done if k.done else None
    guess_open = 0 if not k.unplanned_open else None if avg is None else avg * k.unplanned_open
    guess_left = 0 if not k.unplanned_left else None if avg is None else avg * k.unplanned_left
    expected = None if guess_open is None else k.rows_done + k.planned_open + round(guess_open)
    left = None if guess_left is None else k.planned_left + round(guess_left)
    return KindProgress(k.kind, k.rows_done, expected, left, k.rows_written, k.rows_quarantined,
                        k.done, k.failed, k.running, k.total, estimated=bool(k.unplanned_open))


def _overlap(a: datetime, b: datetime, p: Pause, now: datetime) -> float:
    """Seconds of ``[a, b]`` inside pause ``p`` (an open pause lasts until ``now``)."""
    lo, hi = max(a, p.start), min(b, p.end or now)
    return max(0.0, (hi - lo).total_seconds())


def active_seconds(start: datetime, end: datetime, pauses: list[Pause],
                   now: datetime | None = None) -> float:
    """Seconds from ``start`` to ``end`` that the run was not paused."""
    now = now or end
    wall = (end - start).total_seconds()
    return max(0.0, wall - sum(_overlap(start, end, p, now) for p in pauses))


def window_start(end: datetime, pauses: list[Pause], seconds: float = WINDOW_SECONDS
                 ) -> datetime:
    """When the last ``seconds`` of unpaused time before ``end`` began: the window reaches
    back over pauses, so a paused run keeps the rate it had when it was paused."""
    at, need = end, seconds
    for p in sorted(pauses, key=lambda p: p.start, reverse=True):
        if p.start >= at:
            continue
        gap = (at - min(p.end or end, end)).total_seconds()  # unpaused, after this pause
        if gap >= need:
            break
        need -= max(0.0, gap)
        at = p.start
    return at - timedelta(seconds=need)


def _eta(rows_left: int | None, rate: float, chunks_left: int, chunk_s: float | None
         ) -> float | None:
    """Seconds to go: rows left at ``rate``, else chunks left at ``chunk_s`` each."""
    if rows_left is not None and rate > 0:
        return rows_left / rate
    if chunk_s is not None:
        return chunks_left * chunk_s
    return None


def run_progress(kinds: list[KindCounts], pauses: list[Pause], recent_rows: int,
                 now: datetime, paused: bool, finished: bool) -> RunProgress:
    """The whole run from its kinds. ``recent_rows``: rows read by chunks that finished since
    ``window_start(end, pauses)``, where ``end`` is the last finish of a finished run and
    ``now`` otherwise (``run_window`` gives it)."""
    per = [kind_progress(k) for k in kinds]
    starts = [k.first_start for k in kinds if k.first_start]
    finishes = [k.last_finish for k in kinds if k.last_finish]
    end = (max(finishes) if finished and finishes else now)
    active = active_seconds(min(starts), end, pauses, now) if starts else 0.0
    rows_done = sum(k.rows_done for k in per)
    expected = None if any(k.rows_expected is None for k in per) else \
        sum(k.rows_expected or 0 for k in per)
    done = sum(k.chunks_done for k in per)
    failed = sum(k.chunks_failed for k in per)
    total = sum(k.chunks_total for k in per)
    since = rows_done / active if active > 0 else 0.0
    recent = recent_rows / min(WINDOW_SECONDS, active) if active > 0 else 0.0
    rows_left = None if any(k.rows_left is None for k in per) else sum(k.rows_left or 0
                                                                         for k in per)
    chunks_left = total - done - failed
    eta = 0.0 if chunks_left == 0 else _eta(rows_left, recent or since, chunks_left,
                                            active / done if done else None)
    return RunProgress(rows_done, expected, done, failed, sum(k.chunks_running for k in per),
                       total, round(active, 3), round(since, 1), round(recent, 1),
                       None if eta is None else round(eta, 1), paused, finished, per)


# -- reading the ledger ---------------------------------------------------------------------
_KIND_SQL = (
    "SELECT kind, COUNT(*), SUM(state = 'done'), SUM(state = 'failed'), SUM(state = 'running'), "
    "SUM(IF(state = 'done', rows_read, 0)), SUM(rows_written), SUM(rows_quarantined), "
    "SUM(IF(state <> 'done', rows_planned, 0)), "
    "SUM(IF(state IN ('pending', 'running'), rows_planned, 0)), "
    "SUM(state <> 'done' AND rows_planned IS NULL), "
    "SUM(state IN ('pending', 'running') AND rows_planned IS NULL), "
    "MIN(started_at), MAX(finished_at), NOW(3) "
    "FROM chunks WHERE run_id = %s GROUP BY kind ORDER BY MIN(chunk_id)")


def read_kinds(ledger: Ledger, run_id: str) -> tuple[list[KindCounts], datetime]:
    """Per-kind counts of a run, and the database's clock."""
    out, now = [], None
    for r in ledger.pool.query(_KIND_SQL, (run_id,)):
        nums = [int(v or 0) for v in r[1:12]]
        out.append(KindCounts(r[0], *nums, first_start=r[12], last_finish=r[13]))
        now = r[14]
    if now is None:
        (now,), = ledger.pool.query("SELECT NOW(3)")
    return out, now


def read_pauses(ledger: Ledger, run_id: str) -> list[Pause]:
    """The run's pauses, oldest first."""
    return [Pause(a, b) for a, b in ledger.pool.query(
        "SELECT paused_at, resumed_at FROM run_pauses WHERE run_id = %s ORDER BY paused_at",
        (run_id,))]


def read_progress(ledger: Ledger, run_id: str) -> RunProgress:
    """A run's progress as the ledger has it now."""
    run = ledger.run(run_id)
    kinds, now = read_kinds(ledger, run_id)
    pauses = read_pauses(ledger, run_id)
    finished = has_ended(run["status"])
    finishes = [k.last_finish for k in kinds if k.last_finish]
    end = max(finishes) if finished and finishes else now
    since = window_start(end, pauses)
    (recent,), = ledger.pool.query(
        "SELECT COALESCE(SUM(rows_read), 0) FROM chunks WHERE run_id = %s AND state = 'done' "
        "AND finished_at > %s AND finished_at <= %s", (run_id, since, end))
    cancelled = run["status"] == CANCELLED and run["cancelled_at"]
    return replace(run_progress(kinds, pauses, int(recent), now, run["paused"], finished),
                   status=run["status"], cancelled_at=str(cancelled)[:19] if cancelled else None)
