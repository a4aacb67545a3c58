"""Jobs whose data went from Redis while their items were counted as queued.

Whoever can write to Redis can delete an rq job's hash or overwrite it with
something that is not a hash, and Redis itself can lose it (eviction, a partial
restore). rq then takes the job for no job: a worker skips its ID, registries drop
it. Its items must not stay counted, nor block their IDs, nor be waited for for
ever: every job that counts items is in ``keys.job_items``, and housekeeping sweeps
it, a slice a round, for jobs that are no longer a hash; each is reaped
(``jobs.accounting.reap``): its items counted out and recorded in ``farm failed``
("job data lost or overwritten in Redis"), by ID when the dedup index still names
them, else as one record of the job saying how many. The reap is one Lua script
that checks again that the job is not a hash and still counts items, so a job that
finishes while it is looked at is never counted twice.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable

import redis

from farmcore import keys
from jobs.accounting import DEDUP_BUCKETS, JOB_PREFIX, reap

log = logging.getLogger(__name__)
SWEEP_SLICE = 1000  # jobs looked at per housekeeping round and queue
SCAN_ROUND = 1024   # dedup buckets read per round trip when a loss is found


def holders(conn: redis.Redis, queue: str, job_ids: set[str]) -> dict[str, list[str]]:
    """The item IDs whose dedup entry names each of ``job_ids`` (reads the whole dedup index
    of ``queue``, ``SCAN_ROUND`` buckets a round trip: for losses, which are rare)."""
    out: dict[str, list[str]] = defaultdict(list)
    for start in range(0, DEDUP_BUCKETS, SCAN_ROUND):
        with conn.pipeline(transaction=False) as pipe:
            for bucket in range(start, min(start + SCAN_ROUND, DEDUP_BUCKETS)):
                pipe.hgetall(keys.inflight(queue, bucket))
            for entries in pipe.execute():
                for item, job in entries.items():
                    if (job_id := job.decode()) in job_ids:
                        out[job_id].append(item.decode())
    return dict(out)


def not_hashes(conn: redis.Redis, job_ids: Iterable[str]) -> list[str]:
    """Those of ``job_ids`` whose rq job key is missing or not a hash (one round trip)."""
    job_ids = list(job_ids)
    with conn.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.type(JOB_PREFIX + job_id)
        kinds = pipe.execute()
    return [j for j, kind in zip(job_ids, kinds, strict=True) if kind != b"hash"]


def counting(conn: redis.Redis, queue: str, job_ids: list[str]) -> list[str]:
    """Those of ``job_ids`` that still count items on ``queue`` (one round trip)."""
    if not job_ids:
        return []
    entries = conn.hmget(keys.job_items(queue), job_ids)
    return [j for j, entry in zip(job_ids, entries, strict=True) if entry is not None]


def reap_jobs(conn: redis.Redis, queue: str, job_ids: list[str],
              candidates: dict[str, list[str]] | None = None, *, isolate: bool = False) -> int:
    """Reap each of ``job_ids`` (``candidates``: item IDs each may carry; read from the dedup
    index when not given); returns how many items were counted out. A job one of whose keys
    holds what the reap cannot read is left as it was: with ``isolate`` (housekeeping) it is
    logged and the others are reaped, else the error is raised (a wait then ends with it,
    instead of waiting for ever for items no reap can free)."""
    if not job_ids:
        return 0
    if candidates is None:
        candidates = holders(conn, queue, set(job_ids))
    n = 0
    for job_id in job_ids:
        try:
            lost, named = reap(conn, queue, job_id, candidates.get(job_id, []))
        except redis.ResponseError as exc:  # a key of it holds what the script cannot read
            if not isolate:
                raise
            log.error("job %s of queue %s cannot be reaped: %s", job_id, queue, exc)
            continue
        if lost > 0 or named:
            log.error("job %s of queue %s: its data was lost or overwritten in Redis; "
                      "%d item(s) counted out, recorded in 'farm failed'",
                      job_id, queue, max(lost, named))
        n += max(lost, 0)
    return n


def sweep(conn: redis.Redis, queue: str, limit: int = SWEEP_SLICE) -> int:
    """Look at about ``limit`` more jobs of ``queue`` that count items, from where the last
    sweep stopped, and reap those whose data is gone; returns how many items were counted
    out."""
    cursor, entries = conn.hscan(keys.job_items(queue), _cursor(conn, queue), count=limit)
    conn.set(keys.lost_sweep(queue), cursor)
    return reap_jobs(conn, queue, not_hashes(conn, (k.decode() for k in entries)), isolate=True)


def _cursor(conn: redis.Redis, queue: str) -> int:
    """Where the sweep resumes; from the start when what is stored is not a cursor Redis
    would take (whoever can write to Redis must not stop the sweep for good)."""
    try:
        raw = conn.get(keys.lost_sweep(queue)) or b"0"
    except redis.ResponseError:  # not a string: the next SET replaces it
        return 0
    return int(raw) if raw.isdigit() and int(raw) < 1 << 64 else 0
