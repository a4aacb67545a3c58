"""The rq job that runs a batch of items: ``function(**kwargs)`` for each, with a resume point.

The function is checked against the workers' policy before it is imported; a
refused or unimportable function fails every item with the reason (``farm
failed``), where ``farm retry-failed`` finds them. Per item: transient errors
are retried in place (``shardfarm.retry.TRANSIENT``); an item still failing is
deferred as its own job after ``shardfarm.retry.backoff``, its attempts counted in
the item record (``[id, kwargs, attempts]``) up to ``MAX_ITEM_ATTEMPTS``; a
``FatalError`` fails the item at once with its reason. The rest of the batch still
runs. Progress is checkpointed in batches (``jobs.accounting.advance``) so a re-run
after a crash skips finished items (at-least-once, never per-row bookkeeping).

A job that ends without running its items to the end (its worker died, its time
ran out) is not an item's failure: no item code runs then to count it. rq delivers
such a job again from its last checkpoint (``jobs.queue.envelope``: the batch's
delivery budget, ``farm enqueue --retries``), and it is settled into ``farm
failed`` when that budget is spent.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import redis
from rq import get_current_job
from rq.timeouts import JobTimeoutException

from farmcore import keys
from jobs import accounting, runtime, tally
from jobs.policy import CHUNK_FUNCTION
from shardfarm.errors import FatalError, RetryableError
from shardfarm.retry import TRANSIENT, backoff

MAX_ITEM_ATTEMPTS = 5
ITEM_BACKOFF, ITEM_BACKOFF_CAP = 5.0, 600.0  # seconds: first deferral, longest deferral
CHECKPOINT_EVERY = 50
CHECKPOINT_SECONDS = 1.0
_TALLIED = {"done": tally.DONE, "failed": tally.FAILED, "deferred": tally.RETRYING}


def run_items(function: str, items: list[list]) -> dict:
    """Run every item not yet done; returns counts of done, deferred and failed items."""
    job = get_current_job()
    conn, queue = job.connection, job.origin
    start = accounting.progress(conn, job.id, len(items))
    counts = {"done": 0, "deferred": 0, "failed": 0, "skipped": start}
    try:
        fn = runtime.get().policy.load_item(function)
    except FatalError as exc:  # refused or not importable: every item stops here, recorded
        for item in items[start:]:
            _fail(conn, queue, function, item, 1, exc, job.id)
            tally.note(item[0], "item", tally.FAILED)
        counts["failed"] = len(items) - start
        accounting.advance(conn, queue, job.id, len(items), len(items),
                           [i[0] for i in items[start:]])
        return counts
    window: list[str] = []
    last = time.monotonic()
    for idx in range(start, len(items)):
        ended = _run_one(fn, function, items[idx], conn, queue, job.id)
        counts[ended] += 1
        if ended != "done" or function != CHUNK_FUNCTION:  # a chunk's end: jobs.lifecycle
            tally.note(items[idx][0], "item", _TALLIED[ended])
        window.append(items[idx][0])
        if (idx + 1) % CHECKPOINT_EVERY == 0 or time.monotonic() - last > CHECKPOINT_SECONDS:
            accounting.advance(conn, queue, job.id, idx + 1, len(items), window)
            window, last = [], time.monotonic()
    accounting.advance(conn, queue, job.id, len(items), len(items), window)
    return counts


def _run_one(fn: Callable, function: str, item: list, conn: redis.Redis, queue: str,
             job_id: str) -> str:
    kwargs, attempts = item[1], (item[2] if len(item) > 2 else 0) + 1
    try:
        try:
            fn(**kwargs)
        except RetryableError:  # transient: retry in place with backoff before deferring
            TRANSIENT.call(lambda: fn(**kwargs))
        return "done"
    except JobTimeoutException:
        raise  # the job's time is up: rq retries it from the last checkpoint
    except FatalError as exc:
        return _fail(conn, queue, function, item, attempts, exc, job_id)
    except Exception as exc:  # noqa: BLE001 - unknown errors get a bounded retry
        if attempts >= MAX_ITEM_ATTEMPTS:
            return _fail(conn, queue, function, item, attempts, exc, job_id)
        from jobs.queue import enqueue_later
        enqueue_later(conn, queue, function, [[item[0], kwargs, attempts]],
                      delay=backoff(attempts - 1, ITEM_BACKOFF, ITEM_BACKOFF_CAP),
                      holder=job_id)
        return "deferred"


def _fail(conn: redis.Redis, queue: str, function: str, item: list, attempts: int,
          exc: BaseException, job_id: str) -> str:
    reason = f"{type(exc).__name__}: {exc}"
    conn.hset(keys.failed_items(queue), item[0],
              accounting.failure(function, item[1], reason, attempts=attempts, job_id=job_id))
    return "failed"
