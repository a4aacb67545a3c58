"""Mass enqueue: items grouped into rq jobs that carry many items, deduplicated per item.

Why: an rq job costs ~530 bytes of Redis and ~3 commands to enqueue; a script
that pushes millions of small items cannot pay that per item. Items are streamed
from any iterable, given a deterministic ID, checked against a per-queue dedup
set by one Lua call per batch, and packed ``batch`` at a time into one rq job
(rq's JSON serializer, no stored result) that ``jobs.items.run_items`` unpacks.
"""

from __future__ import annotations

import hashlib
import importlib
import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta

import orjson
import redis
from rq import Queue, Retry
from rq.serializers import JSONSerializer

from shardfarm import keys
from shardfarm.errors import FatalError

DEDUP_TTL = 7 * 24 * 3600
JOB_RETRIES = Retry(max=3, interval=[5, 30, 120])
FAILURE_TTL = 7 * 24 * 3600
JOB_TIMEOUT = 3600

# KEYS[1] = dedup set; ARGV = item IDs. Returns 1 for each new ID, 0 for a duplicate.
_DEDUP_LUA = """
local out = {}
for i, id in ipairs(ARGV) do out[i] = redis.call('SADD', KEYS[1], id) end
redis.call('EXPIRE', KEYS[1], {ttl})
return out
""".replace("{ttl}", str(DEDUP_TTL))


@dataclass
class EnqueueResult:
    """How many items were enqueued and how many were already there."""

    enqueued: int = 0
    duplicates: int = 0

    def as_dict(self) -> dict[str, int]:
        """The JSON shape ``farm enqueue`` prints."""
        return {"enqueued": self.enqueued, "duplicates": self.duplicates}


def check_function(dotted: str) -> str:
    """Refuse a function name that cannot be imported (fail at enqueue, not on every worker)."""
    module, _, name = dotted.rpartition(".")
    try:
        fn = getattr(importlib.import_module(module), name) if module else None
    except ImportError as exc:
        raise FatalError(f"cannot import {dotted!r}: {exc}") from None
    except AttributeError:
        fn = None
    if not callable(fn):
        raise FatalError(f"{dotted!r} is not an importable function (expected module.function)")
    return dotted


def item_id(function: str, kwargs: dict, key: str | None = None) -> str:
    """Deterministic item ID: the ``key`` argument's value, else a hash of function and kwargs."""
    if key is not None:
        if key not in kwargs:
            raise FatalError(f"item has no {key!r} argument to use as its job ID")
        return str(kwargs[key])
    blob = function.encode() + b"\0" + orjson.dumps(kwargs, option=orjson.OPT_SORT_KEYS)
    return hashlib.blake2b(blob, digest_size=10).hexdigest()


def rq_queue(conn: redis.Redis, name: str) -> Queue:
    """An rq ``Queue`` that always uses the JSON serializer."""
    return Queue(name, connection=conn, serializer=JSONSerializer)


def envelope(function: str, items: list[list], description: str | None = None) -> dict:
    """``Queue.prepare_data`` keyword arguments of one rq job carrying ``items``."""
    return {"kwargs": {"function": function, "items": items},
            "description": description or f"{function} x{len(items)}",
            "result_ttl": 1, "failure_ttl": FAILURE_TTL, "timeout": JOB_TIMEOUT,
            "retry": JOB_RETRIES}


def enqueue_later(conn: redis.Redis, queue: str, function: str, items: list[list],
                  delay: float) -> None:
    """Schedule one rq job carrying ``items`` ``delay`` seconds from now."""
    env = envelope(function, items)
    conn.incrby(keys.items_queued(queue), len(items))
    rq_queue(conn, queue).enqueue_in(
        timedelta(seconds=max(1.0, delay)), "jobs.items.run_items", **env["kwargs"],
        job_timeout=env["timeout"], result_ttl=env["result_ttl"], failure_ttl=env["failure_ttl"],
        retry=env["retry"], description=env["description"])


def _batches(it: Iterable[dict], size: int) -> Iterator[list[dict]]:
    it = iter(it)
    while batch := list(itertools.islice(it, size)):
        yield batch


def enqueue_many(queue: str, function: str, kwargs_iterable: Iterable[dict], *,
                 connection: redis.Redis, batch: int = 100, dedup: bool = True,
                 id_key: str | None = None, write_batch: int = 5000,
                 progress: Callable[[int], None] | None = None) -> EnqueueResult:
    """Enqueue one call of ``function(**kwargs)`` per item, streaming, in pipelined batches.

    Items are packed ``batch`` per rq job; with ``dedup`` an item whose ID was
    enqueued before on this queue is counted as a duplicate instead.
    """
    check_function(function)
    if not 1 <= batch <= 10_000:
        raise FatalError(f"batch {batch} out of range 1..10000")
    q = rq_queue(connection, queue)
    dedup_script = connection.register_script(_DEDUP_LUA)
    result = EnqueueResult()
    for group in _batches(kwargs_iterable, write_batch):
        items = [[item_id(function, kw, id_key), kw] for kw in _check_items(group)]
        if dedup:
            flags = dedup_script(keys=[keys.dedup(queue)], args=[i[0] for i in items])
            fresh = [it for it, new in zip(items, flags, strict=True) if new]
        else:
            fresh = items
        result.duplicates += len(items) - len(fresh)
        _push(q, connection, queue, function, fresh, batch)
        result.enqueued += len(fresh)
        if progress:
            progress(len(group))
    return result


def _check_items(group: list) -> list[dict]:
    for kw in group:
        if not isinstance(kw, dict):
            raise FatalError("each item must be a JSON object of keyword arguments, "
                             f"got {kw!r:.80}")
    return group


def _push(q: Queue, conn: redis.Redis, queue: str, function: str, items: list[list],
          batch: int) -> None:
    if not items:
        return
    datas = [Queue.prepare_data("jobs.items.run_items", **envelope(function, items[i:i + batch]))
             for i in range(0, len(items), batch)]
    with conn.pipeline() as pipe:
        q.enqueue_many(datas, pipeline=pipe)
        pipe.incrby(keys.items_queued(queue), len(items))
        pipe.execute()
