"""Retry policies as small composable objects (tenacity underneath).

An unreachable server (``UnreachableError``: refused, timed out, no handshake) is
retried only while the whole call stays within FARM_CONNECT_TIMEOUT, so a command
pointed at a wrong or dead host gives up in that time, not after every retry; a
worker's chunk is dispatched again later through the ledger.
"""

from __future__ import annotations

import logging
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
    wait_random_exponential,
)

from shardfarm.errors import RetryableError, UnreachableError
from shardfarm.settings import connect_timeout

T = TypeVar("T")
log = logging.getLogger("shardfarm.retry")


@dataclass(frozen=True)
class RetryPolicy:
    """Retry ``RetryableError`` with exponential backoff and full jitter, bounded twice over."""

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
            wait=wait_random_exponential(multiplier=self.base, max=self.max_wait),
            # INFO: a retry that works is routine, and one that does not ends in one error
            # line of its own (a command's stderr is not a log of every attempt)
            before_sleep=before_sleep_log(log, logging.INFO),
            reraise=True,
        )

    def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` under this policy."""
        return self.retrying()(fn)


def _unreachable_past(budget: float) -> Callable[[RetryCallState], bool]:
    """Stop when the server is unreachable and another try would end past ``budget``."""
    def stop(state: RetryCallState) -> bool:
        exc = state.outcome.exception() if state.outcome else None
        return (isinstance(exc, UnreachableError)
                and state.seconds_since_start + state.upcoming_sleep >= budget)
    return stop


TRANSIENT = RetryPolicy()
NO_RETRY = RetryPolicy(attempts=1)
