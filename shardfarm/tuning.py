"""Every ``FARM_*`` tuning variable, parsed and range-checked here and nowhere else.

A bad value is one line naming the variable, the value and what it should be:
``bad FARM_LEASE_SECONDS: 'banana' (a number of seconds > 0, at most 86400)``, a
``ConfigError`` (exit 1); the same value given as a flag (``--log-level``, ``--at``) is a
``UsageError`` naming the flag (exit 2). ``check_environment`` checks them all at once:
the ``farm`` CLI and every worker call it before doing anything, so a bad value stops a
command or a worker at its start instead of failing each job.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from shardfarm.errors import ConfigError, UsageError

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
FORMATS = ("text", "json")
DEFAULT_EXPORT_CRON = "0 3 * * *"
MAX_CONNECT_TIMEOUT = 3600.0


@dataclass(frozen=True)
class Tunable:
    """One variable: its default, a parser (raises ``ValueError`` on a bad value) and what a
    good value is, in words for the error line."""

    name: str
    default: str
    parse: Callable[[str], object]
    expected: str


def _number(low: float, high: float) -> Callable[[str], float]:
    """A parser of a finite number in ``(low, high]``."""
    def parse(text: str) -> float:
        value = float(text)
        if not (math.isfinite(value) and low < value <= high):
            raise ValueError(text)
        return value
    return parse


def _whole(low: int, high: int) -> Callable[[str], int]:
    """A parser of a whole number in ``[low, high]``."""
    def parse(text: str) -> int:
        value = int(text.strip())
        if not low <= value <= high:
            raise ValueError(text)
        return value
    return parse


def _choice(allowed: tuple[str, ...], upper: bool) -> Callable[[str], str]:
    """A parser of one of ``allowed`` (any case), returned upper- or lower-cased."""
    def parse(text: str) -> str:
        value = text.strip().upper() if upper else text.strip().lower()
        if value not in allowed:
            raise ValueError(text)
        return value
    return parse


def _cron(text: str) -> str:
    """Five cron fields (minute hour day month weekday) naming a time that comes: a date
    no month has (``0 3 31 2 *``) would never fire, and the scheduler could find no slot."""
    from croniter import CroniterBadDateError, croniter  # only when one is read
    if len(text.split()) != 5 or not croniter.is_valid(text):
        raise ValueError(text)
    try:
        croniter(text).get_next()
    except CroniterBadDateError:
        raise ValueError(text) from None
    return text


TUNABLES: dict[str, Tunable] = {t.name: t for t in [
    Tunable("FARM_CONNECT_TIMEOUT", "10", _number(0, MAX_CONNECT_TIMEOUT),
            f"a number of seconds > 0, at most {MAX_CONNECT_TIMEOUT:g}"),
    Tunable("FARM_STATUS_TIMEOUT", "10", _number(0, MAX_CONNECT_TIMEOUT),
            f"a number of seconds > 0, at most {MAX_CONNECT_TIMEOUT:g}"),
    Tunable("FARM_LEASE_SECONDS", "60", _number(0, 86400),
            "a number of seconds > 0, at most 86400"),
    Tunable("FARM_CHUNK_ATTEMPTS", "5", _whole(1, 1000), "a whole number from 1 to 1000"),
    Tunable("FARM_MAX_THREADS_RUNNING", "0", _whole(0, 1_000_000),
            "a whole number of threads, 0 for no throttle"),
    Tunable("FARM_LOG_LEVEL", "WARNING", _choice(LEVELS, upper=True),
            f"one of {', '.join(LEVELS)}"),
    Tunable("FARM_LOG_FORMAT", "text", _choice(FORMATS, upper=False),
            f"one of {', '.join(FORMATS)}"),
    Tunable("FARM_EXPORT_CRON", DEFAULT_EXPORT_CRON, _cron,
            f"5 cron fields such as '{DEFAULT_EXPORT_CRON}', in UTC, of a date that exists"),
]}


def value(name: str, env: Mapping[str, str] | None = None, *, given: str | None = None,
          flag: str = "") -> object:
    """The checked value of tunable ``name``: ``given`` (a flag's value) unless ``None``,
    else the variable in ``env`` (default ``os.environ``) when set and non-empty, else its
    default.

    A bad flag value is a ``UsageError`` naming ``flag``; a bad variable a ``ConfigError``
    naming the variable. Either is one line with the value (cut to 40 characters).
    """
    spec = TUNABLES[name]
    env = os.environ if env is None else env
    from_flag = given is not None
    text = given if from_flag else (env.get(name) or spec.default)
    try:
        return spec.parse(text)
    except ValueError:
        error, what = (UsageError, flag) if from_flag else (ConfigError, name)
        raise error(f"bad {what}: {text[:40]!r} ({spec.expected})") from None


def check_environment(env: Mapping[str, str] | None = None) -> None:
    """Check every tunable of ``env`` (default ``os.environ``); the first bad one raises
    ``ConfigError`` in one line."""
    for name in TUNABLES:
        value(name, env)


def connect_timeout(env: Mapping[str, str] | None = None) -> float:
    """``FARM_CONNECT_TIMEOUT``: seconds a command waits for a server to answer, in total,
    retries included (default 10)."""
    return value("FARM_CONNECT_TIMEOUT", env)  # type: ignore[return-value]


def status_timeout(env: Mapping[str, str] | None = None) -> float:
    """``FARM_STATUS_TIMEOUT``: seconds a status read (``farm status``, the dashboard) waits
    for an answer, retries included (default 10); bulk work has no such bound."""
    return value("FARM_STATUS_TIMEOUT", env)  # type: ignore[return-value]


def lease_seconds(env: Mapping[str, str] | None = None) -> float:
    """``FARM_LEASE_SECONDS``: a chunk's lease length, renewed every third of it (default 60)."""
    return value("FARM_LEASE_SECONDS", env)  # type: ignore[return-value]


def chunk_attempts(env: Mapping[str, str] | None = None) -> int:
    """``FARM_CHUNK_ATTEMPTS``: attempts before a chunk is failed (default 5)."""
    return value("FARM_CHUNK_ATTEMPTS", env)  # type: ignore[return-value]


def max_threads_running(env: Mapping[str, str] | None = None) -> int:
    """``FARM_MAX_THREADS_RUNNING``: runs wait while a server has more threads running than
    this (default 0: no throttle)."""
    return value("FARM_MAX_THREADS_RUNNING", env)  # type: ignore[return-value]
