"""``farm sync``'s durable state in the control database: the leader's lease and the
checkpoint (the binlog position everything before which has been applied).

This module is the only one that reads or writes the ``sync_state`` table (one row).
Leadership is a lease with a fencing token: taking over an expired lease raises the
fence, and every later write of the old leader is refused (a checkpoint is a
compare-and-set on the fence; shard writes carry it as a ``FenceToken``).
"""

from __future__ import annotations

import json

from shardfarm.errors import FencedError
from shardfarm.mysql.pool import Pool

ROW = "sync"


def hold(cur, fence: int) -> None:
    """Inside a control-database transaction: share-lock the sync row and raise
    ``FencedError`` unless ``fence`` still leads. Until commit no process can take the
    lease over, so what the transaction writes is a leader's (``farm sync``'s quarantine:
    a stalled leader's late write would undo its successor's)."""
    cur.execute("SELECT fence FROM sync_state WHERE name = %s LOCK IN SHARE MODE", (ROW,))
    row = cur.fetchone()
    if row is None or int(row[0]) != fence:
        raise FencedError(f"sync lease {fence} was taken over (the fence is now "
                          f"{row[0] if row else 'gone'}): a stale leader records nothing")


class SyncState:
    """The ``sync_state`` table."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool  # the control database's pool

    def acquire(self, owner: str, host: str, seconds: float) -> int | None:
        """Lead (or keep leading) for ``seconds``; the fence, or ``None`` if another
        process holds an unexpired lease."""
        self.pool.execute("INSERT IGNORE INTO sync_state (name, fence) VALUES (%s, 0)", (ROW,))
        self.pool.execute(
            "UPDATE sync_state SET fence = IF(owner <=> %s, fence, fence + 1), owner = %s, "
            "host = %s, expires = NOW(3) + INTERVAL %s MICROSECOND "
            "WHERE name = %s AND (owner <=> %s OR expires IS NULL OR expires < NOW(3))",
            (owner, owner, host, int(seconds * 1e6), ROW, owner))
        rows = self.pool.query("SELECT owner, fence FROM sync_state WHERE name = %s", (ROW,))
        return int(rows[0][1]) if rows and rows[0][0] == owner else None

    def renew(self, fence: int, seconds: float) -> bool:
        """Extend the lease of the leader holding ``fence``; ``False`` if it was lost."""
        return self.pool.execute(
            "UPDATE sync_state SET expires = NOW(3) + INTERVAL %s MICROSECOND "
            "WHERE name = %s AND fence = %s AND expires >= NOW(3)",
            (int(seconds * 1e6), ROW, fence)) == 1

    def begin_apply(self, fence: int, seconds: float, start: str, end: str) -> bool:
        """``renew``, and note that an apply of the changes from checkpoint ``start`` to
        ``end`` begins: until this leader's next ``checkpoint`` (or one at ``end`` or past
        it) it may be recorded nowhere (an earlier leader's note, if any, is kept);
        ``False`` if the lease was lost."""
        return self.pool.execute(
            "UPDATE sync_state SET expires = NOW(3) + INTERVAL %s MICROSECOND, "
            "applying_fence = IF(applying_from IS NULL, %s, applying_fence), "
            "applying_to = IF(applying_from IS NULL, %s, applying_to), "
            "applying_from = IFNULL(applying_from, %s) "
            "WHERE name = %s AND fence = %s AND expires >= NOW(3)",
            (int(seconds * 1e6), fence, end, start, ROW, fence)) == 1

    def release(self, fence: int) -> None:
        """Give the lease up (a clean stop)."""
        self.pool.execute("UPDATE sync_state SET expires = NULL WHERE name = %s AND fence = %s",
                          (ROW, fence))

    def checkpoint(self, fence: int, run_id: str, gtid: str, event_time: int,
                   applied: dict[str, int], anew: bool = False) -> bool:
        """Record that every event up to ``gtid`` is applied (with the per-table counts
        added), and that this leader's applies are recorded (or, ``anew``, every earlier
        leader's too: ``gtid`` is where their applies began, or past where they ended);
        ``False`` if ``fence`` no longer leads."""
        row = self.read()
        total = dict(row.get("applied") or {}) if row.get("run_id") == run_id else {}
        for table, n in applied.items():
            total[table] = total.get(table, 0) + n
        return self.pool.execute(
            "UPDATE sync_state SET run_id = %s, gtid = %s, event_time = %s, applied = %s, "
            "checkpointed_at = NOW(3), applying_from = IF(%s OR applying_fence = fence, "
            "NULL, applying_from) WHERE name = %s AND fence = %s",
            (run_id, gtid, event_time, json.dumps(total), anew, ROW, fence)) == 1

    def read(self) -> dict:
        """The row as a dict (empty before the first sync)."""
        cols = ("owner", "host", "fence", "expires", "run_id", "gtid", "event_time", "applied",
                "checkpointed_at", "applying_from", "applying_to")
        rows = self.pool.query(f"SELECT {', '.join(cols)}, expires >= NOW(3) FROM sync_state "
                               "WHERE name = %s", (ROW,))
        if not rows:
            return {}
        out = dict(zip(cols, rows[0][:-1], strict=True))
        out["leading"] = bool(rows[0][-1])
        out["applied"] = counts(out["applied"])
        return out


def counts(text: str | bytes | None) -> dict[str, int]:
    """The per-table counts of the ``applied`` column; entries of another shape (the column
    written by hand or by anyone: a list, text for a count) are left out, so they neither
    stop a checkpoint nor crash the views that show them."""
    doc = json.loads(text) if text else {}
    if not isinstance(doc, dict):
        return {}
    return {t: n for t, n in doc.items()
            if isinstance(n, int) and not isinstance(n, bool) and n >= 0}
