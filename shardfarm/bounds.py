"""How long the farm waits for a server's answer, per kind of connection: the one place.

Connecting to any server (TCP and handshake, retries included) is bounded by
FARM_CONNECT_TIMEOUT (``shardfarm.mysql.connect``). Once connected:

- **Status reads** (``farm status``, ``farm sync status``, the dashboard and its
  ``/metrics``): ``status_bound()``, FARM_STATUS_TIMEOUT seconds (default 10) per call,
  retries included. The server ends a statement then (``max_statement_time``) and waits
  that long at most for a lock another session holds (``lock_wait_timeout`` for a
  ``LOCK TABLES`` or DDL, ``innodb_lock_wait_timeout`` for rows); the socket gives up a
  second later (a stalled server or network), so a reader never waits for ever and the
  server never keeps a statement running for a client that left. The caller gets one
  line: ``StatementTimeoutError``, "did not answer within N s".
- **Bulk work** (loads, ``LOAD DATA``, reverse rebuilds, exports, DDL, the workers' ledger):
  ``BULK``, no bound on a statement, which may rightly run for minutes; a worker whose
  server stalls is covered by its chunk's lease expiring (another worker takes it over).
- **Redis**: connecting waits FARM_CONNECT_TIMEOUT; a status view's runtime waits its bound
  (and a second) for each reply, workers no time (they block on their queues).
- **S3** (``s3_client_options``): workers' uploads and reads wait FARM_CONNECT_TIMEOUT to
  connect and ``S3_READ_SECONDS`` for each reply, with ``S3_ATTEMPTS`` tries (the
  chunk is retried later as a whole); a status view's look at ``_SUCCESS`` markers waits
  FARM_STATUS_TIMEOUT for each and does not retry.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import pymysql
import redis

from shardfarm.errors import StatementTimeoutError
from shardfarm.retry import TRANSIENT, RetryPolicy
from shardfarm.tuning import connect_timeout, status_timeout

STATUS_VARIABLE = "FARM_STATUS_TIMEOUT"  # parsed with the other tunables (shardfarm.tuning)
REDIS_REPLY_LIMIT = 20.0  # the longest a farm client waits for one reply of Redis (a bound)
SOCKET_MARGIN = 1.0  # the socket waits this much longer than the server's own limits
S3_READ_SECONDS = 60.0  # one reply of S3 to a worker (a part's upload, a listing page)
S3_ATTEMPTS = 3  # tries of one S3 call by a worker (botocore's standard retry mode)
SERVER_TIMEOUT_CODES = frozenset({1969, 1205})  # max_statement_time exceeded; lock wait
LOST_CODES = frozenset({2006, 2013})  # gone away on a write, lost on a read


@dataclass(frozen=True)
class Bound:
    """How long one call on a connection may wait for the server: ``seconds`` (``None``:
    no bound, for bulk work)."""

    seconds: float | None = None

    @property
    def socket_timeout(self) -> float | None:
        """PyMySQL's read and write timeout once connected (``None``: none)."""
        return None if self.seconds is None else self.seconds + SOCKET_MARGIN

    def session(self) -> str:
        """Assignments to append to a ``SET SESSION`` (``", a = 1, ..."``; empty unbounded).
        ``max_statement_time`` is MariaDB's (an executable comment MySQL skips)."""
        if self.seconds is None:
            return ""
        whole = max(1, math.ceil(self.seconds))
        return (f", lock_wait_timeout = {whole}, innodb_lock_wait_timeout = {whole}"
                f" /*M!100108 , max_statement_time = {self.seconds:g} */")

    def policy(self) -> RetryPolicy:
        """The retry policy of a call: bounded calls retry only within ``seconds``."""
        return TRANSIENT if self.seconds is None else RetryPolicy(max_seconds=self.seconds)

    def timed_out(self, exc: BaseException) -> bool:
        """Whether ``exc`` (a PyMySQL error) is this bound running out: the server ended the
        statement or its lock wait, or the socket timed out."""
        if self.seconds is None or not isinstance(exc, pymysql.MySQLError) or not exc.args:
            return False
        code = exc.args[0]
        return code in SERVER_TIMEOUT_CODES or (code in LOST_CODES and "timed out" in str(exc))

    def error(self, where: object, shard: int | None = None) -> StatementTimeoutError:
        """The one-line error of a call that ran out of this bound on ``where`` (a
        ``shardfarm.mysql.connect.Where``)."""
        return StatementTimeoutError(
            f"MySQL {where} did not answer within {self.seconds:g} s ({STATUS_VARIABLE}): a "
            "lock held by another session, a slow statement, or a stalled server or network",
            host=getattr(where, "name", str(where)), shard=shard)


BULK = Bound()


def status_bound(env: Mapping[str, str] | None = None) -> Bound:
    """The bound of status reads (``farm status``, the dashboard, ``/metrics``)."""
    return Bound(status_timeout(env))


def s3_client_options(status: bool = False) -> dict:
    """botocore ``Config`` keywords: a worker's (``status=False``) or a status view's."""
    if status:
        seconds = status_timeout()
        return {"connect_timeout": seconds, "read_timeout": seconds,
                "retries": {"total_max_attempts": 1, "mode": "standard"}}
    return {"connect_timeout": connect_timeout(), "read_timeout": S3_READ_SECONDS,
            "retries": {"total_max_attempts": S3_ATTEMPTS, "mode": "standard"}}


def redis_error_line(exc: redis.RedisError) -> str:
    """One line for a Redis error a command or a page shows, saying what to check."""
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if isinstance(exc, redis.TimeoutError):
        return (f"Redis: {first} (no answer within FARM_CONNECT_TIMEOUT to connect, "
                f"{STATUS_VARIABLE} for a status read, or {REDIS_REPLY_LIMIT:g} s for any "
                "other reply: check FARM_REDIS_URL (redis:// or rediss://, as the server "
                "speaks) and the network)")
    if isinstance(exc, redis.ResponseError):  # Redis is there and answered: no URL to check
        return f"Redis: {first} ({_answered_hint(exc, first)})"
    return f"Redis: {first} (check FARM_REDIS_URL and that Redis is running)"


# What to check when Redis answers a command with an error: by redis-py's class for the
# errors it names (their text loses the code), else by the error's first word.
_ANSWER_CLASSES: tuple[tuple[type[redis.ResponseError], str], ...] = (
    (redis.exceptions.ReadOnlyError,
     "FARM_REDIS_URL names a read-only replica: point it at the primary"),
    (redis.exceptions.OutOfMemoryError, "Redis is out of memory: raise its maxmemory or free keys"),
    (redis.exceptions.NoPermissionError,
     "the Redis user in FARM_REDIS_URL may not run this command: check its ACL"),
)
_ANSWER_WORDS = {
    "WRONGTYPE": "a key of the farm holds another type than the farm writes there: something "
                 "else wrote it; see the README's 'What workers run'",
    "MISCONF": "Redis cannot save its data: see the Redis server's log",
}


def _answered_hint(exc: redis.ResponseError, first: str) -> str:
    """What to check for an error Redis answered with."""
    for cls, hint in _ANSWER_CLASSES:
        if isinstance(exc, cls):
            return hint
    if first.startswith("DB index is out of range"):  # SELECT n: the URL's /n, an operator's
        return "the database number at the end of FARM_REDIS_URL is past the server's " \
               "'databases' setting (16 by default: 0 to 15)"
    return _ANSWER_WORDS.get(first.split(" ", 1)[0],
                             "Redis answered with this error: see the Redis server's log")


def wrong_type(exc: BaseException) -> bool:
    """Whether Redis refused a command (alone or in a pipeline) for ``WRONGTYPE``: the key
    holds another type than the farm writes there (something else wrote it). Any other
    refusal (``READONLY``, ``OOM``, ``MASTERDOWN``) is not this one."""
    text = str(exc)
    return isinstance(exc, redis.ResponseError) and (
        text.startswith("WRONGTYPE") or "caused error: WRONGTYPE" in text)
