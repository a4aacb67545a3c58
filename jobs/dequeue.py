"""How a farm worker takes a job off several queues without a moment it could lose it.

rq takes a job off one queue with ``BLMOVE`` into the queue's intermediate list, where
housekeeping finds it if the worker dies before starting it
(housekeeping's ``redeliver_stuck``). Off several queues rq uses ``BLPOP``: a worker
killed between the pop and the start left the job in no list and no registry, its hash
alive (so its items and its chunk stayed held) and never run. ``FarmQueue`` takes the
first job of the first non-empty queue into that queue's intermediate list in one script,
as rq does for one queue; while every queue is empty it waits on the first (the one
preferred) for at most ``WAIT_SLICE`` seconds at a time before looking at all again.
rq's workers also clean these lists (they fail what they find stuck); housekeeping alone
does (``HousekeptList``). Before Redis 6.2 (no ``LMOVE``) rq's ``BLPOP`` is used, as rq
itself falls back, and the window stays open there.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import redis
from redis.commands.core import Script
from rq import Queue
from rq.exceptions import DequeueTimeout
from rq.intermediate_queue import IntermediateQueue
from rq.utils import get_version

WAIT_SLICE = 0.5  # seconds: the longest a job on a later queue waits for an idle worker
# KEYS: the queues in order, then their intermediate lists in the same order. Moves the
# first job of the first non-empty queue into its intermediate list; {queue key, job ID}.
_TAKE_FIRST = Script(None, b"""
local n = #KEYS / 2
for i = 1, n do
  local id = redis.call('LMOVE', KEYS[i], KEYS[n + i], 'LEFT', 'RIGHT')
  if id then return {KEYS[i], id} end
end
return false
""")


class HousekeptList(IntermediateQueue):
    """A queue's intermediate list that only the farm's housekeeping cleans."""

    def cleanup(self, worker: object, queue: Queue) -> None:
        """Nothing: rq's workers would fail a job stuck here every ten minutes, where
        housekeeping delivers it again (``redeliver_stuck``); one cleaner a list, so a job
        is never both."""


class FarmQueue(Queue):
    """rq's ``Queue`` whose take off several queues goes through the intermediate lists,
    which only housekeeping cleans."""

    @property
    def intermediate_queue(self) -> HousekeptList:
        """The queue's intermediate list (rq's key)."""
        return HousekeptList(self.key, connection=self.connection)

    @classmethod
    def lpop(cls, queue_keys: Sequence[str], timeout: int | None,
             connection: redis.Redis | None = None) -> tuple[bytes, bytes] | None:
        """``(queue key, job ID)`` of the job taken, moved into its queue's intermediate
        list; ``None`` when every queue is empty (``timeout`` None), else ``DequeueTimeout``
        after ``timeout`` seconds (rq's contract for its ``BLPOP``)."""
        assert connection is not None
        if get_version(connection) < (6, 2, 0):  # no LMOVE: rq's own way, as rq does
            return super().lpop(queue_keys, timeout, connection=connection)
        if timeout == 0:
            raise ValueError("RQ does not support indefinite timeouts. Please pick a timeout "
                             "value > 0")
        lists = [IntermediateQueue.get_intermediate_queue_key(k) for k in queue_keys]
        deadline = time.monotonic() + (timeout or 0)
        while True:
            got = _TAKE_FIRST(keys=[*queue_keys, *lists], client=connection)
            if got:
                return got[0], got[1]
            left = deadline - time.monotonic()
            if timeout is None:
                return None
            if left <= 0:
                raise DequeueTimeout(timeout, queue_keys)
            got = connection.blmove(queue_keys[0], lists[0], min(WAIT_SLICE, left))
            if got is not None:
                return queue_keys[0], got
