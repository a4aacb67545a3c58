"""Retention: drop the ledger rows of runs that ended long ago, in bounded batches.

The only module that deletes from ``runs``, ``chunks``, ``quarantine`` and
``verify_mismatches``. A pruned run keeps one summary row in ``runs_archive`` (kind,
status, times, chunks done and failed, rows written); its chunks, quarantined rows and
verify findings go. Every DELETE removes at most ``batch`` rows and commits on its own,
so pruning never holds a long transaction or a big lock over the ledger workers write to;
the run's own row goes last, so a prune that dies half way is finished by the next one.
Only runs whose status is ``done`` or ``cancelled`` (ended on purpose; ``failed`` too when
asked) and that ended before the cut-off are touched, and only if none of their chunks is
pending or running: each is archived and marked ``pruning`` under that condition, in one
statement each, before its rows go; ``farm retry-failed`` gives back no run so marked,
and one given back in the instant before the mark is left as it was.

Their fence rows on the shards and mod buckets (``fences``, given by the caller:
``sharding.fencing.forget``) are what refuse a stalled worker of the run that wakes up and
writes, so they go a day after the run ended at the earliest (``FENCE_FLOOR_S``), whatever
the age asked: ``runs_archive.fences_left`` remembers the pruned runs whose fences are
still there, and every prune forgets those of them that are old enough. The archive row
is written before the run's rows go, so a prune that fails or dies leaves nothing behind
that the next one does not finish.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass

from farmcore.ledger import PRUNING
from farmcore.runstate import CANCELLED, DONE, FAILED
from shardfarm.errors import FarmError, UsageError
from shardfarm.mysql.pool import Pool

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
# (table, what the report calls it): a run's rows, deleted before the run's own row.
CHILD_TABLES = (("chunks", "chunks"), ("quarantine", "quarantine"),
                ("verify_mismatches", "mismatches"))


def parse_age(text: str) -> int:
    """``30d`` → seconds (units s, m, h, d, w); ``UsageError`` for anything else."""
    m = re.fullmatch(r"\s*(\d+)\s*([smhdw])\s*", text or "")
    if not m or int(m.group(1)) == 0:
        raise UsageError(f"--older-than {text!r}: give a positive number with a unit "
                         "s, m, h, d or w, e.g. 30d")
    return int(m.group(1)) * UNITS[m.group(2)]


@dataclass
class PruneReport:
    """What a prune removed (or, with ``dry_run``, would remove); ``complete`` once every
    step ran (false: a step failed, and the counts say what went before it)."""

    runs: int = 0
    chunks: int = 0
    quarantine: int = 0
    mismatches: int = 0
    fences: int = 0
    batches: int = 0
    dry_run: bool = False
    complete: bool = False

    def as_dict(self) -> dict:
        """The report as JSON-safe dict."""
        return asdict(self)


# a run none of whose chunks is pending or running or still leased to a worker (``r``: the
# run's row): a cancelled chunk keeps its lease until its worker's next renewal fences it out,
# and until then that worker may still record quarantined rows against the run
_NOTHING_LEFT = ("NOT EXISTS (SELECT 1 FROM chunks x WHERE x.run_id = r.run_id AND (x.state IN "
                 "('pending', 'running') OR x.lease_expires > NOW(3)))")


# not the run 'farm sync' follows (its checkpoint names it), whatever its age
_FOLLOWED = "NOT EXISTS (SELECT 1 FROM sync_state s WHERE s.run_id = r.run_id)"
# the newest run of its kind (``r``: the run's row)
_NEWEST = ("r.run_id = (SELECT n.run_id FROM runs n WHERE n.kind = r.kind ORDER BY "
           "n.created_at DESC, n.run_id DESC LIMIT 1)")


def _ended(include_failed: bool, older_than_s: int, keep_latest: tuple[str, ...] = ()
           ) -> tuple[str, tuple]:
    """The condition on run ``r`` that lets it be pruned, and its parameters: ended (``done``
    or ``cancelled``, or ``failed`` too) more than ``older_than_s`` seconds ago, nothing
    pending or running, not the run ``farm sync`` follows, and not the newest run of a kind
    of ``keep_latest``."""
    states = (DONE, CANCELLED, FAILED) if include_failed else (DONE, CANCELLED)
    keep = (f" AND NOT (r.kind IN ({','.join(['%s'] * len(keep_latest))}) AND {_NEWEST})"
            if keep_latest else "")
    return (f"r.status IN ({','.join(['%s'] * len(states))}) AND r.finished_at IS NOT NULL "
            f"AND r.finished_at < NOW(3) - INTERVAL %s SECOND AND {_NOTHING_LEFT}"
            f" AND {_FOLLOWED}{keep}", (*states, older_than_s, *keep_latest))


def prunable(pool: Pool, older_than_s: int, include_failed: bool = False, *,
             pruning_s: int = 0, keep_latest: tuple[str, ...] = ()) -> list[str]:
    """Runs that ended more than ``older_than_s`` seconds ago, oldest first, with no chunk
    pending or running (``done`` and ``cancelled`` runs; ``failed`` ones too when asked),
    but the run ``farm sync`` follows and the newest run of each kind of ``keep_latest``,
    and runs a prune left half pruned
    (those that ended ``pruning_s`` seconds ago or more)."""
    cond, args = _ended(include_failed, older_than_s, keep_latest)
    return [r[0] for r in pool.query(
        f"SELECT r.run_id FROM runs r WHERE (r.status = '{PRUNING}' AND (%s = 0 OR "
        f"r.finished_at < NOW(3) - INTERVAL %s SECOND)) OR ({cond}) ORDER BY r.finished_at",
        (pruning_s, pruning_s, *args))]


Fences = Callable[[list[str], bool], int]  # (run IDs, dry run) -> fence rows deleted (counted)
FENCE_FLOOR_S = 86400  # a run's fences go this long after it ended at the earliest
FENCE_BATCH = 1000  # pruned runs whose fences one call of ``fences`` forgets


def prune(pool: Pool, older_than_s: int, *, dry_run: bool = False, batch: int = 5000,
          include_failed: bool = False, fences: Fences | None = None,
          on_batch: Callable[[str, str, int], None] | None = None,
          report: PruneReport | None = None, keep_latest: tuple[str, ...] = ()
          ) -> PruneReport:
    """Archive and delete every prunable run (see ``prunable``; the run ``farm sync`` follows
    and the newest run of each kind of ``keep_latest`` stay, whatever their age), then, with
    ``fences``,
    forget the fence rows of every pruned run that ended ``FENCE_FLOOR_S`` ago or more
    (``fences_due``); ``on_batch(run_id, table, deleted)`` is called after each DELETE.
    Fills and returns ``report`` (what went so far if it raises)."""
    report = report or PruneReport(dry_run=dry_run)
    for run_id in prunable(pool, older_than_s, include_failed, keep_latest=keep_latest):
        if dry_run:
            report.runs += 1
            for table, label in CHILD_TABLES:
                n = pool.query(f"SELECT COUNT(*) FROM {table} WHERE run_id = %s", (run_id,))
                setattr(report, label, getattr(report, label) + int(n[0][0]))
        elif _take(pool, run_id, *_ended(include_failed, older_than_s, keep_latest)):
            report.runs += 1
            _delete_run(pool, run_id, batch, report, on_batch)
    if fences is not None:
        old = prunable(pool, max(older_than_s, FENCE_FLOOR_S), include_failed,
                       keep_latest=keep_latest,
                       pruning_s=FENCE_FLOOR_S) if dry_run else []
        report.fences = _forget_fences(pool, fences, fences_due(pool) + old, dry_run)
    report.complete = True
    return report


def fences_due(pool: Pool) -> list[str]:
    """Pruned runs whose fence rows are still on the shards and that ended a day ago or
    more (``FENCE_FLOOR_S``), oldest first; never a run the ledger still holds (a prune
    died before its rows went, and it may have been given back since)."""
    return [r[0] for r in pool.query(
        "SELECT a.run_id FROM runs_archive a WHERE a.fences_left = 1 AND a.finished_at < "
        "NOW(3) - INTERVAL %s SECOND AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.run_id = "
        "a.run_id) ORDER BY a.finished_at", (FENCE_FLOOR_S,))]


def _forget_fences(pool: Pool, fences: Fences, runs: list[str], dry_run: bool) -> int:
    """``fences`` of ``runs``, ``FENCE_BATCH`` at a time, each batch then marked in
    ``runs_archive``; a failure says which step failed and what the next prune does."""
    n = 0
    for i in range(0, len(runs), FENCE_BATCH):
        part = runs[i:i + FENCE_BATCH]
        try:
            n += fences(part, dry_run)
        except FarmError as exc:  # the same error (its kind, host, code), told where it came
            exc.args = (f"counting the fence rows of {len(part)} run(s) on the shards and "
                        f"mod buckets: {exc}",) if dry_run else (
                f"deleting the fence rows of {len(part)} pruned run(s) on the shards and mod "
                f"buckets: {exc} (their ledger rows are pruned; the next prune deletes their "
                "fences)",)
            raise
        if not dry_run:
            pool.execute("UPDATE runs_archive SET fences_left = 0 WHERE run_id IN "
                         f"({','.join(['%s'] * len(part))})", tuple(part))
    return n


def _take(pool: Pool, run_id: str, cond: str, args: tuple) -> bool:
    """Archive the run's summary and mark it ``PRUNING`` if ``cond`` still holds for it;
    whether it is to be deleted (a run marked by a prune that died is). A run given back
    (``farm retry-failed``) in the instant before the mark is left as it was."""
    rows = pool.query("SELECT status FROM runs WHERE run_id = %s", (run_id,))
    if not rows or rows[0][0] == PRUNING:
        return bool(rows)
    _archive(pool, run_id, cond, args)
    if not pool.execute(f"UPDATE runs r SET r.status = '{PRUNING}' WHERE r.run_id = %s AND "
                        f"{cond}", (run_id, *args)):
        return False
    if pool.query("SELECT 1 FROM chunks WHERE run_id = %s AND state IN ('pending', "
                  "'running') LIMIT 1", (run_id,)):  # given back as it was marked
        pool.execute("UPDATE runs SET status = %s WHERE run_id = %s AND status = %s",
                      (rows[0][0], run_id, PRUNING))
        return False
    return True


def _delete_run(pool: Pool, run_id: str, batch: int, report: PruneReport,
                on_batch: Callable[[str, str, int], None] | None) -> None:
    """Delete the rows of a run ``_take`` marked, ``batch`` at a time, its own last."""
    for table, label in CHILD_TABLES:
        while n := pool.execute(f"DELETE FROM {table} WHERE run_id = %s LIMIT %s",
                                (run_id, batch)):
            setattr(report, label, getattr(report, label) + n)
            report.batches += 1
            if on_batch:
                on_batch(run_id, table, n)
    pool.execute("DELETE FROM runs WHERE run_id = %s", (run_id,))


def _archive(pool: Pool, run_id: str, cond: str, args: tuple) -> None:
    """Keep the run's summary in ``runs_archive`` if ``cond`` holds for it, its fences
    left; a newer summary replaces an older one (the run was given back and ended again)."""
    cols = ("status", "total_chunks", "chunks_done", "chunks_failed", "rows_written",
            "finished_at")
    pool.execute(
        "INSERT INTO runs_archive (run_id, kind, status, total_chunks, chunks_done, "
        "chunks_failed, rows_written, created_at, finished_at, fences_left) "
        "SELECT r.run_id, r.kind, r.status, r.total_chunks, "
        "COALESCE(SUM(c.state = 'done'), 0), COALESCE(SUM(c.state = 'failed'), 0), "
        "COALESCE(SUM(c.rows_written), 0), r.created_at, r.finished_at, 1 "
        f"FROM runs r LEFT JOIN chunks c ON c.run_id = r.run_id WHERE r.run_id = %s AND {cond} "
        "GROUP BY r.run_id ON DUPLICATE KEY UPDATE "
        + ", ".join(f"{k} = VALUES({k})" for k in cols)
        + ", fences_left = 1, pruned_at = NOW(3)", (run_id, *args))
