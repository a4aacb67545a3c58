"""Fencing tokens checked by the shard itself, so a zombie cannot write after its successor.

Every write transaction of a chunk on a shard first records the chunk's fence
in ``chunk_fences`` on that shard (keeping the highest) and aborts if a higher
fence is already there. The row lock it takes serialises the owners of one
chunk on one shard until commit.

A chunk's writes to mod buckets (its lookups, and their removal) are fenced the same way:
each transaction on a mod server first records the fence (``check_mod``) in the
``chunk_fences`` of the first bucket of every range of the map it writes to
(``mod_home``), in bucket order. A process reloads no map that moves or re-cuts mod
bucket ranges while a run is active (``mapsource.bucket_change``), so a chunk and its
successor find the same homes.

Every write transaction on a shard's master also checks ``shard_state`` first
(``check_map``, done by ``Router.run``): it share-locks the shard's one row, and
aborts with ``ShardFrozenError`` while a move freezes the shard, or with
``StaleMapError`` when it was routed with a shard map older than the version
that last moved the shard. A chunk routes with the map it started with (its
stamp), so a worker with a stale map can never write to a shard's old home.

Both checks also come queued (``queue_check``, ``queue_check_map``) for a pipeline
(``shardfarm.mysql.pipeline``): the statements are the same, sent as the pipeline's
guards and judged before any write they guard is sent.

Fence rows outlive their run until ``farm runs prune`` has pruned it and a day has passed
since it ended (``forget``: a worker stalled longer than that is not expected to wake up
and write); on 4,096 shards a migration leaves a row per chunk on each.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from shardfarm.errors import FencedError, ShardFrozenError, StaleMapError
from shardfarm.mysql.pipeline import Pipeline, Result
from sharding.schema import mod_table, shard_table

if TYPE_CHECKING:
    from pymysql.cursors import Cursor

    from sharding.router import Router
    from sharding.shardmap import ShardMap

# run IDs in one DELETE's IN list, and shards or mod buckets of one server per transaction:
# a transaction deletes at most GROUP x RUNS_PER_STATEMENT x (chunks of a run per shard) rows
# (a few thousand for migrations, which leave a row per chunk on a shard)
RUNS_PER_STATEMENT = 20
GROUP = 16


@dataclass(frozen=True)
class FenceToken:
    """Which chunk is writing, and under which lease generation."""

    run_id: str
    chunk_id: int
    fence: int


def _fence_statements(q: str, token: FenceToken) -> list[tuple[str, tuple]]:
    """Record ``token`` (keeping the highest fence) in fences table ``q``, then read the
    fence, locked."""
    key = (token.run_id, token.chunk_id)
    return [(f"INSERT INTO {q} (run_id, chunk_id, fence) VALUES (%s, %s, %s)"
             " ON DUPLICATE KEY UPDATE fence = GREATEST(fence, VALUES(fence))",
             (*key, token.fence)),
            (f"SELECT fence FROM {q} WHERE run_id = %s AND chunk_id = %s FOR UPDATE", key)]


def _judge_fence(current: int, token: FenceToken) -> None:
    if current > token.fence:
        raise FencedError(f"chunk {token.chunk_id} of run {token.run_id} was taken over "
                          f"(fence {token.fence} < {current}); this write is refused")


def check(cur, shard: int, token: FenceToken | None) -> None:
    """Inside a shard transaction: record ``token`` and raise ``FencedError`` if it is stale.
    The fence is read with a locking read, as it is now: a consistent read would see the
    transaction's snapshot, which misses a fence raised (or first written) after it."""
    if token is None:
        return
    for sql, params in _fence_statements(shard_table(shard, "chunk_fences"), token):
        cur.execute(sql, params)
    _judge_fence(cur.fetchone()[0], token)


def mod_home(shardmap: ShardMap, bucket: int) -> int:
    """The mod bucket whose ``chunk_fences`` fences the writes to ``bucket``: the first
    bucket of its range in ``shardmap``."""
    return shardmap.mod_range(bucket).lo


def check_mod(cur, shardmap: ShardMap, buckets: Iterable[int], token: FenceToken | None
              ) -> None:
    """Inside a transaction on one mod server, before it writes to ``buckets``: record
    ``token`` at the home of each (``mod_home``, in order) and raise ``FencedError`` if it
    is stale there."""
    if token is None:
        return
    for home in sorted({mod_home(shardmap, b) for b in buckets}):
        for sql, params in _fence_statements(mod_table(home, "chunk_fences"), token):
            cur.execute(sql, params)
        _judge_fence(cur.fetchone()[0], token)


def queue_check(pipe: Pipeline, shard: int, token: FenceToken | None) -> None:
    """``check`` queued in a pipeline as a guard: judged before its writes are sent."""
    if token is None:
        return
    record, read = _fence_statements(shard_table(shard, "chunk_fences"), token)
    pipe.add(*record, guard=True)
    pipe.add(*read, check=lambda res: _judge_fence(res.rows[0][0], token), guard=True)


def _map_statement(shard: int) -> str:
    return (f"SELECT map_version, frozen FROM {shard_table(shard, 'shard_state')} "
            "WHERE id = 1 LOCK IN SHARE MODE")


def _judge_map(row: tuple | None, shard: int, map_version: int) -> None:
    if row is None:
        return
    if row[1]:
        raise ShardFrozenError(f"shard {shard} is frozen while it moves; try again shortly")
    if map_version < row[0]:
        raise StaleMapError(f"shard {shard} was moved by shard map version {row[0]}; this "
                            f"write was routed with version {map_version} and is refused")


def check_map(cur, shard: int, map_version: int) -> None:
    """Inside a shard transaction: share-lock the shard's state and refuse the write if the
    shard is frozen for a move or was moved by a map newer than ``map_version``."""
    cur.execute(_map_statement(shard))
    _judge_map(cur.fetchone(), shard, map_version)


def queue_check_map(pipe: Pipeline, shard: int, map_version: int) -> None:
    """``check_map`` queued in a pipeline as a guard: judged before its writes are sent."""
    pipe.add(_map_statement(shard), check=lambda res: _judge_map(
        res.rows[0] if res.rows else None, shard, map_version), guard=True)


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


def forget(router: Router, run_ids: Sequence[str], dry_run: bool = False) -> int:
    """Delete the ``chunk_fences`` rows of ``run_ids`` (runs that ended long ago) on every
    shard of the map and every mod bucket (a range's fences are in its first bucket, and
    ranges may have been cut otherwise when the runs wrote); with ``dry_run``, only count
    them. Returns the rows (a transaction retried after its commit's reply was lost counts
    0). ``RUNS_PER_STATEMENT`` runs at a time, each a transaction per ``GROUP`` shards or
    buckets of one server, sent as a few round trips; a shard frozen for a move refuses
    it (``ShardFrozenError``), as it refuses every write."""
    ids = sorted(set(run_ids))
    found: dict[tuple[str, str], int] = {}  # per table and first run ID: a retry counts once
    m = router.shardmap
    for i in range(0, len(ids), RUNS_PER_STATEMENT):
        queue = partial(_queue_forget, found, ids[i:i + RUNS_PER_STATEMENT], dry_run)
        for group in router.server_groups(list(m.shards()), most=GROUP):
            router.run_group(group, partial(_each_shard, queue), pipelined=True)
        for group in router.mod_groups(range(m.buckets), most=GROUP):
            router.run_mod(group[0], partial(_each_bucket, group, queue), multi=True)
    return sum(found.values())


def _queue_forget(found: dict[tuple[str, str], int], run_ids: list[str], dry_run: bool,
                  pipe: Pipeline, q: str) -> None:
    """Queue counting (``dry_run``) or deleting the rows of ``run_ids`` in fences table
    ``q``; its rows are recorded in ``found`` when it has run."""
    verb = "SELECT COUNT(*) FROM" if dry_run else "DELETE FROM"
    pipe.add(f"{verb} {q} WHERE run_id IN ({','.join(['%s'] * len(run_ids))})", run_ids,
             check=partial(_note, found, (q, run_ids[0]), dry_run))


def _each_shard(queue: Callable[[Pipeline, str], None], pipe: Pipeline, shard: int) -> None:
    """``queue`` the shard's fences table (``Router.run_group``'s pipelined callback)."""
    queue(pipe, shard_table(shard, "chunk_fences"))


def _note(found: dict[tuple[str, str], int], key: tuple[str, str], dry_run: bool,
          res: Result) -> None:
    """Record one statement's rows (counted, or deleted) under ``key``."""
    found[key] = int(res.rows[0][0]) if dry_run else res.rowcount


def _each_bucket(buckets: list[int], queue: Callable[[Pipeline, str], None],
                 cur: Cursor) -> None:
    """Inside a transaction on one mod server: ``queue`` each bucket's fences, then send."""
    pipe = Pipeline(cur)
    for b in buckets:
        queue(pipe, mod_table(b, "chunk_fences"))
    pipe.flush()
