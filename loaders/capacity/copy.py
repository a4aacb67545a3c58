"""Copying a shard's tables to another server, range by range, and comparing the two copies.

A table is cut into ranges of its first primary-key column (``[lo, hi)``, ``None``
open-ended), so every row of one range is found by one index range scan on both
servers. ``copy_range`` streams a range from the source, each row formatted as a line
of ``LOAD DATA`` text by the source server itself (unescaped: see ``FIELD``), and
writes it to the destination in batches with ``LOAD DATA LOCAL INFILE … REPLACE``
(idempotent: a chunk may run twice); with ``replace_all`` it first deletes the
destination's range (rows deleted at the source meanwhile go too). ``digest`` is a
range's row count and an order-free 64-bit hash of its rows (the product of each row's
CRC32 and CRC32C), computed by each server itself.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import pymysql.cursors

from farmcore.context import ChunkContext
from farmcore.ledger import Outcome
from shardfarm.mysql.dsn import Host
from shardfarm.mysql.grouped import split_joined
from shardfarm.mysql.infile import temp_tsv
from shardfarm.mysql.pool import retried
from sharding import fencing
from sharding.router import Router
from sharding.schema import DIRECTORY_TABLES, MAPPING_TABLES, OBJECT_TABLES, shard_table

HANDLER = "loaders.capacity.copy.copy_chunk"
BATCH = 20_000
GROUP_MAX = 4 * 1024 * 1024  # bytes of one from ID's lines joined by the server
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


# Object rows hold JSON, which MariaDB keeps valid (a CHECK on every JSON column) and which
# cannot hold a raw control character other than whitespace; mapping rows hold integers.
# So the unit and record separators never occur in a row: lines need no escaping.
FIELD, LINE = "\x1f", "\x1e"


def _selected(table: str) -> str:
    """What a copy reads: a directory row as is; an object or mapping row as one line of
    ``LOAD DATA`` text built by the source server (fields separated by ``FIELD``, no
    escaping), so the copier only moves bytes instead of decoding every value."""
    cols = COLUMNS[table]
    if table in DIRECTORY_TABLES:
        return ", ".join(cols)
    return f"CONCAT_WS(CHAR({ord(FIELD)} USING utf8mb4), {', '.join(cols)})"


def _stream(router: Router, host: Host, shard: int, table: str, lo: Bound, hi: Bound
            ) -> Iterator[tuple[list, int]]:
    """The range's rows from ``host`` in batches of about ``BATCH`` rows (one unbuffered
    read), each with its row count: a directory table's as tuples; an object table's as one
    line of text each; a mapping table's as the lines of each from ID joined by the server
    (``_joined``)."""
    where, args = _where(table, lo, hi)
    if table in MAPPING_TABLES:
        yield from _joined(router, host, shard, table, where, args)
        return
    sql = f"SELECT {_selected(table)} FROM {shard_table(shard, table)}{where}"
    with router.connection(host, shard) as conn, conn.cursor(pymysql.cursors.SSCursor) as cur:
        cur.execute(sql, args)
        while batch := cur.fetchmany(BATCH):
            yield [r if table in DIRECTORY_TABLES else r[0] + LINE for r in batch], len(batch)


def _joined(router: Router, host: Host, shard: int, table: str, where: str, args: list
            ) -> Iterator[tuple[list[str], int]]:
    """A mapping range as text, the server joining each from ID's lines into one row
    (``GROUP_CONCAT`` along the primary key, each line ending in ``LINE``): the client
    decodes a row per from ID, not per line. A from ID whose lines the server cut at
    ``GROUP_MAX`` (``shardfarm.mysql.grouped``) is read again line by line after the rest."""
    q, line = shard_table(shard, table), _selected(table)
    sql = (f"SELECT COUNT(*), from_id, GROUP_CONCAT(CONCAT({line}, CHAR({ord(LINE)} USING "
           f"utf8mb4)) SEPARATOR '') FROM {q}{where} GROUP BY from_id")
    cut: list[int] = []
    with router.connection(host, shard) as conn:
        with conn.cursor(pymysql.cursors.SSCursor) as cur:
            cur.execute(f"SET SESSION group_concat_max_len = {GROUP_MAX}")
            cur.execute(sql, args)
            batch, rows = [], 0
            while groups := cur.fetchmany(max(1, BATCH // 64)):
                whole, n, lost = split_joined(groups, LINE)
                batch += whole
                rows += n
                cut += lost
                if rows >= BATCH:
                    yield batch, rows
                    batch, rows = [], 0
            if batch:
                yield batch, rows
        for from_id in cut:
            with conn.cursor(pymysql.cursors.SSCursor) as cur:
                cur.execute(f"SELECT {line} FROM {q} WHERE from_id = %s", (from_id,))
                while lines := cur.fetchmany(BATCH):
                    yield [r[0] + LINE for r in lines], len(lines)


def _writer(table: str, shard: int) -> Callable[[pymysql.cursors.Cursor, list], None]:
    """How a batch goes in: ``LOAD DATA … REPLACE`` for object and mapping tables, a
    multi-row ``REPLACE`` for the small directory table."""
    cols, q = COLUMNS[table], shard_table(shard, table)
    if table in DIRECTORY_TABLES:
        sql = f"REPLACE INTO {q} ({', '.join(cols)}) VALUES ({', '.join(['%s'] * len(cols))})"
        return lambda cur, rows: cur.executemany(sql, rows)

    def load(cur: pymysql.cursors.Cursor, rows: list[str]) -> None:
        with temp_tsv("".join(rows)) as path:
            cur.execute(f"LOAD DATA LOCAL INFILE %s REPLACE INTO TABLE {q} CHARACTER SET "
                        f"utf8mb4 FIELDS TERMINATED BY X'{ord(FIELD):02x}' ESCAPED BY '' "
                        f"LINES TERMINATED BY X'{ord(LINE):02x}' ({', '.join(cols)})", (path,))
    return load


def copy_range(ctx: ChunkContext | None, router: Router, src: Host, dst: Host, shard: int,
               table: str, lo: Bound, hi: Bound, replace_all: bool = False) -> int:
    """Copy one range from ``src`` to ``dst`` (fenced when run by a chunk); returns rows.
    Reading the next batch overlaps loading the last one.

    With ``replace_all`` the destination's range is emptied first, in the first batch's
    transaction (rows the source no longer has disappear)."""
    where, args = _where(table, lo, hi)
    put = _writer(table, shard)
    pending_delete, n = replace_all, 0

    def write(cur: pymysql.cursors.Cursor, rows: list, first: bool) -> None:
        if ctx is not None:
            fencing.check(cur, shard, ctx.token)
        if first:
            cur.execute(f"DELETE FROM {shard_table(shard, table)}{where}", args)
        if rows:
            put(cur, rows)

    def send(rows: list, first: bool) -> None:
        retried(lambda: router.connection(dst, shard, infile=True),
                lambda cur: write(cur, rows, first), transaction=True, policy=router.policy)
    # the source formats the next batch while the destination loads this one: one load in
    # flight at a time (batches land in order), two batches in memory at most
    with ThreadPoolExecutor(1, thread_name_prefix="copy-load") as loader:
        loading: Future | None = None
        for rows, count in _stream(router, src, shard, table, lo, hi):
            if loading is not None:
                loading.result()
            loading = loader.submit(send, rows, pending_delete)
            pending_delete, n = False, n + count
            if ctx is not None:
                ctx.check()
        if loading is not None:
            loading.result()
    if pending_delete:
        send([], True)
    return n


def digest(router: Router, host: Host, shard: int, table: str, lo: Bound = None,
           hi: Bound = None) -> tuple[int, int]:
    """``(rows, hash)`` of a range on ``host``, computed by the server: the XOR over its rows
    of the product of each row's CRC32 and CRC32C (64 bits). Not the two side by side: a
    CRC is linear, so the same bit flipped in an even number of rows (a flag flipped on
    all of them) changes every row's CRCs by the same bits and their XOR not at all; the
    product is not linear."""
    row = "CONCAT_WS(0x1f, " + ", ".join(f"IFNULL({c}, '')" for c in COLUMNS[table]) + ")"
    where, args = _where(table, lo, hi)
    found = router.query(host, f"SELECT COUNT(*), IFNULL(BIT_XOR(CRC32({row}) * CRC32C({row})),"
                         f" 0) FROM {shard_table(shard, table)}{where}", args, shard)[0]
    return int(found[0]), int(found[1])


def copy_chunk(ctx: ChunkContext, shard: int, table: str, lo: Bound, hi: Bound, src: str,
               dst: str) -> Outcome:
    """Chunk handler: copy one range of one shard table from host ``src`` to host ``dst``."""
    m = ctx.router.shardmap
    n = copy_range(ctx, ctx.router, m.hosts[src], m.hosts[dst], shard, table, lo, hi)
    return Outcome(rows_read=n, rows_written=n, counts={table: n})
