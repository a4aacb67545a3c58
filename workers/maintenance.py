"""Farm-wide housekeeping, run by one supervisor at a time every few seconds.

- rq's own registry cleanup: jobs of dead workers (their heartbeat stopped) are
  retried (every farm job carries an rq ``Retry``) or moved to failed.
- rq's scheduler step: delayed retries and throttled chunks whose time came
  are moved back onto their queues.
- the ledger: chunks whose lease expired are dispatched again.
"""

from __future__ import annotations

import logging
from collections import defaultdict

import redis
from rq import Queue
from rq.registry import ScheduledJobRegistry, clean_registries
from rq.serializers import JSONSerializer

from jobs.dispatch import dispatch
from jobs.runtime import Runtime
from shardfarm import keys

log = logging.getLogger(__name__)
LOCK_SECONDS = 4


def _queues(conn: redis.Redis) -> list[Queue]:
    return Queue.all(connection=conn, serializer=JSONSerializer)


def promote_scheduled(conn: redis.Redis, queue: Queue) -> int:
    """Move due jobs of ``queue``'s scheduled registry back onto the queue; returns how many."""
    registry = ScheduledJobRegistry(queue=queue, serializer=JSONSerializer)
    ids = registry.get_jobs_to_schedule()
    if not ids:
        return 0
    jobs = queue.job_class.fetch_many(ids, connection=conn, serializer=JSONSerializer)
    with conn.pipeline() as pipe:
        for job_id, job in zip(ids, jobs, strict=True):
            if job is not None:
                queue._enqueue_job(job, pipeline=pipe, at_front=job.should_enqueue_at_front())
            registry.remove(job_id, pipeline=pipe)
        pipe.execute()
    return len(ids)


def redispatch_expired(rt: Runtime) -> int:
    """Dispatch again every running chunk whose lease expired (its worker is gone)."""
    by_run: dict[str, list[int]] = defaultdict(list)
    for run_id, chunk_id in rt.ledger.expired():
        by_run[run_id].append(chunk_id)
    n = 0
    for run_id, chunk_ids in by_run.items():
        n += dispatch(rt.redis, rt.ledger.run(run_id)["queue"], run_id, chunk_ids)
        log.warning("re-dispatched %d chunk(s) of %s whose lease expired", len(chunk_ids), run_id)
    return n


def run_once(rt: Runtime, owner: str) -> bool:
    """One round of housekeeping if this process wins the lock; returns whether it ran."""
    conn = rt.redis
    if not conn.set(keys.leader("maintenance"), owner, nx=True, ex=LOCK_SECONDS):
        return False
    for step in (_clean, _promote, redispatch_expired):
        try:
            step(rt)
        except Exception:
            log.exception("maintenance step %s failed", step.__name__)
    return True


def _clean(rt: Runtime) -> None:
    for q in _queues(rt.redis):
        clean_registries(q)


def _promote(rt: Runtime) -> None:
    for q in _queues(rt.redis):
        promote_scheduled(rt.redis, q)
