"""Writing the synthetic legacy data set with LOAD DATA LOCAL INFILE (see ``generate``).

The generator writes into a database the operator chose to fill with synthetic
data, so it keeps LOAD DATA's speed on one dedicated connection opened with
``infile=True`` for these loads only; every connection that reads the legacy
database (``loaders.migration.legacy``) is opened without it, so a legacy server can never
read a worker's files.
"""

from __future__ import annotations

import functools
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import pymysql

from loaders.migration.legacy_schema import LEGACY_COLUMNS, LEGACY_TABLES, create_legacy_schema
from shardfarm.errors import DatabaseError
from shardfarm.mysql.connect import translate
from shardfarm.mysql.db import connect, where
from shardfarm.mysql.dsn import DSN

if TYPE_CHECKING:
    from demo.legacygen.clean import LegacyData

ZERO = -1                      # created_at sentinel for '0000-00-00 00:00:00'
LOAD_ROWS = 50_000             # rows per LOAD DATA file

_SEP, _EOL, _NULL = "\ue000", "\ue001", "\ue002"   # private-use markers the data never holds
_ESCAPES = ((b"\\", b"\\\\"), (b"\t", b"\\t"), (b"\n", b"\\n"), (b"\r", b"\\r"),
            (b"\0", b"\\0"), (_SEP.encode(), b"\t"), (_EOL.encode(), b"\n"),
            (_NULL.encode(), b"\\N"))


@functools.lru_cache(maxsize=1 << 16)
def _when(t: int | None) -> str:
    """``created_at`` as LOAD DATA text (memoised: bursts repeat the same second)."""
    if t is None:
        return _NULL
    if t == ZERO:
        return "0000-00-00 00:00:00"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t))


def _tsv_fully_escaped(rows: list[list]) -> bytes:
    """Rows in LOAD DATA's default format, every special escaped: tab-separated, backslash,
    tab, newline, carriage return and NUL backslash-escaped, \\N for NULL (the text is
    arbitrary, unlike the JSON cells of the migration's writer).

    Joined with marker characters, encoded, then escaped in bulk on bytes (3x faster
    than escaping cell by cell).
    """
    text = _EOL.join([_SEP.join([_NULL if v is None else str(v) for v in r[:-1]])
                      + _SEP + _when(r[-1]) for r in rows]) + _EOL
    data = text.encode("utf-8")
    if rows and data.count(_SEP.encode()) != len(rows) * (len(rows[0]) - 1):
        raise ValueError("legacy data holds a private-use marker character")
    for old, new in _ESCAPES:
        data = data.replace(old, new)
    return data


def write(dsn: DSN, data: LegacyData, progress: Callable[[int], object] | None = None) -> None:
    """Recreate the legacy tables and bulk-load ``data`` with LOAD DATA LOCAL INFILE.

    One thread loads a file while the caller's thread writes the next one.
    """
    create_legacy_schema(dsn, drop=True)
    conn = connect(dsn, infile=True)  # only for the files this function writes and names
    try:
        with conn.cursor() as cur, tempfile.TemporaryDirectory(prefix="legacy-") as tmp, \
                ThreadPoolExecutor(1, thread_name_prefix="legacy-load") as loader:
            # zero dates need a sql_mode without NO_ZERO_DATE, NO_ZERO_IN_DATE and STRICT_*
            cur.execute("SET SESSION sql_mode = 'NO_ENGINE_SUBSTITUTION'")
            pending = None
            for i, (table, chunk) in enumerate(_chunks(data)):
                path = os.path.join(tmp, f"{i % 2}.tsv")  # the other file may be loading
                with open(path, "wb") as fh:
                    fh.write(_tsv_fully_escaped(chunk))
                if pending:
                    pending.result()
                pending = loader.submit(_load, cur, table, path, len(chunk), progress)
            if pending:
                pending.result()
    except pymysql.MySQLError as exc:
        raise translate(exc, where(dsn)) from None
    finally:
        conn.close()


def _chunks(data: LegacyData) -> Iterator[tuple[str, list[list]]]:
    """``(table, rows)`` in pieces of at most ``LOAD_ROWS``, table by table."""
    for table in LEGACY_TABLES:
        rows = data.tables[table]
        for lo in range(0, len(rows), LOAD_ROWS):
            yield table, rows[lo:lo + LOAD_ROWS]


def _load(cur, table: str, path: str, rows: int,
          progress: Callable[[int], object] | None) -> None:
    """Load one file; a skipped row or any warning is an error."""
    loaded = cur.execute(f"LOAD DATA LOCAL INFILE %s INTO TABLE `{table}` CHARACTER SET "
                         f"utf8mb4 ({', '.join(LEGACY_COLUMNS[table])})", (path,))
    cur.execute("SHOW WARNINGS LIMIT 1")
    warning = cur.fetchone()
    if loaded != rows or warning:
        raise DatabaseError(f"loading legacy {table}: {loaded} of {rows} rows loaded "
                            f"({warning[2] if warning else 'no warning'})")
    if progress:
        progress(rows)
