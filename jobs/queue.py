"""Mass enqueue: items grouped into rq jobs that carry many items, deduplicated per item.

Why: an rq job costs ~530 bytes of Redis and ~3 commands to enqueue; a script
that pushes millions of small items cannot pay that per item. Items are streamed
from any iterable, given a deterministic ID and packed ``batch`` at a time into
one rq job (rq's JSON serializer, no stored result) that ``jobs.items.run_items``
unpacks. Each job is committed by one Lua script together with its items'
dedup entries and the queued-items counter (``jobs.accounting``): an item is
a duplicate only while an earlier copy is queued or running.
"""

from __future__ import annotations

import hashlib
import itertools
import secrets
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta

import orjson
import redis
from rq import Queue, Retry
from rq.serializers import JSONSerializer

from jobs import accounting
from jobs.dequeue import FarmQueue
from jobs.farmjob import FarmJob
from jobs.policy import ENTRY_POINT, JobPolicy
from shardfarm.errors import FatalError

JOB_RETRIES = 3  # deliveries of a batch job after its worker died or its time ran out
# rq takes fixed intervals, not a formula: spread over about two and a half minutes, so a
# short outage (a server restarting) does not use up a batch's re-deliveries
RETRY_INTERVALS = (5, 30, 120)
FAILURE_TTL = 7 * 24 * 3600
JOB_TIMEOUT = 3600
JOBS_PER_ROUND_TRIP = 50


@dataclass
class EnqueueResult:
    """How many items were enqueued and how many were already in flight."""

    enqueued: int = 0
    duplicates: int = 0

    def as_dict(self) -> dict[str, int]:
        """The JSON shape ``farm enqueue`` prints."""
        return {"enqueued": self.enqueued, "duplicates": self.duplicates}


def check_function(dotted: str, policy: JobPolicy | None = None) -> str:
    """Refuse, in one line, a function the workers would not run (the name is checked before
    anything is imported), or one that cannot be imported."""
    (policy or JobPolicy.from_env()).load_item(dotted)
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
    """An rq ``Queue`` with the JSON serializer, the farm's guarded job class and its take off
    several queues (``jobs.dequeue``)."""
    return FarmQueue(name, connection=conn, serializer=JSONSerializer, job_class=FarmJob)


def envelope(function: str, items: list[list], timeout: int = JOB_TIMEOUT,
             retries: int = JOB_RETRIES) -> dict:
    """``Queue.prepare_data`` keyword arguments of one rq job carrying ``items``.

    rq's ``Retry`` is the job's delivery budget, not an attempt count of its items
    (those live in the item records, ``jobs.items``): rq delivers the job again, from
    its checkpoint, at most ``retries`` more times after its worker died or its time
    ran out (no farm code runs then to do it), and then it is settled.
    """
    retry = Retry(max=retries, interval=list(RETRY_INTERVALS[:retries])) if retries else None
    return {"kwargs": {"function": function, "items": items},
            "description": f"{function} x{len(items)}",
            "result_ttl": 1, "failure_ttl": FAILURE_TTL, "timeout": timeout, "retry": retry}


def new_job_id() -> str:
    """A 64-bit random job ID: each in-flight item's dedup entry holds one, so it is short."""
    return secrets.token_hex(8)


def _recorded(conn: redis.Redis, make: Callable[[redis.client.Pipeline], object]) -> list[tuple]:
    """The commands rq issues for one job, recorded from a pipeline that is never sent."""
    rec = conn.pipeline(transaction=False)
    make(rec)
    commands = [args for args, _ in rec.command_stack]
    rec.reset()
    return commands


def _job_writes(q: Queue, function: str, items: list[list],
                options: dict) -> tuple[str, list[tuple]]:
    data = Queue.prepare_data(ENTRY_POINT, **envelope(function, items, **options),
                              job_id=new_job_id())
    jobs: list = []
    commands = _recorded(q.connection, lambda rec: jobs.extend(q.enqueue_many([data],
                                                                              pipeline=rec)))
    return jobs[0].id, commands


def enqueue_later(conn: redis.Redis, queue: str, function: str, items: list[list],
                  delay: float, *, holder: str = "", timeout: int = JOB_TIMEOUT) -> str | None:
    """Schedule one rq job carrying ``items`` ``delay`` seconds from now; returns its ID, or
    None when another live job already carries one of the items (nothing is written).

    ``holder``: the job the items come from (a deferral), whose dedup entries move along.
    """
    q, env = rq_queue(conn, queue), envelope(function, items, timeout=timeout)
    jobs: list = []
    commands = _recorded(conn, lambda rec: jobs.append(q.enqueue_in(
        timedelta(seconds=max(1.0, delay)), ENTRY_POINT, **env["kwargs"], pipeline=rec,
        job_id=new_job_id(),
        job_timeout=env["timeout"], result_ttl=env["result_ttl"],
        failure_ttl=env["failure_ttl"], retry=env["retry"], description=env["description"])))
    dups = accounting.commit(conn, queue, jobs[0].id, commands, [i[0] for i in items],
                             len(items), holder=holder)
    return None if dups else jobs[0].id


def _batches(it: Iterable, size: int) -> Iterator[list]:
    it = iter(it)
    while batch := list(itertools.islice(it, size)):
        yield batch


def enqueue_many(queue: str, function: str, kwargs_iterable: Iterable[dict], *,
                 connection: redis.Redis, batch: int = 100, dedup: bool = True,
                 id_key: str | None = None, write_batch: int = 5000,
                 progress: Callable[[int], None] | None = None,
                 policy: JobPolicy | None = None, job_timeout: int = JOB_TIMEOUT,
                 retries: int = JOB_RETRIES,
                 on_ids: Callable[[list[str]], None] | None = None) -> EnqueueResult:
    """Enqueue one call of ``function(**kwargs)`` per item, streaming, in pipelined batches.

    Items are packed ``batch`` per rq job; with ``dedup`` an item whose ID is queued or
    running on this queue is counted as a duplicate instead. A job runs at most
    ``job_timeout`` seconds, and is tried again ``retries`` times after a crash or timeout.
    ``on_ids`` is given the item IDs of each group written (to wait for them: ``itemwait``).
    """
    check_function(function, policy)
    if not 1 <= batch <= 10_000:
        raise FatalError(f"batch {batch} out of range 1..10000")
    if not 1 <= job_timeout <= 7 * 86400 or not 0 <= retries <= len(RETRY_INTERVALS):
        raise FatalError(f"job timeout {job_timeout} s or retries {retries} out of range "
                         f"(1..604800 s, 0..{len(RETRY_INTERVALS)})")
    result = EnqueueResult()
    options = {"timeout": job_timeout, "retries": retries}
    for group in _batches(kwargs_iterable, write_batch):
        items = [[item_id(function, kw, id_key), kw] for kw in _check_items(group)]
        _add(result, enqueue_items(connection, queue, function, items, batch=batch,
                                   dedup=dedup, options=options))
        if on_ids:
            on_ids([i[0] for i in items])
        if progress:
            progress(len(group))
    return result


def _add(total: EnqueueResult, part: EnqueueResult) -> None:
    total.enqueued += part.enqueued
    total.duplicates += part.duplicates


def enqueue_items(conn: redis.Redis, queue: str, function: str, items: Sequence[list], *,
                  batch: int = 100, dedup: bool = True,
                  options: dict | None = None) -> EnqueueResult:
    """Commit ``[item_id, kwargs]`` items, ``batch`` per rq job (the function is not checked
    here: callers check it once). ``options``: ``envelope``'s timeout and retries."""
    result = EnqueueResult()
    if dedup:
        seen: set[str] = set()
        unique = [i for i in items if not (i[0] in seen or seen.add(i[0]))]
        result.duplicates, items = len(items) - len(unique), unique
    q = rq_queue(conn, queue)
    pending = [list(items[i:i + batch]) for i in range(0, len(items), batch)]
    while pending:
        round_, pending = pending[:JOBS_PER_ROUND_TRIP], pending[JOBS_PER_ROUND_TRIP:]
        with conn.pipeline(transaction=False) as pipe:
            for chunk in round_:
                job_id, commands = _job_writes(q, function, chunk, options or {})
                accounting.commit(conn, queue, job_id, commands,
                                  [i[0] for i in chunk] if dedup else [], len(chunk), pipe=pipe)
            replies = pipe.execute()
        for chunk, dups in zip(round_, replies, strict=True):
            if not dups:
                result.enqueued += len(chunk)
                continue
            gone = {d.decode() if isinstance(d, bytes) else d for d in dups}
            result.duplicates += len(gone)
            rest = [i for i in chunk if i[0] not in gone]
            if rest:  # commit the others in a job of their own
                pending.append(rest)
    return result


def _check_items(group: list) -> list[dict]:
    for kw in group:
        if not isinstance(kw, dict):
            raise FatalError("each item must be a JSON object of keyword arguments, "
                             f"got {kw!r:.80}")
    return group
