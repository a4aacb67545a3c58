"""A loop that rides out a Redis outage: the step that needs Redis is skipped while Redis
does not answer or refuses writes, said once when the outage starts and once when it ends.

rq's workers retry Redis for ever (with a growing pause) rather than exit; the supervisor
does the same, so a Redis restart, a network blip or a failover (the old master, now a
replica, refuses writes with ``READONLY`` until it is promoted again or the URL is changed)
never stops the workers of a host.
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
# a Redis that answers but takes no writes for now: a replica (after a failover), a replica
# cut off from its master, a Redis at its memory limit
UNWRITABLE = (redis.exceptions.ReadOnlyError, redis.exceptions.MasterDownError,
              redis.exceptions.OutOfMemoryError)
# a replica's refusal: a failover under way, or a URL that names a replica (the same to Redis)
REPLICA_HINT = ("; if no failover is under way, FARM_REDIS_URL names a read-only replica: "
                "point it at the primary")
# connection errors that are not an outage: a password or user Redis refuses (fix the URL)
REFUSED = (redis.AuthenticationError, redis.exceptions.AuthorizationError)


class Outage:
    """Tracks whether Redis at ``where`` (a URL without its password) answers."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.since: float | None = None  # monotonic start of the outage; None: Redis answers
        self._writes = False  # the outage is one of writes refused (``UNWRITABLE``)

    def call(self, step: Callable[[], T], default: T, writes: bool = True) -> T:
        """``step()``, or ``default`` while Redis does not answer (``UNREACHABLE``, not
        ``REFUSED``: that one is raised, as any other error) or refuses writes
        (``UNWRITABLE``). A step that only reads (not ``writes``) ends an outage of the
        first kind, not of the second (a replica answers reads)."""
        try:
            value = step()
        except redis.RedisError as exc:
            if not is_outage(exc):
                raise
            if self.since is None:
                self.since = time.monotonic()
                self._writes = unwritable(exc)
                said = _said(exc)
                log.warning("Redis at %s %s (%s); the workers keep running and Redis is tried "
                            "again every tick%s", self.where, outage_said(exc), redact(said),
                            REPLICA_HINT if said.startswith("READONLY") else "")
            return default
        if self.since is not None and (writes or not self._writes):
            log.warning("Redis at %s %s again after %.0f s", self.where,
                        "takes writes" if self._writes else "answers",
                        time.monotonic() - self.since)
            self.since = None
        return value

    @property
    def what(self) -> str:
        """What the outage under way is: ``has not answered`` or ``has refused writes``."""
        return "has refused writes" if self._writes else "has not answered"


# the same refusals inside a script (Redis before 7.0 wraps them: "Error running script
# ... -READONLY ..."); a blocked command a master turned replica unblocked starts "UNBLOCKED "
_UNWRITABLE_TEXT = ("-READONLY ", "-OOM ", "-MASTERDOWN ")


def is_outage(exc: BaseException) -> bool:
    """Whether ``exc`` is Redis not answering (``UNREACHABLE``) or refusing writes
    (``unwritable``) for now, which a loop waits out; not a password or user Redis refuses
    (``REFUSED``: fix the URL)."""
    return unwritable(exc) or (isinstance(exc, UNREACHABLE) and not isinstance(exc, REFUSED))


def outage_said(exc: BaseException) -> str:
    """The outage ``exc`` is, as a log line says it: ``refuses writes`` or ``does not answer``."""
    return "refuses writes" if unwritable(exc) else "does not answer"


def unwritable(exc: BaseException) -> bool:
    """Whether ``exc`` says Redis takes no writes for now (``UNWRITABLE``, or such a refusal
    reported as a plain ``ResponseError``)."""
    if isinstance(exc, UNWRITABLE):
        return True
    text = str(exc)
    return isinstance(exc, redis.ResponseError) and (
        text.startswith("UNBLOCKED ") or any(t in text for t in _UNWRITABLE_TEXT))


def _said(exc: Exception) -> str:
    """The error as Redis said it: its code (``READONLY``, ``OOM``) before its text."""
    code = getattr(exc, "status_code", None)
    return f"{code} {exc}" if code else str(exc)
