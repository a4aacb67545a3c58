"""The rq job that runs a batch of items: ``function(**kwargs)`` for each, with a resume point.

Per item: transient errors are retried in place (tenacity policy); an item
still failing transiently is deferred with backoff as its own job; a
``FatalError`` fails the item at once with its reason. The rest of the batch
still runs. Progress is checkpointed in batches so a re-run after a crash
skips finished items (at-least-once, never per-row bookkeeping).
"""

from __future__ import annotations

import importlib
import json
import time
from collections.abc import Callable

from rq import get_current_job

from shardfarm import keys
from shardfarm.errors import FatalError, RetryableError
from shardfarm.retry import TRANSIENT

MAX_ITEM_ATTEMPTS = 5
CHECKPOINT_EVERY = 50
CHECKPOINT_SECONDS = 1.0


def resolve(function: str) -> Callable:
    """Import ``module.function``."""
    module, _, name = function.rpartition(".")
    return getattr(importlib.import_module(module), name)


def run_items(function: str, items: list[list]) -> dict:
    """Run every item not yet done; returns counts of done, deferred and failed items."""
    job = get_current_job()
    conn, queue = job.connection, job.origin
    fn = resolve(function)
    progress_key = keys.item_progress(job.id)
    start = int(conn.get(progress_key) or 0)
    counts = {"done": 0, "deferred": 0, "failed": 0, "skipped": start}
    last = time.monotonic()
    for idx in range(start, len(items)):
        counts[_run_one(fn, function, items[idx], conn, queue)] += 1
        if (idx + 1) % CHECKPOINT_EVERY == 0 or time.monotonic() - last > CHECKPOINT_SECONDS:
            conn.set(progress_key, idx + 1, ex=86400)
            last = time.monotonic()
    with conn.pipeline() as pipe:
        pipe.delete(progress_key)
        pipe.decrby(keys.items_queued(queue), len(items) - start)
        pipe.execute()
    return counts


def _run_one(fn: Callable, function: str, item: list, conn, queue: str) -> str:
    item_id, kwargs, attempts = item[0], item[1], (item[2] if len(item) > 2 else 0) + 1
    try:
        try:
            fn(**kwargs)
        except RetryableError:  # transient: retry in place with backoff before deferring
            TRANSIENT.call(lambda: fn(**kwargs))
        return "done"
    except FatalError as exc:
        return _fail(conn, queue, function, item_id, kwargs, attempts, exc)
    except Exception as exc:  # noqa: BLE001 - unknown errors get a bounded retry
        if attempts >= MAX_ITEM_ATTEMPTS:
            return _fail(conn, queue, function, item_id, kwargs, attempts, exc)
        _defer(conn, queue, function, [item_id, kwargs, attempts], attempts)
        return "deferred"


def _fail(conn, queue: str, function: str, item_id: str, kwargs: dict, attempts: int,
          exc: BaseException) -> str:
    record = {"function": function, "kwargs": kwargs, "attempts": attempts,
              "error": f"{type(exc).__name__}: {exc}"[:1000], "at": time.time()}
    conn.hset(keys.failed_items(queue), item_id, json.dumps(record))
    return "failed"


def _defer(conn, queue: str, function: str, item: list, attempts: int) -> None:
    from jobs.queue import enqueue_later
    enqueue_later(conn, queue, function, [item], delay=min(600, 5 * 2 ** (attempts - 1)))
