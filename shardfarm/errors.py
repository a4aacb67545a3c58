"""The exception tree: the class name says whether retrying can help.

``FarmError`` is the root. ``RetryableError`` means "try again later, it may
work" (a dropped connection, a deadlock); ``FatalError`` means "retrying will
not help" (bad input, bad configuration). Messages never carry bind values or
passwords.
"""

from __future__ import annotations


class FarmError(Exception):
    """Root of every error shardfarm raises on purpose."""


class RetryableError(FarmError):
    """A transient failure: the same call may succeed if retried."""


class FatalError(FarmError):
    """A permanent failure: retrying the same call cannot succeed."""


class ConfigError(FatalError):
    """An operator mistake in configuration: bad DSN, bad URL, bad shard map."""


class UsageError(ConfigError):
    """An operator mistake on the command line: a bad flag value, date, table name, cron
    expression or ID. The ``farm`` CLI exits 2 for it (1 for every other error)."""


class ShardMapError(ConfigError):
    """The shard map is malformed or inconsistent; the message names the entry."""


class InvalidIdError(FatalError, ValueError):
    """A 64-bit ID (or one of its parts) is out of range or malformed."""


class UnknownShardError(FatalError):
    """An ID refers to a shard that the shard map does not contain."""


class NotFoundError(FatalError, LookupError):
    """A requested object does not exist (or is soft-deleted)."""


class DatabaseError(FarmError):
    """A MySQL error that is not transient. Names the host and shard, never bind values."""

    def __init__(self, message: str, *, host: str = "", shard: int | None = None,
                 code: int | None = None) -> None:
        super().__init__(message)
        self.host = host
        self.shard = shard
        self.code = code


class PermanentDatabaseError(DatabaseError, FatalError):
    """A MySQL error that retrying cannot fix: missing table, bad SQL, constraint violation."""


class TransientDatabaseError(DatabaseError, RetryableError):
    """A MySQL error worth retrying: gone away, lost connection, deadlock, lock wait."""


class UnreachableError(TransientDatabaseError):
    """The server refused or timed out the connection."""


class StatementTimeoutError(TransientDatabaseError):
    """A bounded call (a status read: ``shardfarm.bounds``) got no answer in its time: a lock
    held by another session, a slow statement, a stalled server or network. Worth trying
    again later; the reader gives up at once instead of waiting."""


class FencedError(FatalError):
    """A zombie worker tried to write after its lease was handed to someone else."""


class ChunkTimeoutError(RetryableError):
    """A chunk ran out of its job's time: the attempt ends cleanly and the chunk is tried
    again later with twice the time."""


class StaleStateError(FatalError):
    """A workflow transition found its record in another state than it expected: the actor
    is stale (another moved the world on) and must stop, not retry."""


class StaleMapError(RetryableError):
    """A write was routed with a shard map older than the one that last moved the shard: the
    caller reloads its map and tries again (a chunk is run again with the new map)."""


class ShardFrozenError(RetryableError):
    """The shard is frozen for a moment while it moves to another server: try again shortly
    (the write then goes to the shard's new home)."""


def first_line(exc: BaseException, limit: int = 1000) -> str:
    """The first line of ``exc``'s message (its class name when it has none), at most
    ``limit`` characters: a cause quoted inside another one-line error (long enough for one
    that names two paths and says what to do: at 300 a deep path cut off its advice)."""
    return (str(exc).splitlines() or [type(exc).__name__])[0][:limit]
