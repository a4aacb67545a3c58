"""References for the full-size benchmark: each kind's rows written again by the servers'
own bulk tools, measured in the same run on the same fleet, right after the kind's run.

- ``LOAD DATA`` (migrate, reverse, rebalance): the rows the kind wrote are dumped (not
  timed), removed (a table the kind filled is truncated, its file made anew as the run
  found it, and opened again: ``delete``), and loaded back with ``LOAD DATA LOCAL
  INFILE``, one statement per table, ``THREADS`` client threads balanced by rows over both
  servers (the farm has 2 workers); the counts are checked afterwards. Migrate: every
  object, forward mapping and mod lookup table. Reverse: the reverse mapping tables.
  Rebalance: the follower rows that live away from their board's home shard (the rows it
  spread).
- Redis pipeline (feeds): the same home feeds (read back after the run) written again by
  ``THREADS`` clients, ``DEL`` + ``RPUSH`` per user in pipelines of ``REDIS_BATCH`` users.
  The feeds rebuild also reads follows and pins from the shards; the reference does not.
- ``INTO OUTFILE`` + ``gzip -6`` (export): every exported table of every shard, one
  ``SELECT … INTO OUTFILE`` each in key order (needs ``secure_file_priv``), then
  ``gzip -6`` of those files (``GZIP_FILES`` per process), one thread per server.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pymysql
import pymysql.cursors
from redis import Redis

from benchmarks._bench import (
    MAPPING_COLUMNS,
    MOD_COLUMNS,
    OBJECT_COLUMNS,
    Measure,
    statements_parallel,
)
from benchmarks._fleet import Fleet, open_every_table
from benchmarks._server import settle
from benchmarks.migrate_refs import balance, tsv_field
from farmcore import keys
from sharding import ids
from sharding.schema import MAPPING_TABLES, OBJECT_TABLES

THREADS = 2
REDIS_BATCH = 200
GZIP_FILES = 500
DELETE_BATCH = 500
FORWARD = [n for n, m in MAPPING_TABLES.items() if m.reverse_of is None]
REVERSE = [n for n, m in MAPPING_TABLES.items() if m.reverse_of is not None]
SPREAD = "board_followedby_users"


@dataclass
class Table:
    """One table on one server, the rows taken from it, and where they were dumped."""

    server: int
    db: str
    name: str
    columns: str
    rows: list[tuple]
    whole: bool
    path: Path | None = None

    @property
    def qualified(self) -> str:
        """```db`.`table``` (names from the information schema of the fleet's own layout)."""
        return f"`{self.db}`.`{self.name}`"


def columns_of(name: str) -> tuple[str, str]:
    """Columns and primary key of a shard or mod table."""
    if name in OBJECT_TABLES:
        return OBJECT_COLUMNS
    if name in MAPPING_TABLES:
        return MAPPING_COLUMNS
    return MOD_COLUMNS[name]


def tables_named(f: Fleet, names: Iterable[str]) -> list[tuple[int, str, str]]:
    """``(server, db, table)`` of every shard or mod database table with one of ``names``."""
    wanted = sorted(set(names))
    out = []
    for server in (0, 1):
        conn = f.connect(server)
        with conn.cursor() as cur:
            cur.execute("SELECT table_schema, table_name FROM information_schema.tables "
                        "WHERE table_schema REGEXP '^(db|mod)[0-9]{5}$' AND table_name IN "
                        f"({','.join(['%s'] * len(wanted))}) ORDER BY 1, 2", wanted)
            out += [(server, db, name) for db, name in cur.fetchall()]
        conn.close()
    return out


def spread_row(db: str) -> Callable[[tuple], bool]:
    """Whether a follower row of shard ``db`` lives away from its board's home shard."""
    shard = int(db[2:])
    return lambda row: ids.shard_of(int(row[0])) != shard


def take(f: Fleet, names: Iterable[str],
         keep: Callable[[str], Callable[[tuple], bool]] | None = None) -> list[Table]:
    """Every non-empty table of ``names`` with its rows (those ``keep(db)`` accepts)."""
    taken = []
    conns = {s: f.connect(s, cursorclass=pymysql.cursors.SSCursor) for s in (0, 1)}
    try:
        for server, db, name in tables_named(f, names):
            columns, key = columns_of(name)
            with conns[server].cursor() as cur:
                cur.execute(f"SELECT {columns} FROM `{db}`.`{name}` ORDER BY {key}")
                rows = list(cur)
            accept = keep(db) if keep else None
            if accept:
                rows = [r for r in rows if accept(r)]
            if rows:
                taken.append(Table(server, db, name, columns, rows, accept is None))
    finally:
        for c in conns.values():
            c.close()
    return taken


def dump(tables: list[Table], into: Path) -> None:
    """Write each table's rows as ``LOAD DATA`` text (the default escapes)."""
    into.mkdir(parents=True, exist_ok=True)
    for i, t in enumerate(tables):
        t.path = into / f"{i:06d}.tsv"
        with open(t.path, "w", encoding="utf-8", newline="\n") as out:
            out.writelines("\t".join(tsv_field(v) for v in row) + "\n" for row in t.rows)


def delete(f: Fleet, tables: list[Table]) -> None:
    """Empty the taken rows as the run found them: a table the run filled (``whole``) is
    truncated, so InnoDB makes its file anew, as ``farm shards init`` left it (a file
    emptied by ``DELETE`` keeps its size, and loading it again skips the growth the run
    paid for: ``_bench.empty_tables``), then every table is opened once more (the run found
    them open); a table the run added to is deleted from by key, in transactions of a few
    hundred statements. Then wait for InnoDB's purge on both servers."""
    for server in (0, 1):
        whole = [f"TRUNCATE TABLE {t.qualified}" for t in tables if t.server == server and t.whole]
        statements_parallel(partial(f.connect, server), whole)
        part = [t for t in tables if t.server == server and not t.whole]
        conn = f.connect(server)
        with conn.cursor() as cur:
            for i in range(0, len(part), DELETE_BATCH):
                cur.execute("BEGIN")
                for t in part[i:i + DELETE_BATCH]:
                    _delete_one(cur, t)
                cur.execute("COMMIT")
        conn.close()
    if any(t.whole for t in tables):
        open_every_table(f)
    for server in (0, 1):
        settle(lambda s=server: f.connect(s))


def _delete_one(cur: pymysql.cursors.Cursor, t: Table) -> None:
    for i in range(0, len(t.rows), 1000):
        part = t.rows[i:i + 1000]
        cur.execute(f"DELETE FROM {t.qualified} WHERE (from_id, to_id) IN "
                    f"({','.join(['(%s,%s)'] * len(part))})",
                    [v for r in part for v in r[:2]])


def _load(f: Fleet, part: list[tuple[Table, Path, int]]) -> None:
    conns = {s: f.connect(s, local_infile=True) for s in (0, 1)}
    try:
        for t, path, _ in part:
            with conns[t.server].cursor() as cur:
                cur.execute(f"LOAD DATA LOCAL INFILE %s INTO TABLE {t.qualified} "
                            f"CHARACTER SET utf8mb4 ({t.columns})", (str(path),))
    finally:
        for c in conns.values():
            c.close()


def load_data(f: Fleet, label: str, names: Iterable[str], workdir: Path,
              keep: Callable[[str], Callable[[tuple], bool]] | None = None) -> Measure:
    """Take, dump and delete the rows of ``names``; time ``LOAD DATA`` of them; check."""
    tables = take(f, names, keep)
    before = counts(f, tables)
    dump(tables, workdir)
    delete(f, tables)
    files = [(t, t.path, len(t.rows)) for t in tables]
    start = time.perf_counter()
    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(lambda part: _load(f, part), balance(files, THREADS)))
    seconds = time.perf_counter() - start
    after = counts(f, tables)
    shutil.rmtree(workdir)
    wrong = [k for k, n in before.items() if after[k] != n]
    if wrong:
        raise RuntimeError(f"LOAD DATA reference: {len(wrong)} table(s) differ, e.g. {wrong[0]}")
    return Measure(f"{label}: LOAD DATA, {THREADS} threads, {len(tables):,} tables",
                   sum(len(t.rows) for t in tables), seconds)


def counts(f: Fleet, tables: list[Table]) -> dict[tuple[int, str], int]:
    """Rows in each table, one connection per server."""
    out = {}
    for server in (0, 1):
        conn = f.connect(server)
        with conn.cursor() as cur:
            for t in (t for t in tables if t.server == server):
                cur.execute(f"SELECT COUNT(*) FROM {t.qualified}")
                out[(server, t.qualified)] = int(cur.fetchone()[0])
        conn.close()
    return out


def migrate(f: Fleet, scratch: Path) -> Measure:
    """Objects, forward mappings and mod lookups, as the migration wrote them."""
    return load_data(f, "migrate", [*OBJECT_TABLES, *FORWARD, *MOD_COLUMNS],
                     scratch / "migrate")


def reverse(f: Fleet, scratch: Path) -> Measure:
    """The reverse mapping tables."""
    return load_data(f, "reverse", REVERSE, scratch / "reverse")


def rebalance(f: Fleet, scratch: Path) -> Measure:
    """The follower rows living away from their board's home shard."""
    return load_data(f, "rebalance", [SPREAD], scratch / "rebalance", keep=spread_row)


def feeds(f: Fleet, scratch: Path) -> Measure:
    """The home feeds, written again with pipelines (``DEL`` + ``RPUSH``); ``scratch`` is
    not used (the same signature as the others)."""
    red = Redis.from_url(f.env["FARM_REDIS_URL"])
    names = sorted(red.scan_iter(match=keys.home_feed("*"), count=1000))
    lists = {k: red.lrange(k, 0, -1) for k in names}
    if names:
        red.delete(*names)
    parts = [names[i::THREADS] for i in range(THREADS)]

    def write(part: list[bytes]) -> None:
        client = Redis.from_url(f.env["FARM_REDIS_URL"])
        for i in range(0, len(part), REDIS_BATCH):
            pipe = client.pipeline(transaction=False)
            for k in part[i:i + REDIS_BATCH]:
                pipe.delete(k)
                pipe.rpush(k, *lists[k])
            pipe.execute()
        client.close()
    start = time.perf_counter()
    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(write, parts))
    seconds = time.perf_counter() - start
    if any(red.llen(k) != len(v) for k, v in lists.items()):
        raise RuntimeError("feeds reference: a feed was written with another length")
    red.close()
    return Measure(f"feeds: Redis pipelines, {THREADS} clients, {len(names):,} feeds "
                   "(rows: feed entries)", sum(len(v) for v in lists.values()), seconds)


def export(f: Fleet, scratch: Path) -> Measure:
    """Every exported table of every shard: ``INTO OUTFILE`` in key order, then gzip -6;
    ``scratch`` must be under the servers' ``secure_file_priv``."""
    shard_tables = [t for t in tables_named(f, [*OBJECT_TABLES, *MAPPING_TABLES])
                    if t[1].startswith("db")]
    start = time.perf_counter()
    with ThreadPoolExecutor(2) as pool:
        rows = sum(pool.map(lambda s: _outfile(f, s, [t for t in shard_tables if t[0] == s],
                                               scratch / f"export{s}"), (0, 1)))
    seconds = time.perf_counter() - start
    return Measure(f"export: INTO OUTFILE + gzip -6, one thread per server, "
                   f"{len(shard_tables):,} tables", rows, seconds)


def _outfile(f: Fleet, server: int, tables: list[tuple[int, str, str]], into: Path) -> int:
    into.mkdir(parents=True, exist_ok=True)
    rows, files = 0, []
    conn = f.connect(server)
    with conn.cursor() as cur:
        for i, (_, db, name) in enumerate(tables):
            columns, key = columns_of(name)
            path = into / f"{i:06d}.tsv"
            rows += cur.execute(f"SELECT {columns} INTO OUTFILE %s FROM `{db}`.`{name}` "
                                f"ORDER BY {key}", (str(path),))
            files.append(str(path))
    conn.close()
    for i in range(0, len(files), GZIP_FILES):
        subprocess.run(["gzip", "-6", "-f", *files[i:i + GZIP_FILES]], check=True)
    shutil.rmtree(into)
    return rows
