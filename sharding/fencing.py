"""Fencing tokens checked by the shard itself, so a zombie cannot write after its successor.

Every write transaction of a chunk on a shard first records the chunk's fence
in ``chunk_fences`` on that shard (keeping the highest) and aborts if a higher
fence is already there. The row lock it takes serialises the owners of one
chunk on one shard until commit.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardfarm.errors import FencedError
from sharding.schema import shard_table


@dataclass(frozen=True)
class FenceToken:
    """Which chunk is writing, and under which lease generation."""

    run_id: str
    chunk_id: int
    fence: int


def check(cur, shard: int, token: FenceToken | None) -> None:
    """Inside a shard transaction: record ``token`` and raise ``FencedError`` if it is stale."""
    if token is None:
        return
    q = shard_table(shard, "chunk_fences")
    cur.execute(f"INSERT INTO {q} (run_id, chunk_id, fence) VALUES (%s, %s, %s)"
                " ON DUPLICATE KEY UPDATE fence = GREATEST(fence, VALUES(fence))",
                (token.run_id, token.chunk_id, token.fence))
    cur.execute(f"SELECT fence FROM {q} WHERE run_id = %s AND chunk_id = %s",
                (token.run_id, token.chunk_id))
    current = cur.fetchone()[0]
    if current > token.fence:
        raise FencedError(f"chunk {token.chunk_id} of run {token.run_id} was taken over "
                          f"(fence {token.fence} < {current}); this write is refused")
