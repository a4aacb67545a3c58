"""Fencing tokens checked by the shard itself, so a zombie cannot write after its successor.

Every write transaction of a chunk on a shard first records the chunk's fence
in ``chunk_fences`` on that shard (keeping the highest) and aborts if a higher
fence is already there. The row lock it takes serialises the owners of one
chunk on one shard until commit.

Every write transaction on a shard's master also checks ``shard_state`` first
(``check_map``, done by ``Router.run``): it share-locks the shard's one row, and
aborts with ``ShardFrozenError`` while a move freezes the shard, or with
``StaleMapError`` when it was routed with a shard map older than the version
that last moved the shard. A chunk routes with the map it started with (its
stamp), so a worker with a stale map can never write to a shard's old home.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardfarm.errors import FencedError, ShardFrozenError, StaleMapError
from sharding.schema import shard_table


@dataclass(frozen=True)
class FenceToken:
    """Which chunk is writing, and under which lease generation."""

    run_id: str
    chunk_id: int
    fence: int


def check(cur, shard: int, token: FenceToken | None) -> None:
    """Inside a shard transaction: record ``token`` and raise ``FencedError`` if it is stale.
    The fence is read with a locking read, as it is now: a consistent read would see the
    transaction's snapshot, which misses a fence raised (or first written) after it."""
    if token is None:
        return
    q = shard_table(shard, "chunk_fences")
    cur.execute(f"INSERT INTO {q} (run_id, chunk_id, fence) VALUES (%s, %s, %s)"
                " ON DUPLICATE KEY UPDATE fence = GREATEST(fence, VALUES(fence))",
                (token.run_id, token.chunk_id, token.fence))
    cur.execute(f"SELECT fence FROM {q} WHERE run_id = %s AND chunk_id = %s FOR UPDATE",
                (token.run_id, token.chunk_id))
    current = cur.fetchone()[0]
    if current > token.fence:
        raise FencedError(f"chunk {token.chunk_id} of run {token.run_id} was taken over "
                          f"(fence {token.fence} < {current}); this write is refused")


def check_map(cur, shard: int, map_version: int) -> None:
    """Inside a shard transaction: share-lock the shard's state and refuse the write if the
    shard is frozen for a move or was moved by a map newer than ``map_version``."""
    cur.execute(f"SELECT map_version, frozen FROM {shard_table(shard, 'shard_state')} "
                "WHERE id = 1 LOCK IN SHARE MODE")
    row = cur.fetchone()
    if row is None:
        return
    if row[1]:
        raise ShardFrozenError(f"shard {shard} is frozen while it moves; try again shortly")
    if map_version < row[0]:
        raise StaleMapError(f"shard {shard} was moved by shard map version {row[0]}; this "
                            f"write was routed with version {map_version} and is refused")


def set_state(cur, shard: int, map_version: int, frozen: bool) -> None:
    """Record the map version that places the shard here, and whether it is frozen (waits for
    every write transaction in flight on the shard to commit)."""
    cur.execute(f"INSERT INTO {shard_table(shard, 'shard_state')} (id, map_version, frozen) "
                "VALUES (1, %s, %s) ON DUPLICATE KEY UPDATE map_version = VALUES(map_version),"
                " frozen = VALUES(frozen)", (map_version, int(frozen)))


def state(cur, shard: int) -> tuple[int, bool]:
    """The shard's recorded ``(map_version, frozen)`` (``(0, False)`` if none)."""
    cur.execute(f"SELECT map_version, frozen FROM {shard_table(shard, 'shard_state')} "
                "WHERE id = 1")
    row = cur.fetchone()
    return (int(row[0]), bool(row[1])) if row else (0, False)
