"""Stream one shard table out of MySQL: a dedicated connection, one consistent snapshot, an
unbuffered server-side cursor, so memory does not grow with the table.

For JSON Lines the server builds each line around the stored JSON text
(``CONCAT`` of the ID fields and ``data`` as it is): the client never parses or
re-encodes a document, it only joins a batch of lines and compresses it.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import TypeVar

import pymysql
import pymysql.cursors

from shardfarm.errors import FatalError, UsageError
from shardfarm.mysql.connect import Where, open_connection, refused_infile, translate
from shardfarm.mysql.dsn import Host
from shardfarm.mysql.grouped import split_joined
from sharding import ids
from sharding.schema import MAPPING_TABLES, OBJECT_TABLES, shard_table

T = TypeVar("T")
EXPORT_TABLES: tuple[str, ...] = (*OBJECT_TABLES, *MAPPING_TABLES)
BATCH_ROWS = 2000
GROUP_MAX = 256 * 1024  # bytes of one from ID's lines joined by the server
GROUP_ROWS = 32  # such rows a batch: at most 8 MiB
NET_WRITE_TIMEOUT = 600  # a slow upload may hold the cursor; the server must not give up on us


def prefetched(batches: Iterator[T], depth: int = 2) -> Iterator[T]:
    """``batches`` read ahead on a thread, at most ``depth`` batches held.

    Reading from MySQL and compressing each take about half of an export's time,
    and both release the GIL (socket reads, zlib), so they overlap. An error in
    the reader is raised here; closing this generator early stops the reader.
    """
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    done = object()

    def put(item: object) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.5)
                return True
            except queue.Full:
                continue
        return False

    def read() -> None:
        try:
            for batch in batches:
                if not put(batch):
                    return
            put(done)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            put(exc)

    reader = threading.Thread(target=read, name="export-reader", daemon=True)
    reader.start()
    try:
        while (item := q.get()) is not done:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        reader.join()


def check_tables(tables: list[str]) -> list[str]:
    """The tables to export (default: every object and mapping table), in a stable order."""
    tables = tables or list(EXPORT_TABLES)
    unknown = [t for t in tables if t not in EXPORT_TABLES]
    if unknown:
        names = ", ".join(repr(t)[1:-1][:64] for t in unknown)
        raise UsageError(f"cannot export {names} (known: {', '.join(EXPORT_TABLES)})")
    return list(dict.fromkeys(tables))


@contextmanager
def snapshot(host: Host, shard: int) -> Iterator[pymysql.Connection]:
    """A dedicated (unpooled) connection inside ``START TRANSACTION WITH CONSISTENT SNAPSHOT``.

    Text comes back as raw bytes (``use_unicode=False``): the stored UTF-8 is
    written out as it is.
    """
    where = Where(host.name, host.host, host.port, host.user)
    conn = open_connection(where, host.password, tls=host.tls_args(), use_unicode=False,
                           autocommit=True, read_timeout=NET_WRITE_TIMEOUT,  # stalled: retry
                           session=f", net_write_timeout = {NET_WRITE_TIMEOUT}")
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
        yield conn
        with conn.cursor() as cur:
            cur.execute("COMMIT")
    except pymysql.MySQLError as exc:
        raise translate(exc, where, shard) from None
    except RuntimeError as exc:
        if refused_infile(exc):  # the server asked for a local file: never sent
            raise translate(exc, where, shard) from None
        raise
    finally:
        with suppress(Exception):
            conn.close()


def nonempty(conn: pymysql.Connection, table: str, shards: list[int]) -> set[int]:
    """Which of ``shards`` hold a row of ``table``, in one round trip (inside the snapshot,
    so an empty part is exactly what a full read would have found)."""
    if not shards:
        return set()
    sql = " UNION ALL ".join(f"SELECT {int(s)} FROM DUAL WHERE EXISTS (SELECT 1 FROM "
                             f"{shard_table(s, table)})" for s in shards)
    with conn.cursor() as cur:
        cur.execute(sql)
        return {int(r[0]) for r in cur.fetchall()}


def _object_line_sql(table: str, shard: int) -> tuple[str, tuple]:
    base = ids.encode(shard, OBJECT_TABLES[table], 1) - 1
    sql = (f"SELECT CONCAT('{{\"id\":', %s + local_id, ',\"shard\":{shard},\"local_id\":', "
           f"local_id, ',\"active\":', IF(active, 'true', 'false'), ',\"data\":', data, '}}') "
           f"FROM {shard_table(shard, table)} ORDER BY local_id")
    return sql, (base,)


def _mapping_line_sql(table: str, shard: int) -> tuple[str, tuple]:
    sql = ("SELECT CONCAT('{\"from_id\":', from_id, ',\"to_id\":', to_id, "
           f"',\"sequence\":', sequence, '}}') FROM {shard_table(shard, table)} "
           "ORDER BY from_id, to_id")
    return sql, ()


def _one_line(line: bytes) -> bytes:
    """A stored document with raw line breaks (legal JSON whitespace) kept on one line."""
    return line.replace(b"\r", b" ").replace(b"\n", b" ")


def _mapping_group_sql(table: str, shard: int) -> str:
    line = ("CONCAT('{\"from_id\":', from_id, ',\"to_id\":', to_id, ',\"sequence\":', "
            "sequence, '}')")
    return (f"SELECT COUNT(*), from_id, GROUP_CONCAT(CONCAT({line}, '\\n') SEPARATOR '') "
            f"FROM {shard_table(shard, table)} FORCE INDEX (PRIMARY) GROUP BY from_id "
            "ORDER BY from_id")


def mapping_lines(conn: pymysql.Connection, table: str, shard: int
                  ) -> Iterator[tuple[bytes, int]]:
    """Mapping-table JSON Lines, the server joining each from ID's lines into one row
    (``GROUP_CONCAT`` in primary-key order, capped at ``GROUP_MAX`` bytes): the client
    handles a row per from ID, not per line. A from ID whose lines the server cut
    (``shardfarm.mysql.grouped``) is read again line by line after the rest (same
    snapshot), so memory stays bounded."""
    big: list[int] = []
    with conn.cursor(pymysql.cursors.SSCursor) as cur:
        cur.execute(f"SET SESSION group_concat_max_len = {GROUP_MAX}")
        cur.execute(_mapping_group_sql(table, shard))
        while rows := cur.fetchmany(GROUP_ROWS):
            whole, n, cut = split_joined(rows, b"\n")  # each line ends in a newline
            big += cut
            if whole:
                yield b"".join(whole), n
    sql, _ = _mapping_line_sql(table, shard)
    where = sql.replace(" ORDER BY", " WHERE from_id = %s ORDER BY")
    for from_id in big:
        yield from _line_batches(conn, table, shard, where, (from_id,), BATCH_ROWS)


def lines(conn: pymysql.Connection, table: str, shard: int,
          batch: int = BATCH_ROWS) -> Iterator[tuple[bytes, int]]:
    """``(bytes, rows)`` batches of JSON Lines (each line ends with ``\\n``): objects in key
    order, mappings by from ID (``mapping_lines``)."""
    if table not in OBJECT_TABLES:
        return mapping_lines(conn, table, shard)
    sql, params = _object_line_sql(table, shard)
    return _line_batches(conn, table, shard, sql, params, batch)


def _line_batches(conn: pymysql.Connection, table: str, shard: int, sql: str, params: tuple,
                  batch: int) -> Iterator[tuple[bytes, int]]:
    """``(bytes, rows)`` batches of the one-line-a-row result of ``sql``."""
    with conn.cursor(pymysql.cursors.SSCursor) as cur:
        cur.execute(sql, params)
        while True:
            rows = cur.fetchmany(batch)
            if not rows:
                return
            try:
                blob = b"\n".join([r[0] for r in rows])
            except TypeError:  # CONCAT gave NULL: a line longer than max_allowed_packet
                raise FatalError(f"a row of shard {shard} {table} is larger than the "
                                 "server's max_allowed_packet; raise it to export") from None
            if blob.count(b"\n") != len(rows) - 1 or b"\r" in blob:
                blob = b"\n".join([_one_line(r[0]) for r in rows])
            yield blob + b"\n", len(rows)


def columns(conn: pymysql.Connection, table: str, shard: int,
            batch: int = 50_000) -> Iterator[dict[str, list]]:
    """Batches of column lists in key order (for columnar formats such as Parquet)."""
    q = shard_table(shard, table)
    if table in OBJECT_TABLES:
        base = ids.encode(shard, OBJECT_TABLES[table], 1) - 1
        sql, names = (f"SELECT local_id, active, data FROM {q} ORDER BY local_id",
                      ("local_id", "active", "data"))
    else:
        base, sql, names = None, (f"SELECT from_id, to_id, sequence FROM {q} "
                                  "ORDER BY from_id, to_id"), ("from_id", "to_id", "sequence")
    with conn.cursor(pymysql.cursors.SSCursor) as cur:
        cur.execute(sql)
        while True:
            rows = cur.fetchmany(batch)
            if not rows:
                return
            cols = {n: [r[i] for r in rows] for i, n in enumerate(names)}
            if base is not None:
                cols = {"id": [base + x for x in cols["local_id"]],
                        "shard": [shard] * len(rows), "local_id": cols["local_id"],
                        "active": [bool(a) for a in cols["active"]], "data": cols["data"]}
            yield cols
