"""A loop that rides out a Redis outage: the step that needs Redis is skipped while Redis
does not answer, said once when the outage starts and once when it ends.

rq's workers retry Redis for ever (with a growing pause) rather than exit; the supervisor
does the same, so a Redis restart or a network blip never stops the workers of a host.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

import redis

from shardfarm.redact import redact

log = logging.getLogger(__name__)
T = TypeVar("T")
UNREACHABLE = (redis.ConnectionError, redis.TimeoutError)
# connection errors that are not an outage: a password or user Redis refuses (fix the URL)
REFUSED = (redis.AuthenticationError, redis.exceptions.AuthorizationError)


class Outage:
    """Tracks whether Redis at ``where`` (a URL without its password) answers."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.since: float | None = None  # monotonic start of the outage; None: Redis answers

    def call(self, step: Callable[[], T], default: T) -> T:
        """``step()``, or ``default`` while Redis does not answer (``UNREACHABLE``, not
        ``REFUSED``: that one is raised, as any other error)."""
        try:
            value = step()
        except UNREACHABLE as exc:
            if isinstance(exc, REFUSED):
                raise
            if self.since is None:
                self.since = time.monotonic()
                log.warning("Redis at %s does not answer (%s); the workers keep running and "
                            "Redis is tried again every tick", self.where, redact(str(exc)))
            return default
        if self.since is not None:
            log.warning("Redis at %s answers again after %.0f s", self.where,
                        time.monotonic() - self.since)
            self.since = None
        return value
