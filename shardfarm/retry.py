"""The farm's one retry story: a tenacity policy for transient errors, one backoff formula.

Transient errors (``RetryableError``: a dropped connection, a deadlock, a lock wait)
are retried in place by ``RetryPolicy`` (``TRANSIENT``), the only tenacity policy of
the farm. Work that still fails is tried again later by its own record, which
counts the attempts: a chunk by the ledger (``jobs.lifecycle``), an item by its
item record (``jobs.items``). Every wait, in place or later, comes from ``backoff``.

An unreachable server (``UnreachableError``: refused, timed out, no handshake) is
retried only while the whole call stays within FARM_CONNECT_TIMEOUT, so a command
pointed at a wrong or dead host gives up in that time, not after every retry; a
worker's chunk is dispatched again later through the ledger.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from tenacity import (
    RetryCallState,
    Retrying,
    before_sleep_log,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
)

from shardfarm.errors import RetryableError, UnreachableError
from shardfarm.tuning import connect_timeout

T = TypeVar("T")
log = logging.getLogger("shardfarm.retry")


@dataclass(frozen=True)
class RetryPolicy:
    """Retry ``RetryableError`` with ``backoff`` (``base`` up to ``max_wait`` seconds), bounded
    by ``attempts`` and by ``max_seconds``."""

    attempts: int = 6
    max_seconds: float = 60.0
    base: float = 0.05
    max_wait: float = 5.0
    unreachable_seconds: float | None = None  # None: FARM_CONNECT_TIMEOUT

    def retrying(self) -> Retrying:
        """A tenacity ``Retrying`` for this policy (re-raises the last error)."""
        budget = self.unreachable_seconds or connect_timeout()
        return Retrying(
            retry=retry_if_exception_type(RetryableError),
            stop=(stop_after_attempt(self.attempts) | stop_after_delay(self.max_seconds)
                  | _unreachable_past(budget)),
            wait=lambda state: backoff(state.attempt_number - 1, self.base, self.max_wait),
            # INFO: a retry that works is routine, and one that does not ends in one error
            # line of its own (a command's stderr is not a log of every attempt)
            before_sleep=before_sleep_log(log, logging.INFO),
            reraise=True,
        )

    def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` under this policy."""
        return self.retrying()(fn)


def backoff_ceiling(attempts: int, base: float, cap: float) -> float:
    """The longest wait after ``attempts`` earlier failures: ``base * 2**attempts``, at most
    ``cap``."""
    return min(cap, base * 2 ** max(0, attempts))


def backoff(attempts: int, base: float = 2.0, cap: float = 300.0) -> float:
    """How long to wait after ``attempts`` earlier failures: exponential with full jitter,
    a random time between ``base`` and ``backoff_ceiling`` (so retries spread out).

    The farm's one backoff formula: statements retried in place (``RetryPolicy``),
    chunks going back to ``pending``, and deferred items.
    """
    ceiling = backoff_ceiling(attempts, base, cap)
    return random.uniform(min(base, ceiling), ceiling)


def _unreachable_past(budget: float) -> Callable[[RetryCallState], bool]:
    """Stop when the server is unreachable and another try would end past ``budget``."""
    def stop(state: RetryCallState) -> bool:
        exc = state.outcome.exception() if state.outcome else None
        return (isinstance(exc, UnreachableError)
                and state.seconds_since_start + state.upcoming_sleep >= budget)
    return stop


TRANSIENT = RetryPolicy()
NO_RETRY = RetryPolicy(attempts=1)
