"""The quarantine: legacy rows a migration could not move, with the reason, per run.

This module is the only one that reads or writes the ``quarantine`` table. A chunk
records its bad rows idempotently (a retried chunk replaces what its earlier attempts
recorded), so the table holds each legacy row at most once per run, and only while it is
bad.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from farmcore.syncstate import hold
from shardfarm.errors import FencedError
from shardfarm.mysql.inlist import IN_LIST_MAX
from shardfarm.mysql.pool import Pool

if TYPE_CHECKING:  # the ledger wires these stores in: no import at run time
    from farmcore.ledger import Lease

BATCH = 1000  # rows per INSERT
SYNC_CHUNK = -1  # the chunk_id of rows ``farm sync`` records
BadRow = tuple[str, str, str, str | None]  # (legacy table, legacy key, reason, detail)
INSERT = ("INSERT INTO quarantine (run_id, legacy_table, legacy_key, reason, detail, chunk_id) "
          "VALUES (%s,%s,%s,%s,%s,%s) ON DUPLICATE KEY UPDATE reason = VALUES(reason), "
          "detail = VALUES(detail)")


# A chunk's rows, locked through its own index entries only: a DELETE by chunk (which the
# optimizer answers by the run's primary-key range) locked every quarantined row of the run
# in REPEATABLE READ, and the chunks of a run recording at once waited for each other.
CHUNK_ROWS = ("SELECT legacy_table, legacy_key FROM quarantine FORCE INDEX (by_chunk) "
              "WHERE run_id = %s AND chunk_id = %s FOR UPDATE")


def _delete(cur, run_id: str, rows: set[tuple[str, str]]) -> None:
    """Delete ``(legacy table, legacy key)`` rows of a run, one primary-key lookup each (an
    IN list over a small run's rows may be answered by a range scan, which locks others)."""
    if rows:
        cur.executemany("DELETE FROM quarantine WHERE run_id = %s AND legacy_table = %s "
                        "AND legacy_key = %s", [(run_id, t, k) for t, k in sorted(rows)])


def _insert(executemany: Callable[[str, list], object], params: list[tuple]) -> None:
    """Insert (or update) quarantine rows ``BATCH`` a statement, through a cursor's or the
    pool's ``executemany``."""
    for i in range(0, len(params), BATCH):
        executemany(INSERT, params[i:i + BATCH])


def _hold_chunk(cur, lease: Lease) -> None:
    """Inside a control-database transaction: share-lock the chunk's ledger row and raise
    ``FencedError`` unless ``lease`` is still current (until commit, no claim can bump it)."""
    cur.execute("SELECT fence FROM chunks WHERE run_id = %s AND chunk_id = %s "
                "LOCK IN SHARE MODE", (lease.run_id, lease.chunk_id))
    row = cur.fetchone()
    if row is None or int(row[0]) != lease.fence:
        raise FencedError(f"chunk {lease.chunk_id} of run {lease.run_id}: lease {lease.fence} "
                          "was taken over; a stale attempt records no quarantine")


class Quarantine:
    """The ``quarantine`` table of the control database."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    def record(self, lease: Lease, rows: list[BadRow]) -> None:
        """Make bad legacy rows ``(table, key, reason, detail)`` the chunk's quarantine in
        its run: what an earlier attempt recorded is replaced (a row it quarantined may load
        now), in one transaction that ``FencedError`` refuses once the lease was taken over
        (a stalled attempt's older verdicts would otherwise replace its successor's)."""
        params = [(lease.run_id, t, k, reason, (detail or "")[:500], lease.chunk_id)
                  for t, k, reason, detail in rows]

        def tx(cur) -> None:
            _hold_chunk(cur, lease)
            cur.execute(CHUNK_ROWS, (lease.run_id, lease.chunk_id))
            gone = set(cur.fetchall()) - {(t, k) for t, k, *_ in rows}
            _delete(cur, lease.run_id, gone)
            _insert(cur.executemany, params)
        self.pool.run(tx, transaction=True)

    def replace(self, run_id: str, table: str, keys: list[str], rows: list[BadRow],
                prefix: bool = False, fence: int | None = None) -> None:
        """Make ``rows`` the quarantine of legacy ``keys`` of ``table`` in a run (``farm
        sync``: a key applied again is quarantined for its current reason or not at all).
        With ``prefix``, a key is a first key column (``7`` stands for ``7:*``). With
        ``fence`` (the sync lease's), one transaction that ``FencedError`` refuses once
        another leader took over: a stalled leader's verdicts, older than its successor's,
        would otherwise be written over them."""
        deletes = []
        for i in range(0, len(keys), IN_LIST_MAX):
            part = keys[i:i + IN_LIST_MAX]
            cond = (" OR ".join(["legacy_key LIKE %s"] * len(part)) if prefix
                    else f"legacy_key IN ({','.join(['%s'] * len(part))})")
            args = [f"{k}:%" for k in part] if prefix else part
            deletes.append(("DELETE FROM quarantine WHERE run_id = %s AND legacy_table = %s "
                            f"AND ({cond})", (run_id, table, *args)))
        params = [(run_id, t, k, reason, (detail or "")[:500], SYNC_CHUNK)
                  for t, k, reason, detail in rows]
        if fence is None:
            for sql, args in deletes:
                self.pool.execute(sql, args)
            _insert(self.pool.executemany, params)
            return

        def tx(cur) -> None:
            hold(cur, fence)
            for sql, args in deletes:
                cur.execute(sql, args)
            _insert(cur.executemany, params)
        self.pool.run(tx, transaction=True)

    def rows(self, run_id: str, limit: int | None = None) -> list[dict]:
        """Quarantined rows of a run: table, legacy key, reason, detail."""
        cols = ("legacy_table", "legacy_key", "reason", "detail")
        sql = (f"SELECT {', '.join(cols)} FROM quarantine WHERE run_id = %s "
               "ORDER BY legacy_table, legacy_key")
        found = self.pool.query(sql + (" LIMIT %s" if limit else ""),
                                (run_id, limit) if limit else (run_id,))
        return [dict(zip(cols, r, strict=True)) for r in found]

    def reasons(self, run_id: str) -> list[tuple[str, str, int]]:
        """``(table, reason, count)`` of a run's quarantine, most frequent first per table."""
        return [(t, r, int(n)) for t, r, n in self.pool.query(
            "SELECT legacy_table, reason, COUNT(*) FROM quarantine WHERE run_id = %s "
            "GROUP BY legacy_table, reason ORDER BY legacy_table, COUNT(*) DESC", (run_id,))]
