"""Copying a shard's tables to another server, range by range, and comparing the two copies.

A table is cut into ranges of its first primary-key column (``[lo, hi)``, ``None``
open-ended), so every row of one range is found by one index range scan on both
servers. ``copy_range`` streams a range from the source and writes it to the
destination in batches with ``REPLACE`` (idempotent: a chunk may run twice);
``recopy_range`` first deletes the destination's range (rows deleted at the source
meanwhile go too). ``digest`` is a range's row count and an order-free 64-bit hash
of its rows, computed by each server itself.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pymysql.cursors

from farmcore.context import ChunkContext
from farmcore.ledger import Outcome
from shardfarm.mysql.dsn import Host
from sharding import fencing
from sharding.router import Router
from sharding.schema import DIRECTORY_TABLES, MAPPING_TABLES, OBJECT_TABLES, shard_table

HANDLER = "loaders.capacity.copy.copy_chunk"
BATCH = 5_000
Bound = int | None

COLUMNS: dict[str, tuple[str, ...]] = {
    **{t: ("local_id", "data", "active") for t in OBJECT_TABLES},
    **{t: ("from_id", "to_id", "sequence") for t in MAPPING_TABLES},
    **{t: ("board_id", "shard", "state", "row_count", "updated_at") for t in DIRECTORY_TABLES},
}  # every table a move copies (not the farm's own chunk_fences and shard_state), key first


def _where(table: str, lo: Bound, hi: Bound) -> tuple[str, list[int]]:
    key = COLUMNS[table][0]
    parts, args = [], []
    if lo is not None:
        parts.append(f"{key} >= %s")
        args.append(lo)
    if hi is not None:
        parts.append(f"{key} < %s")
        args.append(hi)
    return (" WHERE " + " AND ".join(parts)) if parts else "", args


def ranges(router: Router, host: Host, shard: int, table: str, rows_per_range: int
           ) -> list[tuple[Bound, Bound]]:
    """``[lo, hi)`` ranges of about ``rows_per_range`` rows covering the whole table."""
    q, key = shard_table(shard, table), COLUMNS[table][0]
    total = router.query(host, f"SELECT COUNT(*) FROM {q}", (), shard)[0][0]
    cuts: list[int] = []
    for offset in range(rows_per_range, total, rows_per_range):
        row = router.query(host, f"SELECT {key} FROM {q} ORDER BY {key} LIMIT 1 OFFSET %s",
                           (offset,), shard)
        if row and (not cuts or row[0][0] > cuts[-1]):
            cuts.append(row[0][0])
    bounds: list[Bound] = [None, *cuts, None]
    return list(itertools.pairwise(bounds))


def _stream(router: Router, host: Host, shard: int, table: str, lo: Bound, hi: Bound
            ) -> Iterator[list[tuple]]:
    """The range's rows from ``host`` in batches (one unbuffered read)."""
    where, args = _where(table, lo, hi)
    sql = f"SELECT {', '.join(COLUMNS[table])} FROM {shard_table(shard, table)}{where}"
    with router.connection(host, shard) as conn, conn.cursor(pymysql.cursors.SSCursor) as cur:
        cur.execute(sql, args)
        while batch := cur.fetchmany(BATCH):
            yield list(batch)


def copy_range(ctx: ChunkContext | None, router: Router, src: Host, dst: Host, shard: int,
               table: str, lo: Bound, hi: Bound, replace_all: bool = False) -> int:
    """Copy one range from ``src`` to ``dst`` (fenced when run by a chunk); returns rows.

    With ``replace_all`` the destination's range is emptied first, in the first batch's
    transaction (rows the source no longer has disappear)."""
    cols = COLUMNS[table]
    q = shard_table(shard, table)
    insert = (f"REPLACE INTO {q} ({', '.join(cols)}) VALUES "
              f"({', '.join(['%s'] * len(cols))})")
    where, args = _where(table, lo, hi)
    pending_delete, n = replace_all, 0

    def write(cur: pymysql.cursors.Cursor, rows: list[tuple], first: bool) -> None:
        if ctx is not None:
            fencing.check(cur, shard, ctx.token)
        if first:
            cur.execute(f"DELETE FROM {q}{where}", args)
        if rows:
            cur.executemany(insert, rows)
    for rows in _stream(router, src, shard, table, lo, hi):
        router.run_on(dst, lambda cur, r=rows, f=pending_delete: write(cur, r, f), shard)
        pending_delete, n = False, n + len(rows)
        if ctx is not None:
            ctx.check()
    if pending_delete:
        router.run_on(dst, lambda cur: write(cur, [], True), shard)
    return n


def digest(router: Router, host: Host, shard: int, table: str, lo: Bound = None,
           hi: Bound = None) -> tuple[int, int]:
    """``(rows, hash)`` of a range on ``host``: the hash XORs 64 bits of each row's MD5."""
    cols = ", ".join(f"IFNULL({c}, '')" for c in COLUMNS[table])
    where, args = _where(table, lo, hi)
    row = router.query(host, "SELECT COUNT(*), IFNULL(BIT_XOR(CAST(CONV(LEFT(MD5(CONCAT_WS("
                       f"0x1f, {cols})), 16), 16, 10) AS UNSIGNED)), 0) FROM "
                       f"{shard_table(shard, table)}{where}", args, shard)[0]
    return int(row[0]), int(row[1])


def copy_chunk(ctx: ChunkContext, shard: int, table: str, lo: Bound, hi: Bound, src: str,
               dst: str) -> Outcome:
    """Chunk handler: copy one range of one shard table from host ``src`` to host ``dst``."""
    m = ctx.router.shardmap
    n = copy_range(ctx, ctx.router, m.hosts[src], m.hosts[dst], shard, table, lo, hi)
    return Outcome(rows_read=n, rows_written=n, counts={table: n})
