"""Reading the legacy database: chunk plans by row count, chunk rows, rows by ID."""

from __future__ import annotations

import bisect
import contextlib
from collections.abc import Iterable, Iterator
from operator import itemgetter

import orjson
import pymysql
import pymysql.cursors

from loaders.migration.spec import LegacyTable
from shardfarm.bounds import BULK, Bound
from shardfarm.mysql.connect import refused_infile, translate
from shardfarm.mysql.db import connect, where
from shardfarm.mysql.dsn import DSN
from shardfarm.mysql.inlist import IN_LIST_MAX
from shardfarm.mysql.pool import retried

SIGNED_LIMIT = 1 << 63
IN_BATCH = IN_LIST_MAX
AGG_ROWS = 5000
_AGG = "CAST(JSON_ARRAYAGG({}) AS BINARY)"  # the rows as one JSON array, its UTF-8 bytes


class LegacyReader:
    """One connection to the legacy database, reused across the chunks a process runs;
    ``bound``: how long a read may wait (``shardfarm.bounds``: a status view's is bounded,
    a migration's is not)."""

    def __init__(self, dsn: DSN, bound: Bound = BULK) -> None:
        self.dsn = dsn
        self.bound = bound
        self._conn: pymysql.Connection | None = None

    def _connection(self) -> pymysql.Connection:
        if self._conn is None or not self._conn.open:
            # group_concat_max_len: JSON_ARRAYAGG is capped by it (1 MB default)
            self._conn = connect(self.dsn, read_timeout=self.bound.socket_timeout,
                                 write_timeout=self.bound.socket_timeout, session=(
                                     ", group_concat_max_len = @@max_allowed_packet"
                                     f"{self.bound.session()}"))
        return self._conn

    @contextlib.contextmanager
    def _session(self) -> Iterator[pymysql.Connection]:
        """The reader's connection; dropped (and the error named) when a statement fails."""
        try:
            yield self._connection()
        except pymysql.MySQLError as exc:
            self.close()
            if self.bound.timed_out(exc):
                raise self.bound.error(where(self.dsn)) from None
            raise translate(exc, where(self.dsn)) from None
        except RuntimeError as exc:
            self.close()
            if refused_infile(exc):  # a server asking for a local file: refused
                raise translate(exc, where(self.dsn)) from None
            raise

    def query(self, sql: str, params: Iterable = ()) -> list[tuple]:
        """Run a read, reconnecting and retrying on transient errors (the one retry policy)."""
        params = tuple(params)

        def read(cur: pymysql.cursors.Cursor) -> list[tuple]:
            cur.execute(sql, params)
            return list(cur.fetchall())
        return retried(self._session, read, policy=self.bound.policy())

    def close(self) -> None:
        """Drop the connection."""
        if self._conn is not None:
            with contextlib.suppress(pymysql.MySQLError):
                self._conn.close()
            self._conn = None

    def plan(self, table: LegacyTable, chunk_rows: int) -> Iterator[tuple[int, int, int]]:
        """Inclusive ranges of the first key column holding about ``chunk_rows`` rows each,
        with the rows each holds: ``(lo, hi, rows)``.

        Ranges are cut by row count, not ID span (IDs are sparse), and only where the
        first key column changes, so composite keys never straddle two chunks.
        """
        col = table.key[0]
        conn = connect(self.dsn)
        try:
            with conn.cursor(pymysql.cursors.SSCursor) as cur:
                cur.execute(f"SELECT `{col}`, COUNT(*) FROM `{table.name}` GROUP BY `{col}` "
                            f"ORDER BY `{col}`")
                yield from cut_ranges(cur, chunk_rows)
        except pymysql.MySQLError as exc:
            raise translate(exc, where(self.dsn)) from None
        finally:
            conn.close()

    def _aggregate(self, sql: str, plain: str, params: tuple) -> tuple[list[dict], int]:
        """One aggregated JSON value decoded by orjson in C (PyMySQL decodes each row packet
        in Python), each row a JSON object (the row's dict is built in C too); if it came
        back NULL or cut at ``group_concat_max_len``, row by row. ``sql`` sends the value as
        bytes (``_AGG``): orjson reads UTF-8, so a text would be decoded, then encoded again
        (and one emoji makes a page's text four bytes a character)."""
        (agg, n), = self.query(sql, params)
        if n and agg is not None:
            try:
                rows = orjson.loads(agg)
                if len(rows) == n:
                    return rows, n
            except orjson.JSONDecodeError:
                pass
        return [orjson.loads(r[0]) for r in self.query(plain, params)], n

    def rows(self, table: LegacyTable, cols: tuple[str, ...], where: str,
             params: Iterable) -> list[dict]:
        """Rows in key order, fetched ``AGG_ROWS`` at a time as one ``JSON_ARRAYAGG``.

        Pages follow the key (keyset pagination), so every page is one index range,
        however large the chunk. ``cols`` must include the key columns. DATETIMEs
        arrive as ``'YYYY-MM-DD HH:MM:SS'`` text (zero dates included) or ``None``.
        """
        params = tuple(params)
        key_of = itemgetter(*table.key)  # C-level sort key (a value, or a tuple for two columns)
        out: list[dict] = []
        after: tuple = ()
        while True:
            cond, args = (where, params) if not after else (
                f"({where}) AND {_after(table.key)}", params + _after_args(after))
            plain = (f"SELECT {_object(cols)} j FROM `{table.name}` WHERE {cond} "
                     f"ORDER BY {_cols(table.key)} LIMIT {AGG_ROWS}")
            page, n = self._aggregate(f"SELECT {_AGG.format('j')}, COUNT(*) FROM ({plain}) x",
                                      plain, args)
            out += page
            if n < AGG_ROWS:
                return sorted(out, key=key_of)
            last = key_of(max(page, key=key_of))
            after = last if len(table.key) > 1 else (last,)

    def chunk(self, table: LegacyTable, lo: int, hi: int) -> list[dict]:
        """Every row of ``table`` whose first key column is in ``[lo, hi]``, in key order."""
        return self.rows(table, table.columns, f"`{table.key[0]}` BETWEEN %s AND %s", (lo, hi))

    def by_ids(self, table: LegacyTable, ids: Iterable[int],
               cols: tuple[str, ...] | None = None) -> dict[int, dict]:
        """Rows of an object table by ``id`` (only ``cols`` if given), in batches.

        Batches stay below MariaDB's ``in_predicate_conversion_threshold``
        (``shardfarm.mysql.inlist``): from there on the list becomes a join that may scan
        the whole primary key. IDs of 2**63 and
        above go in batches of their own: one of them in a list of smaller IDs turns
        MariaDB's range read into a scan of the whole index (measured: 3 s, not 10 ms).
        """
        wanted = sorted(set(ids))
        cols = cols or table.columns
        out: dict[int, dict] = {}
        for part in _id_batches(wanted):
            where = f"id IN ({','.join(['%s'] * len(part))})"
            plain = f"SELECT {_object(cols)} FROM `{table.name}` WHERE {where}"
            batch, _ = self._aggregate(f"SELECT {_AGG.format(_object(cols))}, "
                                       f"COUNT(*) FROM `{table.name}` WHERE {where}", plain,
                                       tuple(part))
            out.update((row["id"], row) for row in batch)
        return out

    def count(self, table: LegacyTable) -> int:
        """Rows in ``table``."""
        return int(self.query(f"SELECT COUNT(*) FROM `{table.name}`")[0][0])


def _id_batches(ids: list[int]) -> Iterator[list[int]]:
    """Sorted ``ids`` in batches of ``IN_BATCH``, never mixing IDs below and above 2**63."""
    split = bisect.bisect_left(ids, SIGNED_LIMIT)
    for part in (ids[:split], ids[split:]):
        for i in range(0, len(part), IN_BATCH):
            yield part[i:i + IN_BATCH]


def _after(key: tuple[str, ...]) -> str:
    """``key > (%s, ...)`` spelled so the optimizer sees an index range (one or two columns)."""
    if len(key) == 1:
        return f"`{key[0]}` > %s"
    a, b = key
    return f"(`{a}` > %s OR (`{a}` = %s AND `{b}` > %s))"


def _after_args(last: tuple) -> tuple:
    return last if len(last) == 1 else (last[0], last[0], last[1])


def _cols(cols: Iterable[str]) -> str:
    return ", ".join(f"`{c}`" for c in cols)


def _object(cols: Iterable[str]) -> str:
    """``JSON_OBJECT`` of the columns, each under its own name (names from the spec)."""
    pairs = ", ".join(f"'{c}', `{c}`" for c in cols)
    return f"JSON_OBJECT({pairs})"


def cut_ranges(groups: Iterable[tuple[int, int]], chunk_rows: int
               ) -> Iterator[tuple[int, int, int]]:
    """Inclusive ``(lo, hi, rows)`` key ranges of about ``chunk_rows`` rows from
    ``(key, count)``; ``rows`` is how many the range held when it was cut."""
    lo = hi = None
    n = 0
    for key, count in groups:
        if lo is None:
            lo = key
        if n and n + count > chunk_rows:
            yield lo, hi, n
            lo, n = key, 0
        hi = key
        n += count
    if lo is not None:
        yield lo, hi, n
