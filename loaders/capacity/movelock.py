"""One move of a shard at a time: ``farm shards move`` holds a lock per shard it moves.

Two moves of the same shard at once (a second terminal, a colleague, overlapping ranges)
would each catch up and copy again after the other flipped: the second's catch-up then
replaces rows the application wrote to the new master since the flip with the source's
older copy. So a move takes, for every shard of its range, a named lock
(``GET_LOCK``) on one connection to the control database that it keeps until it ends;
a move that finds one of them held is refused at once, in one line, and changes
nothing. The locks belong to that connection: a move that is killed loses them with
its connection, so running it again is never blocked by a dead move.

That connection sits idle while the move copies, so it is exempt from the pool's short
idle limit (``LOCK_IDLE_TIMEOUT`` instead of ``pool.IDLE_TIMEOUT``, which a copy of more
than 30 s outlived: the server closed the connection and the locks went with it). It can
still be lost (a server restart, a ``KILL``, a network cut), so the move checks that it
still holds every lock (``MoveLock.check``) before each step that a second move must not
interleave with: the catch-up, the freeze and the flip; and the lock of one shard
(``MoveLock.check(before, shard)``, one short statement) before each range the catch-up
compares and before each source copy ``--drop-source`` drops, so a lock lost during a long
catch-up or drop stops it there, not at the next step. If not, it stops in one line.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import pymysql

from shardfarm.errors import StaleStateError
from shardfarm.mysql import pool as pools
from shardfarm.mysql.pool import Pool

LOCK_IDLE_TIMEOUT = 7 * 86_400  # seconds the lock connection may sit idle (a long copy)
CHECK_BATCH = 256  # locks checked per statement


class MoveInProgressError(StaleStateError):
    """Another move holds one of the shards: this one did nothing."""


class MoveLockLostError(StaleStateError):
    """The move no longer holds its locks (their connection dropped): it stops."""


def lock_name(database: str | None, shard: int) -> str:
    """The lock of ``shard`` among the moves of the control database ``database`` (64
    characters at most, as the server wants)."""
    farm = hashlib.sha1((database or "").encode()).hexdigest()[:16]
    return f"shardfarm.move.{farm}.{shard}"


class MoveLock:
    """The move locks of shards ``lo..hi``, held on one control-database connection."""

    def __init__(self, cur: pymysql.cursors.Cursor, database: str | None, lo: int,
                 hi: int) -> None:
        self.cur, self.lo, self.hi = cur, lo, hi
        self.names = [lock_name(database, s) for s in range(lo, hi + 1)]

    def check(self, before: str, shard: int | None = None) -> None:
        """``MoveLockLostError`` (one line) unless this connection still holds every lock (or
        ``shard``'s alone); ``before``: the step the move was about to take (named in the
        message)."""
        names = self.names if shard is None else [self.names[shard - self.lo]]
        try:
            held = True
            for i in range(0, len(names), CHECK_BATCH):
                batch = names[i:i + CHECK_BATCH]
                self.cur.execute("SELECT " + ", ".join(
                    ["IS_USED_LOCK(%s) <=> CONNECTION_ID()"] * len(batch)), batch)
                held = held and all(self.cur.fetchone())
            why = "another connection holds one of them, or none does"
        except pymysql.MySQLError as exc:
            held, why = False, f"its connection dropped: error {exc.args[0]}"
        if not held:
            raise MoveLockLostError(
                f"the move of shards {self.lo}-{self.hi} lost its locks on the control "
                f"database ({why}) before {before}; it stopped there so that no other move "
                "of these shards interleaves with it: run the same move again")


@contextmanager
def moving(pool: Pool, lo: int, hi: int) -> Iterator[MoveLock]:
    """Hold the move lock of every shard ``lo..hi`` for the block (``MoveInProgressError``
    if another move holds one); the block gets the ``MoveLock`` to check it still does."""
    with pool.connection() as conn, conn.cursor() as cur:
        lock = MoveLock(cur, pool.database, lo, hi)
        for shard, name in zip(range(lo, hi + 1), lock.names, strict=True):
            cur.execute("SELECT GET_LOCK(%s, 0), IS_USED_LOCK(%s)", (name, name))
            got, holder = cur.fetchone()
            if got != 1:
                raise MoveInProgressError(
                    f"shard {shard} is being moved by another 'farm shards move' (its control "
                    f"database connection {holder}); nothing done: wait until it ends, then "
                    "run this again")
        cur.execute("SET SESSION wait_timeout = %s", (LOCK_IDLE_TIMEOUT,))
        yield lock  # an error in the block closes the connection, and the locks go with it
        try:
            cur.execute("SELECT RELEASE_ALL_LOCKS()")
            cur.execute("SET SESSION wait_timeout = %s", (pools.IDLE_TIMEOUT,))
        except pymysql.MySQLError:  # the connection dropped: the locks went with it
            with suppress(pymysql.MySQLError):
                conn.close()  # and the pool does not keep it
