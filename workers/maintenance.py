"""Farm-wide housekeeping, run by the supervisors every few seconds, one at a time per queue.

Only the farm's own queues (those the supervisor's workers serve) are touched,
always through ``FarmJob``, so another application's jobs in the same Redis
are never moved, and no callback a job names is ever imported.

- rq's own registry cleanup: jobs of dead workers (their heartbeat stopped) are
  delivered again (every farm job carries an rq ``Retry``: its delivery budget,
  ``jobs.queue.envelope``) or moved to failed.
- jobs taken and never started: a worker killed between taking a job off the queue and
  starting it leaves the job in rq's intermediate list, held (no redispatch) and never run;
  one seen there unstarted for a minute is delivered again (``redeliver_stuck``).
- rq's scheduler step: delayed retries and throttled chunks whose time came
  are moved back onto their queues.
- settling: jobs that failed for good are recorded in ``farm failed``.
- lost jobs: a slice a round of the jobs whose items are counted as queued is looked at;
  one whose rq hash is gone or is not a hash is reaped (``jobs.lost``): its items found in
  the dedup index, a slice a round, and within a pass of it counted out and recorded in
  ``farm failed``.
- the ledger: chunks whose lease expired go back to ``pending`` (paused runs too),
  and every ``REDISPATCH_SECONDS`` each pending chunk of a running, unpaused run
  that has no live job gets one (at most one job per chunk in Redis).

Whatever is written into Redis: a job whose hash is unreadable (``jobs.farmjob``) is
refused on every path, a job a step cannot handle is a warning while the step goes on
with the others, and a step that fails does not stop the scope's later steps (unless a
server is unreachable or not set up: they would meet the same trouble).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import redis
from redis.client import Pipeline
from redis.commands.core import Script
from rq import Queue
from rq.intermediate_queue import IntermediateQueue
from rq.job import JobStatus
from rq.job_lifecycle import record_job_failure
from rq.registry import clean_registries

from farmcore import keys
from jobs import lost, settle
from jobs.dispatch import dispatch_lost
from jobs.farmjob import FarmJob
from jobs.policy import ForbiddenJobError
from jobs.queue import rq_queue
from jobs.runtime import Runtime
from shardfarm.errors import FarmError

log = logging.getLogger(__name__)
LOCK_SECONDS = 4
REDISPATCH_SECONDS = 30
REPEAT_SECONDS = 60.0
STUCK_SECONDS = 60.0  # rq's own: a job taken and not started a minute later was abandoned
STUCK_SLICE = 1000
MAX_TOPICS = 1000
_said: dict[str, tuple[str, float]] = {}
# Lua: deletes ``key`` unless it is a lock or lease some holder wrote, a string expiring
# within ``longest`` ms (another type, no expiry, or a longer life: whatever was written into
# Redis), so that a ``SET NX`` can take it; else no holder would take it again. Shared with
# the cron leader lease (``workers.cron``).
CLEAR_FORGED = b"""
local function clear_forged(key, longest)
  local t = redis.call('TYPE', key).ok
  if t == 'none' then return end
  local ttl = t == 'string' and redis.call('PTTL', key) or -1
  if ttl < 0 or ttl > longest then redis.call('DEL', key) end
end
"""
# KEYS[1]: a housekeeping lock; ARGV: owner, milliseconds. Takes it if free (or held by what
# no housekeeper wrote: ``CLEAR_FORGED``, no longer than the lock's own life).
_TAKE = Script(None, CLEAR_FORGED + b"""
clear_forged(KEYS[1], tonumber(ARGV[2]))
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
return 0
""")


def promote_scheduled(conn: redis.Redis, queue: Queue) -> int:
    """Move due jobs of ``queue``'s scheduled registry back onto the queue; returns how many.

    rq's own scheduler does the same, but as a separate process with its own locks and
    rq's base ``Job`` class; here it is one housekeeping step through the farm's job
    class, with rq's public ``Queue.enqueue_job`` (farm jobs never have dependencies,
    so it enqueues at once). Each job moves in its own transaction (one round trip a due
    job): one that cannot be enqueued (an unreadable hash, a field rq refuses) is failed
    instead, with the reason, and settled into ``farm failed`` by the step that follows.
    """
    registry = queue.scheduled_job_registry
    ids = registry.get_jobs_to_schedule()
    if not ids:
        return 0
    jobs = dict(zip(ids, queue.job_class.fetch_many(ids, connection=conn,
                                                   serializer=queue.serializer), strict=True))
    return _each("promote", queue.name, ids, lambda job_id: _promote(queue, job_id, jobs[job_id]))


def _promote(queue: Queue, job_id: str, job: FarmJob | None) -> bool:
    with queue.connection.pipeline() as pipe:
        if job is not None:
            _enqueue_or_fail(queue, job, pipe)
        queue.scheduled_job_registry.remove(job_id, pipeline=pipe)
        pipe.execute()
    return True


def _enqueue_or_fail(queue: Queue, job: FarmJob, pipe: Pipeline) -> None:
    try:
        if job.unreadable:
            raise ForbiddenJobError(job.unreadable)
        queue.enqueue_job(job, pipeline=pipe, at_front=job.should_enqueue_at_front())
    except Exception as exc:  # noqa: BLE001 - whatever was written into the job's hash
        pipe.reset()
        log.error("refusing scheduled job %s of queue %s: %s", job.id, queue.name, exc)
        job.retries_left = 0
        record_job_failure(job, f"{type(exc).__name__}: {exc}", pipe)


def redeliver_stuck(conn: redis.Redis, queue: Queue) -> int:
    """Deliver again the jobs a worker took off ``queue`` and died with before starting them;
    returns how many.

    rq moves a job it takes into the queue's intermediate list, and from there into the
    started registry when the job starts. A worker killed in between leaves the job there:
    held by a live job, so no chunk redispatch, and never run (rq's workers look there only
    every maintenance interval, ten minutes). A job found there unstarted ``STUCK_SECONDS``
    after it was first seen (rq's own mark: a live worker starts its job within
    milliseconds) is delivered again while its rq ``Retry`` budget lasts, else failed and
    settled into ``farm failed`` by the step that follows; an entry whose job is gone, ran
    or started is dropped (a job that started and died is the started registry's). A round
    looks at the first ``STUCK_SLICE`` entries (and as many jobs in the started registry),
    whatever is written there.
    """
    inter = queue.intermediate_queue
    ids = [i.decode(errors="replace") for i in conn.lrange(inter.key, 0, STUCK_SLICE - 1)]
    if not ids:
        return 0
    started = set(queue.started_job_registry.get_job_ids(0, STUCK_SLICE - 1, cleanup=False))
    return _each("redeliver", queue.name, [i for i in ids if i not in started],
                 lambda job_id: _redeliver(queue, job_id))


def _redeliver(queue: Queue, job_id: str) -> bool:
    inter = queue.intermediate_queue
    mark = inter.get_first_seen_key(job_id)
    with queue.connection.pipeline() as pipe:
        # one of two housekeepers at the entry goes on, and none once a worker starts the job
        pipe.watch(mark, queue.job_class.key_for(job_id))
        job = queue.fetch_job(job_id)
        if job is not None and not _abandoned(inter, job_id):
            return False
        # else the job ran or moved on, or started (its registry entry says whether it lives)
        stuck = job is not None and bool(job.unreadable
                                         or job.get_status(refresh=False) == JobStatus.QUEUED)
        again = stuck and bool(job.retries_left) and not job.unreadable
        pipe.multi()
        if again:
            _deliver_again(queue, job, pipe)
        elif stuck:
            record_job_failure(job, "its worker died after taking it off the queue, before "
                               "starting it, and it has no deliveries left", pipe)
        pipe.lrem(inter.key, 1, job_id)
        pipe.delete(mark)
        try:
            pipe.execute()
        except redis.WatchError:
            return False
    if stuck:
        log.warning("job %s of queue %s: its worker died after taking it, before starting it; "
                    "%s", job_id, queue.name, "delivered again" if again else "failed")
    return stuck


def _deliver_again(queue: Queue, job: FarmJob, pipe: Pipeline) -> None:
    """rq's ``Job.retry`` with every write in ``pipe`` (rq's writes the job's status outside
    the pipeline, which would break the transaction that watches the job)."""
    interval = job.get_retry_interval()
    job.retries_left -= 1
    if interval:
        queue.schedule_job(job, datetime.now(UTC) + timedelta(seconds=interval),
                           pipeline=pipe)
    else:
        queue.enqueue_job(job, pipeline=pipe)


def _abandoned(inter: IntermediateQueue, job_id: str) -> bool:
    """Whether the job was first seen here, unstarted, ``STUCK_SECONDS`` ago. Marked now if
    not marked; a mark that is not a time (written by anyone) is made anew, so at worst a
    job waits a minute more. A worker starting the job deletes its mark
    (``FarmWorker.prepare_job_execution``): a later take of the same job is timed afresh."""
    key = inter.get_first_seen_key(job_id)
    if inter.set_first_seen(job_id):
        return False
    try:
        return time.time() - float(inter.connection.get(key)) >= STUCK_SECONDS
    except (TypeError, ValueError, redis.ResponseError):
        inter.connection.delete(key)
        inter.set_first_seen(job_id)
        return False


def settle_failed(conn: redis.Redis, queue: str) -> int:
    """Settle every job of ``queue``'s failed registry into ``farm failed``; returns how many
    this call settled. Those whose data is gone are marked lost for the sweep's scan of the
    dedup index (``jobs.lost``), which counts them out and records their items."""
    ids = rq_queue(conn, queue).failed_job_registry.get_job_ids()
    gone = lost.counting(conn, queue, lost.not_hashes(conn, ids))
    lost.reap_jobs(conn, queue, gone, isolate=True)
    return _each("settle", queue, ids, lambda job_id: settle.settle_job(conn, queue, job_id))


def _each(what: str, queue: str, ids: list[str], step: Callable[[str], bool]) -> int:
    """``step`` for each job of ``ids``; returns for how many it did something. A job it fails
    on (whatever was written into Redis) is a warning a minute while the others go on; a
    lost connection stops the round."""
    n = 0
    for job_id in ids:
        try:
            n += step(job_id)
        except (redis.ConnectionError, redis.TimeoutError):
            raise
        except Exception as exc:  # noqa: BLE001 - one bad entry must not stop the others
            say(f"{what}:{queue}:{job_id}", f"housekeeping cannot {what} job {job_id} of "
                f"queue {queue}: {type(exc).__name__}: {str(exc)[:200]}")
    return n


def expire_leases(rt: Runtime) -> int:
    """Chunks whose lease expired (their worker is gone) go back to ``pending``, paused runs'
    included; the next ``redispatch_lost`` gives them a job (unpausing, for a paused run)."""
    n = rt.ledger.expire_leases()
    if n:
        log.warning("%d chunk(s) lost their worker (lease expired); pending again", n)
    return n


def redispatch_lost(rt: Runtime) -> int:
    """Give a job to every pending chunk of a running, unpaused run that has no live job
    (its job was used up, lost with Redis, or never written): at most one per chunk."""
    n = 0
    for run_id, chunk_ids in rt.ledger.dispatchable().items():
        sent = dispatch_lost(rt.redis, rt.ledger.run(run_id), chunk_ids)
        if sent:
            log.warning("dispatched %d pending chunk(s) of %s that had no job", sent, run_id)
        n += sent
    return n


def _redispatch_due(rt: Runtime, owner: str) -> int:
    """``redispatch_lost``, at most once every ``REDISPATCH_SECONDS`` farm-wide."""
    if not take_lock(rt.redis, "maintenance:redispatch", owner, REDISPATCH_SECONDS):
        return 0
    return redispatch_lost(rt)


def _queue_steps(rt: Runtime, name: str) -> list[Callable[[], object]]:
    q = rq_queue(rt.redis, name)
    return [lambda: clean_registries(q), lambda: redeliver_stuck(rt.redis, q),
            lambda: promote_scheduled(rt.redis, q),
            lambda: settle_failed(rt.redis, name), lambda: lost.sweep(rt.redis, name)]


def take_lock(conn: redis.Redis, name: str, owner: str, seconds: float) -> bool:
    """Take the housekeeping lock ``keys.leader(name)`` for ``seconds`` if it is free (or holds
    what no housekeeper wrote: see ``_TAKE``); whether this process took it."""
    return bool(_TAKE(keys=[keys.leader(name)], args=[owner, int(seconds * 1000)],
                      client=conn))


def run_once(rt: Runtime, owner: str, queues: list[str]) -> bool:
    """One round of housekeeping for each of ``queues`` (and the ledger) whose lock this
    process wins; returns whether it did any."""
    did = False
    ledger_steps = [lambda: expire_leases(rt), lambda: _redispatch_due(rt, owner)]
    for scope, steps in [*((f"queue:{q}", _queue_steps(rt, q)) for q in queues),
                         ("ledger", ledger_steps)]:
        if not take_lock(rt.redis, f"maintenance:{scope}", owner, LOCK_SECONDS):
            continue
        did = True
        for i, step in enumerate(steps):
            if not _guarded(f"{scope}#{i}", step):
                break  # servers unreachable or not set up: the later steps would be too
    return did


def _guarded(scope: str, step: Callable[[], object]) -> bool:
    """Run a step; an operator-fixable error is one log line (repeated once a minute while it
    lasts), anything else a traceback. Returns whether the scope's later steps may run: not
    when a server is unreachable or not set up, but after any other failure (a bad entry one
    step cannot handle must not stop the others: failed jobs still settle, due jobs move)."""
    try:
        step()
    except FarmError as exc:
        say(scope, f"housekeeping waits: {exc}")  # a database not set up says what to run
        return False
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        say(scope, f"housekeeping waits: Redis: {exc}")
        return False
    except redis.RedisError as exc:
        say(scope, f"housekeeping step {scope} failed: Redis: {exc}")
    except Exception:
        log.exception("housekeeping step of %s failed", scope)
    else:
        _said.pop(scope, None)
    return True


def say(topic: str, message: str) -> None:
    """Log ``message`` as one warning, unless the same was said about ``topic`` within a
    minute."""
    if len(_said) > MAX_TOPICS:  # per-job topics: bounded, whatever is written into Redis
        _said.clear()
    last = _said.get(topic)
    if last and last[0] == message and time.monotonic() - last[1] < REPEAT_SECONDS:
        return
    _said[topic] = (message, time.monotonic())
    log.warning("%s", message)
