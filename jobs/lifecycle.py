"""A chunk's life on a worker: throttle, claim, renew the lease, run the handler, record.

The ledger makes delivery idempotent: a done chunk is skipped, a chunk leased
to a live worker is skipped, a chunk whose lease expired is taken over with a
higher fence. A failed attempt goes back to ``pending`` after ``shardfarm.retry.backoff``
and is re-dispatched, until the ledger has counted ``FARM_CHUNK_ATTEMPTS`` attempts;
fatal ones (bad input, bad config) fail at once.
An attempt that runs out of its job's time (rq's ``JobTimeoutException``, or the
handler's own check past the deadline) ends the same clean way, and the next
attempt gets twice the time. A chunk routes with one shard map from start to end.
"""

from __future__ import annotations

import contextvars
import logging
import os
import socket
import threading
import time
import uuid

from rq import get_current_job
from rq.timeouts import JobTimeoutException

from farmcore.context import ChunkContext
from farmcore.ledger import ClaimRefused, Lease, Outcome
from jobs import tally, throttle
from jobs.dispatch import chunk_item, dispatch_later
from jobs.runtime import Runtime
from shardfarm import log as farm_log
from shardfarm import tuning
from shardfarm.errors import ChunkTimeoutError, FatalError, FencedError
from shardfarm.retry import backoff

log = logging.getLogger(__name__)
CHUNK_BACKOFF, CHUNK_BACKOFF_CAP = 2.0, 300.0  # seconds: first wait, longest wait
OWNER = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Renewer:
    """Renews a chunk's lease every third of its length in a thread, and stops the attempt
    (sets ``ctx.lost``) when it was taken over or when it could not be renewed before its
    own deadline (``ctx.deadline``, which ``ctx.check()`` also enforces by itself).

    A failed renewal is retried every second while the lease may still hold; errors
    are logged, never swallowed into a lease that silently expires under a live worker.
    It stops renewing at the attempt's time limit (``ctx.time_limit``), so an attempt
    stuck past its time loses its lease and the chunk is handed to another worker.
    """

    def __init__(self, ctx: ChunkContext, seconds: float | None = None) -> None:
        self.ctx = ctx
        ctx.lease_seconds = seconds or tuning.lease_seconds()
        ctx.extended(time.monotonic())  # claimed a moment ago; the margin covers the gap
        self.stop = threading.Event()
        # in a copy of this context: its lines carry the chunk's run, chunk and shard too
        self.thread = threading.Thread(target=contextvars.copy_context().run,
                                       args=(self._loop,), daemon=True, name="lease-renewer")

    def _loop(self) -> None:
        ctx = self.ctx
        wait = ctx.lease_seconds / 3
        while not self.stop.wait(max(0.0, min(wait, ctx.deadline - time.monotonic()))):
            if time.monotonic() >= ctx.deadline:
                log.warning("lease of chunk %s of %s not renewed in time; stopping the attempt",
                            ctx.chunk_id, ctx.run_id)
                ctx.lost.set()
                return
            if ctx.time_limit is not None and time.monotonic() > ctx.time_limit:
                return
            try:
                ctx.renew()
            except FencedError:
                return
            except Exception as exc:  # noqa: BLE001 - retried until the deadline, then stop
                log.warning("could not renew lease of chunk %s: %s", ctx.chunk_id,
                            str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
                wait = min(1.0, ctx.lease_seconds / 3)
            else:
                wait = ctx.lease_seconds / 3

    def __enter__(self) -> Renewer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def time_limit() -> float | None:
    """When the current rq job's time runs out, less a margin to end the attempt cleanly."""
    job = get_current_job()
    timeout = getattr(job, "timeout", None)
    if not timeout or timeout < 0:
        return None
    return time.monotonic() + timeout - min(60.0, timeout * 0.1)


def execute(rt: Runtime, run_id: str, chunk_id: int, timeouts: int = 0) -> str:
    """Run one chunk; returns what happened (``done``, ``skipped:<why>``, ``failed``, …).

    A paused run's chunk does nothing (unpausing dispatches it again); ``timeouts``: how
    many earlier attempts ran out of time (each doubles the job's timeout). Lines logged
    meanwhile carry the run and chunk (and the shard, for a chunk of one shard).
    """
    with farm_log.context(run=run_id, chunk=chunk_id):
        outcome = _execute(rt, run_id, chunk_id, timeouts)
    if (ended := _TALLIED.get(outcome)) is not None:
        tally.note(chunk_item(run_id, chunk_id), "chunk", ended)
    return outcome


# what an attempt's outcome says of the chunk (``jobs.tally``); the others (paused, leased,
# backing off, throttled, taken over) leave what was noted of it before
_TALLIED = {"done": tally.DONE, "skipped:done": tally.DONE, "failed": tally.FAILED,
            "retrying": tally.RETRYING}


def _execute(rt: Runtime, run_id: str, chunk_id: int, timeouts: int) -> str:
    run = rt.ledger.run(run_id)
    if run["paused"]:
        return "skipped:paused"
    if throttle.reason(rt, run):
        dispatch_later(rt.redis, run, chunk_id, throttle.PAUSE_SECONDS, timeouts)
        return "throttled"
    claim = rt.ledger.claim(run_id, chunk_id, OWNER, tuning.lease_seconds())
    if isinstance(claim, ClaimRefused):
        if claim.reason == "not_before":
            dispatch_later(rt.redis, run, chunk_id, 2.0, timeouts)
        return f"skipped:{claim.reason}"
    try:  # the shard map unreadable here (FARM_SHARDMAP): the claimed chunk fails with why
        ctx = ChunkContext(rt.settings, rt.router.pinned(), rt.ledger, claim, run["params"],
                           rt.redis, time_limit=time_limit())
    except Exception as exc:  # noqa: BLE001 - recorded like a failure of the handler
        return _failed(rt, run, claim, exc, timeouts)
    with farm_log.context(shard=claim.args.get("shard")):
        return _run(rt, run, ctx, timeouts)


def _run(rt: Runtime, run: dict, ctx: ChunkContext, timeouts: int) -> str:
    lease = ctx.lease
    try:
        handler = rt.policy.load_handler(run["params"]["handler"])
        with Renewer(ctx):
            outcome = handler(ctx, **lease.args) or ctx.outcome
            ctx.check()
        outcome = outcome if isinstance(outcome, Outcome) else ctx.outcome
        rt.ledger.finish(lease, outcome)
        log.info("chunk %s of %s done: %d rows read, %d written, %d quarantined",
                 lease.chunk_id, lease.run_id, outcome.rows_read, outcome.rows_written,
                 outcome.rows_quarantined)
    except FencedError:
        log.warning("chunk %s of %s was taken over; dropping this attempt", lease.chunk_id,
                    lease.run_id)
        return "fenced"
    except (Exception, JobTimeoutException) as exc:  # noqa: BLE001 - every failure is recorded
        return _failed(rt, run, lease, exc, timeouts)
    rt.ledger.refresh_status(lease.run_id)
    return "done"


def _failed(rt: Runtime, run: dict, lease: Lease, exc: BaseException, timeouts: int) -> str:
    timed_out = isinstance(exc, JobTimeoutException | ChunkTimeoutError)
    fatal = isinstance(exc, FatalError) or lease.attempts >= tuning.chunk_attempts()
    retry_in = None if fatal else backoff(lease.attempts, CHUNK_BACKOFF, CHUNK_BACKOFF_CAP)
    reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:1000]
    level = logging.ERROR if fatal else logging.WARNING
    log.log(level, "chunk %s of %s attempt %s failed: %s", lease.chunk_id, lease.run_id,
            lease.attempts, reason)
    try:
        state = rt.ledger.fail(lease, reason, retry_in)
    except FencedError:
        return "fenced"
    if state == "pending":
        dispatch_later(rt.redis, run, lease.chunk_id, retry_in or 1, timeouts + timed_out)
    rt.ledger.refresh_status(lease.run_id)
    return "failed" if state == "failed" else "retrying"
