"""``farm rebalance board_followedby_users``: spread hot boards' followers over K shards.

Planning finds boards with more than ``threshold`` follower rows on their home
shard (one GROUP BY per shard over the ``(from_id, ...)`` index: every row is
read once). Each hot board is one chunk that walks the directory's state
machine; every step is idempotent and the state is durable, so a chunk that
died at any step is completed by the next run:

planned -> copying (rows copied in batches, keyset by user ID, fenced upserts)
        -> active (one transaction flips the directory: readers fan out)
        -> cleaned (the home shard's copies deleted in batches).
"""

from __future__ import annotations

from collections import defaultdict

from shardfarm.context import ChunkContext
from shardfarm.errors import UsageError
from shardfarm.ledger import ChunkSpec, Outcome
from sharding import fencing, ids
from sharding.hotspot import FOLLOWERS, Directory, Entry, choose_shards, follower_shard
from sharding.router import Router
from sharding.schema import shard_table

HANDLER = "loaders.rebalance.rebalance_board"
TABLES = (FOLLOWERS,)
BATCH = 5000


def hot_boards(router: Router, threshold: int) -> list[tuple[int, int]]:
    """``(board_id, rows)`` of boards with more than ``threshold`` rows on their home shard."""
    out = []
    for shard in router.shardmap.shards():
        lo, hi = shard << ids.SHARD_SHIFT, ((shard + 1) << ids.SHARD_SHIFT) - 1
        out += router.query(router.host_for(shard),
                            f"SELECT from_id, COUNT(*) FROM {shard_table(shard, FOLLOWERS)} "
                            "WHERE from_id BETWEEN %s AND %s GROUP BY from_id "
                            "HAVING COUNT(*) > %s", (lo, hi, threshold), shard)
    return sorted(out)


def plan(router: Router, table: str, threshold: int, spread: int) -> tuple[dict, list[ChunkSpec]]:
    """One chunk per hot board not yet fully rebalanced."""
    if table not in TABLES:
        raise UsageError(f"cannot rebalance {table[:64]!r}; supported: {', '.join(TABLES)}")
    if threshold < 1 or spread < 2:
        raise UsageError("--threshold must be >= 1 and --spread >= 2")
    if spread >= router.shardmap.shard_count():
        raise UsageError(f"--spread {spread} needs more shards than the map's "
                         f"{router.shardmap.shard_count()}")
    boards = hot_boards(router, threshold)
    done = Directory(router).get_many([b for b, _ in boards])
    chunks = [ChunkSpec(table, {"board": b, "spread": spread}) for b, _ in boards
              if not (b in done and done[b].state == "cleaned")]
    return {"threshold": threshold, "spread": spread, "kinds": [table]}, chunks


def after_state(board: int, state: str) -> None:
    """Called after each durable step (tests make a run die here)."""


def rebalance_board(ctx: ChunkContext, board: int, spread: int) -> Outcome:
    """Chunk handler: take one hot board from wherever it stands to ``cleaned``."""
    directory = Directory(ctx.router)
    entry = directory.get(board) or directory.plan(board, choose_shards(ctx.router, board,
                                                                         spread))
    moved = 0
    if entry.state == "planned":
        directory.set_state(board, "copying")
        after_state(board, "copying")
        entry = directory.get(board)
    if entry.state == "copying":
        counts = _copy(ctx, entry)
        moved = sum(counts.values())
        directory.set_state(board, "active", counts)
        after_state(board, "active")
        entry = directory.get(board)
    if entry.state == "active":
        _clean(ctx, board)
        directory.set_state(board, "cleaned")
        after_state(board, "cleaned")
    return Outcome(rows_read=moved, rows_written=moved)


def _copy(ctx: ChunkContext, entry: Entry) -> dict[int, int]:
    """Copy every home row to its shard, in batches by user ID; returns rows per shard."""
    home = ids.shard_of(entry.board_id)
    q = shard_table(home, FOLLOWERS)
    counts: dict[int, int] = defaultdict(int)
    last = -1
    while True:
        rows = ctx.router.query(ctx.router.host_for(home),
                                f"SELECT to_id, sequence FROM {q} WHERE from_id = %s AND "
                                "to_id > %s ORDER BY to_id LIMIT %s",
                                (entry.board_id, last, BATCH), home)
        if not rows:
            return dict(counts)
        per_shard: dict[int, list[tuple]] = defaultdict(list)
        for user, seq in rows:
            per_shard[follower_shard(user, entry.shards)].append((entry.board_id, user, seq))
        for shard, batch in per_shard.items():
            _upsert(ctx, shard, batch)
            counts[shard] += len(batch)
        last = rows[-1][0]
        ctx.check()


def _upsert(ctx: ChunkContext, shard: int, rows: list[tuple]) -> None:
    q = shard_table(shard, FOLLOWERS)

    def tx(cur) -> None:
        fencing.check(cur, shard, ctx.token)
        cur.executemany(f"INSERT INTO {q} (from_id, to_id, sequence) VALUES (%s, %s, %s) "
                        "ON DUPLICATE KEY UPDATE sequence = VALUES(sequence)", rows)
    ctx.router.run(shard, tx)


def _clean(ctx: ChunkContext, board: int) -> None:
    """Delete the home shard's copies of a board now served from its listed shards."""
    home = ids.shard_of(board)
    q = shard_table(home, FOLLOWERS)
    while True:
        def tx(cur) -> int:
            fencing.check(cur, home, ctx.token)
            return cur.execute(f"DELETE FROM {q} WHERE from_id = %s LIMIT %s", (board, BATCH))
        if not ctx.router.run(home, tx):
            return
        ctx.check()
