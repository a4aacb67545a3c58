"""``farm rebalance board_followedby_users``: spread hot boards' followers over K shards.

Planning finds boards with more than ``threshold`` follower rows on their home
shard (one GROUP BY per shard over the ``(from_id, ...)`` index: every row is
read once). Each hot board is one chunk that walks the directory's state
machine; every step is idempotent and the state is durable, so a chunk that
died at any step is completed by the next run:

planned -> copying (rows copied in batches, keyset by user ID, fenced upserts)
        -> active (one transaction flips the directory: readers fan out)
        -> cleaned (the home shard's copies deleted in batches).

Every step is a compare-and-set on the state it expects, fenced on the home shard in
the same transaction (``Directory.transition``): an actor that stalled and was
overtaken gets ``StaleStateError`` and stops instead of moving the board backwards.
The flip to ``active`` holds the entry's lock while it checks that the listed shards
hold exactly the home rows (writers hold a share lock while they write both places,
so none is half way then); rows a crashed writer left only on a listed shard are
removed, and missing ones copied, before the flip.
"""

from __future__ import annotations

from collections import defaultdict

from farmcore.context import ChunkContext
from farmcore.ledger import ChunkSpec, Outcome
from shardfarm.errors import RetryableError, StaleStateError, UsageError
from sharding import fencing, ids
from sharding.hotspot import (
    DIRECTORY,
    FOLLOWERS,
    STATES,
    Directory,
    Entry,
    choose_shards,
    expect_state,
    follower_shard,
)
from sharding.router import Router
from sharding.schema import shard_table

HANDLER = "loaders.mappings.rebalance.rebalance_board"
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
    chunks = [ChunkSpec(table, {"board": b, "spread": spread}, rows=n) for b, n in boards
              if not (b in done and done[b].state == "cleaned")]
    return {"threshold": threshold, "spread": spread, "kinds": [table]}, chunks


def after_state(board: int, state: str) -> None:
    """Called after each durable step (tests make a run die here)."""


def rebalance_board(ctx: ChunkContext, board: int, spread: int) -> Outcome:
    """Chunk handler: take one hot board from wherever it stands to ``cleaned``."""
    directory = Directory(ctx.router)
    entry = directory.get(board) or directory.plan(board, choose_shards(ctx.router, board,
                                                                         spread))
    state, moved = entry.state, 0
    if state not in STATES:  # written by anyone: no step would run, and the chunk 'succeed'
        raise StaleStateError(
            f"hot board {board}: its directory entry on shard {ids.shard_of(board)} is in no "
            f"state the rebalance knows ({', '.join(STATES)}): repair its rows of {DIRECTORY} "
            "there, then run the rebalance again; nothing was moved")
    if state == "planned":
        directory.transition(board, "planned", "copying", ctx.token)
        after_state(board, state := "copying")
    if state == "copying":
        counts = _copy(ctx, entry)
        moved = sum(counts.values())
        directory.transition(board, "copying", "active", ctx.token, counts,
                             check=lambda cur: _converge(ctx, cur, entry))
        after_state(board, state := "active")
    if state == "active":
        _clean(ctx, board)
        directory.transition(board, "active", "cleaned", ctx.token)
        after_state(board, "cleaned")
    return Outcome(rows_read=moved, rows_written=moved,
                   counts={"board": board, "shards": sorted(entry.shards)})


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
            expect_state(cur, board, "active")
            fencing.check(cur, home, ctx.token)
            return cur.execute(f"DELETE FROM {q} WHERE from_id = %s LIMIT %s", (board, BATCH))
        if not ctx.router.run(home, tx):
            return
        ctx.check()


def _count(ctx: ChunkContext, shard: int, board: int, cur=None) -> int:
    sql = f"SELECT COUNT(*) FROM {shard_table(shard, FOLLOWERS)} WHERE from_id = %s"
    if cur is None:
        return ctx.router.query(ctx.router.host_for(shard), sql, (board,), shard)[0][0]
    cur.execute(sql, (board,))
    return cur.fetchone()[0]


def _converge(ctx: ChunkContext, cur, entry: Entry) -> None:
    """Inside the flip's transaction (the entry locked, so no writer is half way): make
    the listed shards hold exactly the home rows. Equal counts prove it, as every home
    row was copied or written both places; otherwise rows are compared batch by batch."""
    board = entry.board_id
    home_n = _count(ctx, ids.shard_of(board), board, cur)
    if home_n == sum(_count(ctx, s, board) for s in entry.shards):
        return
    last = -1
    while True:
        cur.execute(f"SELECT to_id, sequence FROM {shard_table(ids.shard_of(board), FOLLOWERS)}"
                    " WHERE from_id = %s AND to_id > %s ORDER BY to_id LIMIT %s",
                    (board, last, BATCH))
        rows = cur.fetchall()
        hi = rows[-1][0] if len(rows) == BATCH else None
        for shard in entry.shards:
            _converge_range(ctx, shard, entry, [r for r in rows if follower_shard(
                r[0], entry.shards) == shard], last, hi)
        if hi is None:
            break
        last = hi
    if home_n != sum(_count(ctx, s, board) for s in entry.shards):
        raise RetryableError("listed shards still differ from the home shard; flip later")


def _converge_range(ctx: ChunkContext, shard: int, entry: Entry, want: list[tuple],
                    lo: int, hi: int | None) -> None:
    """Make ``shard``'s rows of the board with ``lo < to_id <= hi`` exactly ``want``."""
    q = shard_table(shard, FOLLOWERS)
    board, top = entry.board_id, hi if hi is not None else 2**64 - 1
    wanted = {u for u, _ in want}

    def tx(cur) -> None:
        fencing.check(cur, shard, ctx.token)
        cur.execute(f"SELECT to_id FROM {q} WHERE from_id = %s AND to_id > %s AND to_id <= %s",
                    (board, lo, top))
        extra = [(board, u) for (u,) in cur.fetchall() if u not in wanted]
        if extra:
            cur.executemany(f"DELETE FROM {q} WHERE from_id = %s AND to_id = %s", extra)
        if want:
            cur.executemany(f"INSERT INTO {q} (from_id, to_id, sequence) VALUES (%s, %s, %s) "
                            "ON DUPLICATE KEY UPDATE sequence = VALUES(sequence)",
                            [(board, u, seq) for u, seq in want])
    ctx.router.run(shard, tx)
