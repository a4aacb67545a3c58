"""Retry policies as small composable objects (tenacity underneath)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from tenacity import (
    Retrying,
    before_sleep_log,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_random_exponential,
)

from shardfarm.errors import RetryableError

T = TypeVar("T")
log = logging.getLogger("shardfarm.retry")


@dataclass(frozen=True)
class RetryPolicy:
    """Retry ``RetryableError`` with exponential backoff and full jitter, bounded twice over."""

    attempts: int = 6
    max_seconds: float = 60.0
    base: float = 0.05
    max_wait: float = 5.0

    def retrying(self) -> Retrying:
        """A tenacity ``Retrying`` for this policy (re-raises the last error)."""
        return Retrying(
            retry=retry_if_exception_type(RetryableError),
            stop=stop_after_attempt(self.attempts) | stop_after_delay(self.max_seconds),
            wait=wait_random_exponential(multiplier=self.base, max=self.max_wait),
            before_sleep=before_sleep_log(log, logging.WARNING),
            reraise=True,
        )

    def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` under this policy."""
        return self.retrying()(fn)


TRANSIENT = RetryPolicy()
NO_RETRY = RetryPolicy(attempts=1)
