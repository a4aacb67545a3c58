"""Retention: drop the ledger rows of runs that ended long ago, in bounded batches.

The only module that deletes from ``runs``, ``chunks``, ``quarantine`` and
``verify_mismatches``. A pruned run keeps one summary row in ``runs_archive`` (kind,
status, times, chunks done and failed, rows written); its chunks, quarantined rows and
verify findings go. Every DELETE removes at most ``batch`` rows and commits on its own,
so pruning never holds a long transaction or a big lock over the ledger workers write to;
the run's own row goes last, so a prune that dies half way is finished by the next one.
Only runs whose status is ``done`` (and ``failed`` when asked) and that ended before
the cut-off are touched, and only if none of their chunks is pending or running.
Their fence rows on the shards and mod buckets go first (``fences``, given by the caller:
``sharding.fencing.forget``), all at once, before any ledger row: if that fails, nothing
of the ledger has changed and the next prune tries again.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass

from shardfarm.errors import UsageError
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
    """What a prune removed (or, with ``dry_run``, would remove)."""

    runs: int = 0
    chunks: int = 0
    quarantine: int = 0
    mismatches: int = 0
    fences: int = 0
    batches: int = 0
    dry_run: bool = False

    def as_dict(self) -> dict:
        """The report as JSON-safe dict."""
        return asdict(self)


def prunable(pool: Pool, older_than_s: int, include_failed: bool = False) -> list[str]:
    """Runs that ended more than ``older_than_s`` seconds ago, oldest first, with no chunk
    pending or running (``done`` runs; ``failed`` ones too when asked)."""
    states = ("done", "failed") if include_failed else ("done",)
    marks = ",".join(["%s"] * len(states))
    return [r[0] for r in pool.query(
        f"SELECT r.run_id FROM runs r WHERE r.status IN ({marks}) AND r.finished_at IS NOT NULL "
        "AND r.finished_at < NOW(3) - INTERVAL %s SECOND AND NOT EXISTS (SELECT 1 FROM chunks c "
        "WHERE c.run_id = r.run_id AND c.state IN ('pending', 'running')) "
        "ORDER BY r.finished_at", (*states, older_than_s))]


Fences = Callable[[list[str], bool], int]  # (run IDs, dry run) -> fence rows deleted (counted)


def prune(pool: Pool, older_than_s: int, *, dry_run: bool = False, batch: int = 5000,
          include_failed: bool = False, fences: Fences | None = None,
          on_batch: Callable[[str, str, int], None] | None = None) -> PruneReport:
    """Archive and delete every prunable run (see ``prunable``), after ``fences(run_ids,
    dry_run)`` deleted (or counted) their fence rows; ``on_batch(run_id, table, deleted)``
    is called after each DELETE."""
    report = PruneReport(dry_run=dry_run)
    runs = prunable(pool, older_than_s, include_failed)
    if fences and runs:
        report.fences = fences(runs, dry_run)
    for run_id in runs:
        report.runs += 1
        if dry_run:
            for table, label in CHILD_TABLES:
                n = pool.query(f"SELECT COUNT(*) FROM {table} WHERE run_id = %s", (run_id,))
                setattr(report, label, getattr(report, label) + int(n[0][0]))
            continue
        _archive(pool, run_id)
        for table, label in CHILD_TABLES:
            while n := pool.execute(f"DELETE FROM {table} WHERE run_id = %s LIMIT %s",
                                    (run_id, batch)):
                setattr(report, label, getattr(report, label) + n)
                report.batches += 1
                if on_batch:
                    on_batch(run_id, table, n)
        pool.execute("DELETE FROM runs WHERE run_id = %s", (run_id,))
    return report


def _archive(pool: Pool, run_id: str) -> None:
    """Keep the run's summary in ``runs_archive`` (once: a second prune keeps the first)."""
    pool.execute(
        "INSERT IGNORE INTO runs_archive (run_id, kind, status, total_chunks, chunks_done, "
        "chunks_failed, rows_written, created_at, finished_at) "
        "SELECT r.run_id, r.kind, r.status, r.total_chunks, "
        "COALESCE(SUM(c.state = 'done'), 0), COALESCE(SUM(c.state = 'failed'), 0), "
        "COALESCE(SUM(c.rows_written), 0), r.created_at, r.finished_at "
        "FROM runs r LEFT JOIN chunks c ON c.run_id = r.run_id WHERE r.run_id = %s "
        "GROUP BY r.run_id", (run_id,))
