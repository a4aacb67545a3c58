"""Waiting for enqueued items: each is finished once no live job carries it (its dedup entry
went at its batch's checkpoint, or with its failure record), and failed if ``farm failed``
holds a record of it.

Both are changed by one Lua script each (``jobs.accounting``), so an item is never seen
released without its failure record. An item whose entry names a job whose data is gone
from Redis (deleted, evicted, overwritten) would never be released by a worker: the watch
reaps the items it watches of that job itself (``jobs.lost.reap_jobs``: each is recorded
as failed; the job is counted out at once if they were all it had left, else by the
housekeeping's sweep, which finds the others), so a wait always ends and never calls a
lost item done. Only items still open are asked about, 10,000 per round trip.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import redis

from farmcore import keys
from jobs.accounting import HOLDS_ROUND, holds
from jobs.lost import reap_jobs


@dataclass(frozen=True)
class ItemsProgress:
    """How many of the watched items finished, and how many of those failed."""

    total: int
    done: int
    failed: int

    @property
    def finished(self) -> bool:
        """Every watched item finished (done or failed)."""
        return self.done + self.failed >= self.total


class ItemWatch:
    """Items enqueued on ``queue``, watched until none is in flight."""

    def __init__(self, conn: redis.Redis, queue: str) -> None:
        self.conn, self.queue = conn, queue
        self.open: dict[str, None] = {}
        self.total = self.done = self.failed = 0

    def add(self, ids: Iterable[str]) -> None:
        """Watch these item IDs too (an ID given twice is one item)."""
        before = len(self.open)
        self.open.update(dict.fromkeys(ids))
        self.total += len(self.open) - before

    def poll(self) -> ItemsProgress:
        """Look at the items still open once; how all of them stand now."""
        pending = list(self.open)
        for i in range(0, len(pending), HOLDS_ROUND):
            free = self._free(pending[i:i + HOLDS_ROUND])
            if not free:
                continue
            records = self.conn.hmget(keys.failed_items(self.queue), free)
            for item, record in zip(free, records, strict=True):
                del self.open[item]
                self.failed += record is not None
                self.done += record is None
        return ItemsProgress(self.total, self.done, self.failed)

    def _free(self, ids: list[str]) -> list[str]:
        """Those of ``ids`` no live job carries, once the jobs whose data is gone that
        carried some were reaped (their items then free, with a failure record)."""
        states = holds(self.conn, self.queue, ids)
        lost: dict[str, list[str]] = {}
        for item, state in zip(ids, states, strict=True):
            if state not in ("", "+"):
                lost.setdefault(state, []).append(item)
        if lost:  # the items watched here are recorded now; the sweep finds the others
            reap_jobs(self.conn, self.queue, sorted(lost), lost)
            states = holds(self.conn, self.queue, ids)
        return [item for item, state in zip(ids, states, strict=True) if state == ""]
