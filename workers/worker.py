"""The farm's worker: rq's ``SimpleWorker`` (no fork per job, connections reused across jobs)
with the JSON serializer, heartbeats during long jobs, and trimmed per-job bookkeeping.

Run one with ``python -m workers.worker --queues farm``; ``farm workers`` supervises many.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import redis
from rq import SimpleWorker
from rq.exceptions import DeserializationError, StopRequested
from rq.job import Job, JobStatus
from rq.queue import Queue
from rq.serializers import JSONSerializer

from jobs import runtime, settle, tally
from jobs.dequeue import FarmQueue
from jobs.farmjob import FarmJob, job_refusal
from jobs.policy import FARM_HANDLERS, ForbiddenJobError, add_operator_path
from jobs.queue import rq_queue
from jobs.status import worker_name
from shardfarm import log as farm_log
from shardfarm.errors import FarmError
from shardfarm.lists import queues
from shardfarm.redact import redact, redact_url
from shardfarm.retry import NO_RETRY
from shardfarm.settings import Settings
from workers import burst
from workers.metrics import report_job
from workers.outage import is_outage, outage_said

log = logging.getLogger(__name__)
HEARTBEAT_SECONDS = 5
HEARTBEAT_GRACE = 10
WORKER_TTL = 30
IDLE_BOOKKEEPING_SECONDS = 2.0
# a job's status after it ran, as ``jobs.tally`` notes it (scheduled or queued: rq tries it
# again; any other, stopped or cancelled, did not do its work)
JOB_ENDS = {JobStatus.FINISHED: tally.DONE, JobStatus.FAILED: tally.FAILED,
            JobStatus.SCHEDULED: tally.RETRYING, JobStatus.QUEUED: tally.RETRYING}


class FarmWorker(SimpleWorker):
    """A SimpleWorker whose started-registry entry expires ~15 s after its process dies, and
    which takes jobs off several queues as off one (``jobs.dequeue``).

    A thread refreshes the worker's and the job's heartbeat every few seconds while
    a job runs, so a live long job is never taken for abandoned, and a dead
    worker's job is found (and retried by rq's registry cleanup) within seconds.
    """

    def __init__(self, queues: list[Queue], connection: redis.Redis, **kwargs) -> None:
        kwargs.setdefault("worker_ttl", WORKER_TTL)
        kwargs.setdefault("job_monitoring_interval", HEARTBEAT_SECONDS)
        kwargs.setdefault("queue_class", FarmQueue)
        super().__init__(queues, connection=connection, serializer=JSONSerializer,
                         job_class=FarmJob, **kwargs)
        self._last_suspension_check = 0.0
        self.ended_as_asked = False  # stopped by a signal, or a burst with nothing left
        self._waiting = False  # waiting out a Redis outage (``_wait_out``)
        self.broke = False  # a job's execution or a dequeue raised, or a job's end went unrecorded

    def request_stop(self, signum: int, frame: object) -> None:
        """rq's warm stop (SIGINT, SIGTERM), noted: the loop then ends as asked. While a
        Redis outage is waited out (``_wait_out``) it is not raised where the signal lands (inside
        a log call, logging would swallow it): the wait ends at its next step."""
        self.ended_as_asked = True
        try:
            super().request_stop(signum, frame)
        except StopRequested:
            if not self._waiting:
                raise

    def exit_status(self) -> int:
        """The process's exit status once ``work()`` returned: 0 when its loop ended as
        asked (a stop, or a burst that found no job left), 1 when rq ended it on an error
        (an exception nothing handled, a Redis that timed out; also after a stop was asked,
        as a job's bookkeeping fails), which rq logs and then returns as if it had ended
        well: a burst whose worker quit so is not a burst that did its work; 1 too when a
        job's end went unrecorded (``execute_job``), though the worker went on. A burst
        suspended by ``rq suspend`` (rq: "there could still be unfinished jobs on the
        queue") ends 1 too."""
        return 0 if self.ended_as_asked and not self.broke else 1

    def get_heartbeat_ttl(self, job: Job, working_time: float = 0.0) -> int:
        """Short TTL: the heartbeat thread renews it while the job is alive."""
        return HEARTBEAT_SECONDS + HEARTBEAT_GRACE

    def prepare_job_execution(self, job: Job, remove_from_intermediate_queue: bool = False
                              ) -> None:
        """rq's; the job leaves its queue's intermediate list however many queues the worker
        serves (rq leaves it there for a worker of several: it took the job by ``BLPOP``,
        ``FarmQueue`` takes it into the list)."""
        super().prepare_job_execution(job, remove_from_intermediate_queue=True)
        # housekeeping's first sight of it there (``redeliver_stuck``): a later take of the
        # same job (delivered again) is timed afresh, not taken for abandoned at once
        mark = rq_queue(self.connection, job.origin).intermediate_queue.get_first_seen_key
        self.connection.delete(mark(job.id))

    def dequeue_job_and_maintain_ttl(self, timeout: int | None,
                                     max_idle_time: int | None = None
                                     ) -> tuple[Job, Queue] | None:
        """rq's, riding out a Redis that refuses writes (``workers.outage.unwritable``: a
        failover's demoted master, which also unblocks a waiting dequeue with an error) or
        does not answer before rq's own wait begins (its first write, the worker's state), as
        rq rides out one that does not answer while it waits: tried again after a growing
        pause, each pause said (rq let the error end the worker)."""
        wait = 1.0
        while True:
            try:
                taken = super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
                self.ended_as_asked = self.ended_as_asked or taken is None  # a burst's end
                return taken
            except redis.RedisError as exc:
                if not is_outage(exc):
                    self.broke = True
                    raise
                self._wait_out(exc, wait)
                wait = min(wait * self.exponential_backoff_factor,
                           self.max_connection_wait_time)

    def _wait_out(self, exc: redis.RedisError, wait: float) -> None:
        """Say the outage, then pause ``wait`` seconds; a stop asked meanwhile ends the
        pause at once (``StopRequested``, raised here and not inside the log call)."""
        self._waiting = True
        try:
            log.warning("Redis %s (%s); trying again in %.0f s", outage_said(exc),
                        redact(str(exc)), wait)
            until = time.monotonic() + wait
            while not self.ended_as_asked and time.monotonic() < until:
                time.sleep(0.1)
        finally:
            self._waiting = False
        if self.ended_as_asked:
            raise StopRequested()

    def execute_job(self, job: Job, queue: Queue) -> None:
        """``_execute``, an error out of it noted for the exit status (``broke``). Redis
        refusing writes or not answering as the job ends (a failover, a restart) is one
        line, and the worker goes on to wait the outage out (rq quit with a traceback): the
        job's end is not recorded, so it stays in its started registry, whose cleanup
        (housekeeping) delivers it again once Redis takes writes; its chunks' own ends are
        in the ledger, so a chunk done is not done again."""
        try:
            self._execute(job, queue)
        except redis.RedisError as exc:
            self.broke = True  # a burst whose job's end went unrecorded did not succeed
            if not is_outage(exc):
                raise
            log.warning("job %s of queue %s ended while Redis %s (%s): its end may not be "
                        "recorded; housekeeping delivers it again once Redis takes writes (or "
                        "fails it as abandoned if its retries are used up)", job.id,
                        queue.name, outage_said(exc), redact(str(exc)))
        except Exception:
            self.broke = True
            raise

    def _execute(self, job: Job, queue: Queue) -> None:
        """Run the job in this process with a heartbeat thread beside it.

        A job the policy refuses is failed without a retry (``FarmJob.func`` raises before
        anything is imported); a job that failed for good is settled into ``farm failed``. How
        it ended, with its chunks and items, goes to a burst's supervisor (``workers.burst``).
        """
        taken(job)
        tally.start()
        refusal = job_refusal(job, runtime.get().policy)
        if refusal:
            log.error("refusing job %s of queue %s: %s", job.id, queue.name, refusal)
            job.retries_left = 0
        execution = self.prepare_execution(job)
        stop = threading.Event()
        beat = threading.Thread(target=self._beat, args=(job, execution, stop), daemon=True)
        beat.start()
        started = time.monotonic()
        try:
            self.perform_job(job, queue, execution)
        finally:
            stop.set()
            beat.join()
        outcome = job.get_status(refresh=False)
        if outcome == JobStatus.FAILED:
            settle.settle_job(self.connection, queue.name, job.id)
        tally.note(f"job:{job.id}", "job", JOB_ENDS.get(outcome, tally.FAILED))
        burst.record(self.connection, tally.take())
        report_job(self.connection, queue.name, str(getattr(outcome, "value", outcome)),
                   time.monotonic() - started)
        self.set_state("idle")

    def handle_exception(self, job: Job, *exc_info) -> None:
        """rq logs a job's exception with its traceback; a refused job was said in one line."""
        if exc_info and isinstance(exc_info[1], ForbiddenJobError | DeserializationError):
            return
        super().handle_exception(job, *exc_info)

    def _beat(self, job: Job, execution, stop: threading.Event) -> None:
        while not stop.wait(HEARTBEAT_SECONDS):
            try:
                self.maintain_heartbeats(job, execution)
            except redis.RedisError as exc:
                log.warning("heartbeat of job %s failed: %s", job.id,
                            redact(f"{type(exc).__name__}: {exc}"))

    def heartbeat(self, timeout: int | None = None, pipeline=None) -> None:
        """Worker heartbeats between jobs at most every couple of seconds (3 round trips each);
        an outage meanwhile is left to the dequeue (``left_to_the_dequeue``)."""
        if pipeline is not None:  # part of a caller's pipeline: its errors are the caller's
            super().heartbeat(timeout, pipeline)
            return
        last = self.last_heartbeat
        if last is not None and time.time() - last.timestamp() < IDLE_BOOKKEEPING_SECONDS:
            return
        with left_to_the_dequeue():
            super().heartbeat(timeout)

    def check_for_suspension(self, burst: bool) -> None:
        """``rq suspend`` is honoured within a couple of seconds, not re-checked per job; an
        outage meanwhile is left to the dequeue (``left_to_the_dequeue``)."""
        if time.monotonic() - self._last_suspension_check < IDLE_BOOKKEEPING_SECONDS:
            return
        self._last_suspension_check = time.monotonic()
        with left_to_the_dequeue():
            super().check_for_suspension(burst)


@contextmanager
def left_to_the_dequeue() -> Iterator[None]:
    """A Redis outage met inside (rq's bookkeeping between jobs) is not an error: the dequeue
    that follows waits it out and says so; any other Redis error is raised."""
    try:
        yield
    except redis.RedisError as exc:
        if not is_outage(exc):
            raise


def taken(job: Job) -> None:
    """Called once a job is taken off its queue, before it starts (tests kill workers here)."""


def build(settings: Settings, queues: list[str], name: str | None = None) -> FarmWorker:
    """A worker for ``queues`` on the farm's Redis, with this process's runtime installed."""
    rt = runtime.Runtime(settings)
    runtime.install(rt)
    conn = settings.redis()
    return FarmWorker([rq_queue(conn, q) for q in queues], connection=conn,
                      name=name or worker_name())


def warm_up(rt: runtime.Runtime) -> None:
    """Before the first job: import the farm's chunk handlers and open a connection to the
    control database (every chunk claims there), so that the first chunk costs what the
    others do instead of the process's one-time costs (imports, PyMySQL's TLS context,
    connecting). A failure is left to the jobs and the housekeeping, which report it."""
    try:
        for handler in sorted(FARM_HANDLERS):
            importlib.import_module(handler.rpartition(".")[0])
        rt.ledger.pool.run(lambda cur: cur.execute("SELECT 1"), policy=NO_RETRY)
    except Exception as exc:  # noqa: BLE001 - best effort; the jobs report real failures
        log.debug("worker warm-up incomplete: %s", type(exc).__name__)


def main(argv: list[str] | None = None) -> int:
    """Entry point of one worker process. A bad configuration (a tuning variable, a URL, the
    queue list) is one line on stderr and exit 1, before any job is taken."""
    ap = argparse.ArgumentParser(prog="python -m workers.worker")
    ap.add_argument("--queues", default="farm")
    ap.add_argument("--burst", action="store_true")
    ap.add_argument("--name", default=None)
    args = ap.parse_args(argv)
    add_operator_path()
    try:
        farm_log.setup()
        settings = Settings.from_env()
        worker = build(settings, queues(args.queues), args.name)
    except FarmError as exc:
        print(f"farm worker: error: {exc}", file=sys.stderr)
        return 1
    farm_log.set_process(worker=worker.name)
    warm_up(runtime.get())
    try:
        worker.work(burst=args.burst, logging_level=logging.getLevelName(
            logging.getLogger().level), with_scheduler=False)
    except redis.RedisError as exc:  # rq's start or teardown, outside its error handling
        log.error("worker %s ended: Redis at %s could not register or unregister it, a "
                  "registration left expires by itself (%s)", worker.name,
                  redact_url(settings.redis_url), redact(f"{type(exc).__name__}: {exc}"))
        return 1
    finally:
        runtime.get().close()
    return worker.exit_status()


if __name__ == "__main__":
    raise SystemExit(main())
