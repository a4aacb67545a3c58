"""rq jobs that failed for good, settled into ``farm failed``: nothing stops silently.

An rq job ends in its queue's failed registry when rq gives up on it: a job
timeout or a crash after the last retry, a worker that died on the last
attempt, a payload that is not JSON, a job the workers refused. ``settle``
takes each such job out of rq's registry exactly once and records what it
carried: every unfinished item of a farm batch (with its arguments, so
``farm retry-failed`` can run it again), or the foreign job itself. The worker
settles the job it just failed; the supervisors' housekeeping settles the rest
(jobs of workers that died, jobs it refused), one by one (``workers.maintenance``).
"""

from __future__ import annotations

import json
import logging
import re
from collections import defaultdict
from contextlib import suppress

import redis
from rq.exceptions import DeserializationError, NoSuchJobError
from rq.job import Job

from farmcore import keys
from jobs import accounting
from jobs.farmjob import FarmJob
from jobs.lost import reap_jobs
from jobs.policy import CHUNK_FUNCTION, ENTRY_POINT, JobPolicy
from jobs.queue import enqueue_items, rq_queue

log = logging.getLogger(__name__)


def reason_of(job: Job) -> str:
    """The last line of rq's record of why the job failed."""
    try:
        result = job.latest_result()
    except Exception:  # noqa: BLE001 - an unreadable result still settles, with a generic reason
        result = None
    text = (getattr(result, "exc_string", None) or "").strip()
    last = re.sub(r"^(?:\w+\.)+(?=\w+:)", "", text.splitlines()[-1] if text else "")
    if "AbandonedJobError" in last:
        return "AbandonedJobError: the worker died while running the job"
    if "DeserializationError" in last:
        return "DeserializationError: payload is not JSON (a pickle?), refused unread"
    return last[:1000] or "rq gave up on the job"


def _records(job: Job, reason: str) -> tuple[int, list, list]:
    """(items the job counts, a record per item in order, records of the job as a whole)."""
    try:
        name, kwargs = job.func_name, job.kwargs
    except DeserializationError:
        return 0, [], [(f"job:{job.id}", accounting.failure("?", None, reason, job_id=job.id))]
    items = kwargs.get("items") if isinstance(kwargs, dict) else None
    if name != ENTRY_POINT or not isinstance(items, list) or not all(
            isinstance(i, list) and len(i) >= 2 and isinstance(i[0], str) for i in items):
        return 0, [], [(f"job:{job.id}", accounting.failure(name, kwargs, reason, job_id=job.id))]
    fn = kwargs.get("function")
    return len(items), [(i[0], accounting.failure(fn, i[1], reason, job_id=job.id,
                                                  attempts=i[2] if len(i) > 2 else 1))
                        for i in items], []


def settle_job(conn: redis.Redis, queue: str, job_id: str) -> bool:
    """Settle one job of ``queue``'s failed registry; ``False`` if another did it first."""
    registry = rq_queue(conn, queue).failed_job_registry.key
    try:
        job = FarmJob.fetch(job_id, connection=conn, serializer=rq_queue(conn, queue).serializer)
    except NoSuchJobError:  # its data is gone (expired, deleted, not a hash): reaped by the
        reap_jobs(conn, queue, [job_id])  # lost-job scan (jobs.lost), which finds its items
        return bool(conn.zrem(registry, job_id))
    total, items, whole = _records(job, job.unreadable or reason_of(job))
    if not accounting.settle(conn, queue, registry, job_id, items, whole):
        return False
    with suppress(redis.RedisError):
        job.delete(remove_from_queue=False)
    log.warning("job %s of queue %s failed for good: %d item(s) recorded in 'farm failed'",
                job_id, queue, max(total, len(whole)))
    return True


def _record(raw: bytes) -> dict:
    """A failure record as ``accounting.failure`` writes it; ``{}`` for anything else (whatever
    was written into Redis: kept, never run)."""
    try:
        doc = json.loads(raw)
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) and isinstance(doc.get("function"), str) else {}


def retry_failed(conn: redis.Redis, queue: str, policy: JobPolicy) -> tuple[int, list[str]]:
    """Enqueue every failed item of ``queue`` again, under its own ID; returns how many, and
    why others stay (a function not allowed here, a whole foreign job, truncated arguments).

    Each item's failure record is removed in the same step that queues it again."""
    by_function: dict[str, list[list]] = defaultdict(list)
    kept: list[str] = []
    try:
        records = conn.hgetall(keys.failed_items(queue))
    except redis.ResponseError:  # not a hash (written into Redis): it holds no record
        return 0, [f"queue {queue}: {keys.failed_items(queue)} is not the farm's (not a hash)"]
    for raw_id, raw in records.items():
        item, doc = raw_id.decode(errors="replace"), _record(raw)
        fn, kwargs = doc.get("function"), doc.get("kwargs")
        why = ("its failure record is not the farm's" if not doc else
               "a whole job, not a farm item" if item.startswith("job:") else
               "its arguments were lost with its job" if kwargs is None else
               "its arguments were too large to keep" if not isinstance(kwargs, dict)
               or "_truncated" in kwargs else policy.item_refusal(fn))
        if why:
            kept.append(f"queue {queue} item {item}: {why}")
        else:
            by_function[fn].append([item, kwargs])
    n = 0
    for fn, items in by_function.items():
        batch = 1 if fn == CHUNK_FUNCTION else 100
        n += enqueue_items(conn, queue, fn, items, batch=batch).enqueued
    return n, kept
