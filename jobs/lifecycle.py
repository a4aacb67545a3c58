"""A chunk's life on a worker: throttle, claim, renew the lease, run the handler, record.

The ledger makes delivery idempotent: a done chunk is skipped, a chunk leased
to a live worker is skipped, a chunk whose lease expired is taken over with a
higher fence. Retryable failures go back to ``pending`` with exponential
backoff and are re-dispatched; fatal ones (bad input, bad config) fail at once.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import uuid

from jobs import throttle
from jobs.dispatch import dispatch_later
from jobs.runtime import Runtime
from shardfarm.context import ChunkContext
from shardfarm.errors import FatalError, FencedError
from shardfarm.ledger import ClaimRefused, Lease, Ledger, Outcome

log = logging.getLogger(__name__)
LEASE_SECONDS = float(os.environ.get("FARM_LEASE_SECONDS", "60"))
MAX_ATTEMPTS = int(os.environ.get("FARM_CHUNK_ATTEMPTS", "5"))
OWNER = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def backoff(attempts: int, base: float = 2.0, cap: float = 300.0) -> float:
    """Exponential backoff with full jitter for the ``attempts``-th failure."""
    return random.uniform(base, min(cap, base * 2 ** attempts))


class Renewer:
    """Renews a lease every third of its length in a thread; sets ``lost`` if fenced out."""

    def __init__(self, ledger: Ledger, lease: Lease, lost: threading.Event) -> None:
        self.ledger, self.lease, self.lost = ledger, lease, lost
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True, name="lease-renewer")

    def _loop(self) -> None:
        while not self.stop.wait(LEASE_SECONDS / 3):
            try:
                self.ledger.renew(self.lease, LEASE_SECONDS)
            except FencedError:
                self.lost.set()
                return
            except Exception:
                log.warning("could not renew lease of chunk %s", self.lease.chunk_id,
                            exc_info=True)

    def __enter__(self) -> Renewer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def execute(rt: Runtime, run_id: str, chunk_id: int) -> str:
    """Run one chunk; returns what happened (``done``, ``skipped:<why>``, ``failed``, …)."""
    run = rt.ledger.run(run_id)
    why = throttle.reason(rt, run)
    if why:
        dispatch_later(rt.redis, run["queue"], run_id, chunk_id, throttle.PAUSE_SECONDS)
        return "throttled"
    claim = rt.ledger.claim(run_id, chunk_id, OWNER, LEASE_SECONDS)
    if isinstance(claim, ClaimRefused):
        if claim.reason == "not_before":
            dispatch_later(rt.redis, run["queue"], run_id, chunk_id, 2.0)
        return f"skipped:{claim.reason}"
    ctx = ChunkContext(rt.settings, rt.router, rt.ledger, claim, run["params"], rt.redis)
    return _run(rt, run, ctx)


def _run(rt: Runtime, run: dict, ctx: ChunkContext) -> str:
    lease = ctx.lease
    try:
        handler = rt.policy.load_handler(run["params"]["handler"])
        with Renewer(rt.ledger, lease, ctx.lost):
            outcome = handler(ctx, **lease.args) or ctx.outcome
            ctx.check()
        rt.ledger.finish(lease, outcome if isinstance(outcome, Outcome) else ctx.outcome)
    except FencedError:
        log.warning("chunk %s of %s was taken over; dropping this attempt", lease.chunk_id,
                    lease.run_id)
        return "fenced"
    except Exception as exc:  # noqa: BLE001 - every failure is recorded with its reason
        return _failed(rt, run, lease, exc)
    rt.ledger.refresh_status(lease.run_id)
    return "done"


def _failed(rt: Runtime, run: dict, lease: Lease, exc: BaseException) -> str:
    fatal = isinstance(exc, FatalError) or lease.attempts >= MAX_ATTEMPTS
    retry_in = None if fatal else backoff(lease.attempts)
    reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:1000]
    level = logging.ERROR if fatal else logging.WARNING
    log.log(level, "chunk %s of %s attempt %s failed: %s", lease.chunk_id, lease.run_id,
            lease.attempts, reason)
    try:
        state = rt.ledger.fail(lease, reason, retry_in)
    except FencedError:
        return "fenced"
    if state == "pending":
        dispatch_later(rt.redis, run["queue"], lease.run_id, lease.chunk_id, retry_in or 1)
    rt.ledger.refresh_status(lease.run_id)
    return "failed" if state == "failed" else "retrying"
