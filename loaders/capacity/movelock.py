"""One move of a shard at a time: ``farm shards move`` holds a lock per shard it moves.

Two moves of the same shard at once (a second terminal, a colleague, overlapping ranges)
would each catch up and copy again after the other flipped: the second's catch-up then
replaces rows the application wrote to the new master since the flip with the source's
older copy. So a move takes, for every shard of its range, a named lock
(``GET_LOCK``) on one connection to the control database that it keeps until it ends;
a move that finds one of them held is refused at once, in one line, and changes
nothing. The locks belong to that connection: a move that is killed loses them with
its connection, so running it again is never blocked by a dead move.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager

from shardfarm.errors import StaleStateError
from shardfarm.mysql.pool import Pool


class MoveInProgressError(StaleStateError):
    """Another move holds one of the shards: this one did nothing."""


def lock_name(database: str | None, shard: int) -> str:
    """The lock of ``shard`` among the moves of the control database ``database`` (64
    characters at most, as the server wants)."""
    farm = hashlib.sha1((database or "").encode()).hexdigest()[:16]
    return f"shardfarm.move.{farm}.{shard}"


@contextmanager
def moving(pool: Pool, lo: int, hi: int) -> Iterator[None]:
    """Hold the move lock of every shard ``lo..hi`` for the block (``MoveInProgressError``
    if another move holds one)."""
    with pool.connection() as conn, conn.cursor() as cur:
        for shard in range(lo, hi + 1):
            name = lock_name(pool.database, shard)
            cur.execute("SELECT GET_LOCK(%s, 0), IS_USED_LOCK(%s)", (name, name))
            got, holder = cur.fetchone()
            if got != 1:
                raise MoveInProgressError(
                    f"shard {shard} is being moved by another 'farm shards move' (its control "
                    f"database connection {holder}); nothing done: wait until it ends, then "
                    "run this again")
        yield  # an error in the block closes the connection, and the locks go with it
        cur.execute("SELECT RELEASE_ALL_LOCKS()")
