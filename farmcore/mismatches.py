"""What a verify run found different between legacy and the shards, per chunk.

This module is the only one that reads or writes the ``verify_mismatches`` table.
A chunk replaces its own findings, so a retried verify chunk never adds duplicates.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shardfarm.mysql.pool import Pool

if TYPE_CHECKING:  # the ledger wires these stores in: no import at run time
    from farmcore.ledger import Lease

Problem = tuple[str, str, str, str]  # (legacy table, legacy key, target, problem)


class Mismatches:
    """The ``verify_mismatches`` table of the control database."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    def record(self, lease: Lease, rows: list[Problem]) -> None:
        """Replace this chunk's mismatches ``(legacy_table, legacy_key, target, problem)``."""
        self.pool.execute("DELETE FROM verify_mismatches WHERE run_id = %s AND chunk_id = %s",
                          (lease.run_id, lease.chunk_id))
        self.pool.executemany(
            "INSERT IGNORE INTO verify_mismatches (run_id, chunk_id, legacy_table, legacy_key, "
            "target, problem) VALUES (%s,%s,%s,%s,%s,%s)",
            [(lease.run_id, lease.chunk_id, t, k, tgt, p[:300]) for t, k, tgt, p in rows])

    def of_run(self, run_id: str, limit: int = 100) -> tuple[int, list[dict]]:
        """How many mismatches a verify run found, and the first ``limit``."""
        (n,), = self.pool.query("SELECT COUNT(*) FROM verify_mismatches WHERE run_id = %s",
                                (run_id,))
        cols = ("legacy_table", "legacy_key", "target", "problem")
        found = self.pool.query(f"SELECT {', '.join(cols)} FROM verify_mismatches "
                                "WHERE run_id = %s ORDER BY legacy_table, legacy_key LIMIT %s",
                                (run_id, limit))
        return int(n), [dict(zip(cols, r, strict=True)) for r in found]
