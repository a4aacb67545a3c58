"""The shard-host bench every migration benchmark runs on: a private mariadbd configured
like a shard host (legacy, control database, 16 shards on two host names, 4096 mod
buckets), a private redis-server, ``farm`` commands with that environment, and the target tables.

``with_bench(fn)`` starts it, runs ``fn(bench)`` and always cleans up.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pymysql
import pymysql.cursors
from redis import Redis

from benchmarks._server import (
    ShardHostMariaDB,
    end_on_sigterm,
    open_every_table,
    say,
    settle,
)
from benchmarks._usage import Usage
from benchmarks._workers import ROOT, WORKERS_TIMEOUT, run_summary, timed_run
from loaders.migration import migrate as migration
from loaders.migration.spec import ORDER
from sharding.schema import (
    MAPPING_TABLES,
    MOD_FARM_TABLES,
    MOD_TABLES,
    OBJECT_TABLES,
    SHARD_TABLES,
    mod_table,
    shard_table,
)
from tests.servers import PrivateRedis
from workers import launch

SHARDS = 16
BUCKETS = 4096
CHUNK_SIZE = migration.DEFAULT_CHUNK_ROWS
LOAD_THREADS = 2
SAMPLE_ROWS = 30_000
TMP = "/dev/shm" if os.path.isdir("/dev/shm") else None

FORWARD_TABLES = [n for n, m in MAPPING_TABLES.items() if m.reverse_of is None]
OBJECT_COLUMNS = ("local_id, data, active", "local_id")
MAPPING_COLUMNS = ("from_id, to_id, sequence", "from_id, to_id")
MOD_COLUMNS = {"legacy_id_map": ("type_id, legacy_id, new_id", "type_id, legacy_id"),
               "username_to_user": ("username, user_id", "username"),
               "email_to_user": ("email, user_id", "email")}
_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\0": "\\0"})


@dataclass(frozen=True)
class Target:
    """One target table: quoted name, its columns and primary key, and its group."""

    name: str
    columns: str
    key: str
    group: str


@dataclass
class Measure:
    """Rows moved in some seconds."""

    label: str
    rows: int
    seconds: float
    server_cpu: float | None = None  # the server's CPU seconds meanwhile, where measured
    statements_cpu: float | None = None  # of which its connection threads', where measured

    @property
    def rate(self) -> float:
        """Rows per second."""
        return self.rows / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Migration:
    """One measured migration: legacy rows read and target rows written, same seconds."""

    workers: int
    legacy: Measure
    target: Measure
    counts: dict[str, int] = field(default_factory=dict)
    usage: Usage | None = None


@dataclass
class Bench:
    """The private server, the shard map and the environment of every ``farm`` call."""

    server: ShardHostMariaDB
    workdir: Path
    env: dict[str, str]
    redis: PrivateRedis | None = None
    legacy: ShardHostMariaDB | None = None  # the legacy database's own server, if it has one

    def connect(self, **kwargs: object) -> pymysql.Connection:
        """A root connection to the private server (utf8mb4, autocommit)."""
        return pymysql.connect(host="127.0.0.1", port=self.server.port, user="root",
                               charset="utf8mb4", autocommit=True, **kwargs)

    def legacy_server(self) -> ShardHostMariaDB:
        """The server holding the legacy database (the shard host's unless it has its own)."""
        return self.legacy or self.server

    def dsn(self, database: str) -> str:
        """A DSN on the private server."""
        return f"mysql://root@127.0.0.1:{self.server.port}/{database}"

    def farm(self, *args: str, control: str = "farm_control") -> str:
        """Run ``farm ARGS`` with the bench environment; its stdout, or an error with stderr."""
        env = {**self.env, "FARM_CONTROL_DSN": self.dsn(control)}
        p = subprocess.run([sys.executable, "-m", "scripts", *args], env=env, cwd=ROOT,
                           capture_output=True, text=True, timeout=WORKERS_TIMEOUT)
        if p.returncode:
            raise RuntimeError(f"farm {' '.join(args)} exited {p.returncode}: "
                               f"{p.stderr.strip()[-800:]}")
        return p.stdout


# --- setup ---------------------------------------------------------------------------------


def shard_map(port: int) -> dict:
    """A shard map of 16 shards and 4096 mod buckets split over two host names."""
    host = {"host": "127.0.0.1", "port": port, "user": "root", "password": ""}
    half, mid = SHARDS // 2, BUCKETS // 2
    return {"version": 1, "hosts": {"MySQL001A": host, "MySQL001B": host},
            "shards": [{"range": [0, half - 1], "master": "MySQL001A", "slave": "MySQL001B"},
                       {"range": [half, SHARDS - 1], "master": "MySQL001B",
                        "slave": "MySQL001A"}],
            "open": [[0, SHARDS - 1]],
            "mod": {"buckets": BUCKETS, "ranges": [
                {"range": [0, mid - 1], "master": "MySQL001A", "slave": "MySQL001B"},
                {"range": [mid, BUCKETS - 1], "master": "MySQL001B", "slave": "MySQL001A"}]}}


def make_bench(server: ShardHostMariaDB, rds: PrivateRedis,
               legacy: ShardHostMariaDB | None = None) -> Bench:
    """Write the shard map and build the environment every subprocess gets (``legacy``: the
    legacy database's own server; by default it is on ``server``)."""
    workdir = Path(tempfile.mkdtemp(prefix="farm-migrate-bench-", dir=TMP))
    map_path = workdir / "shardmap.json"
    map_path.write_text(json.dumps(shard_map(server.port)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    bench = Bench(server, workdir, env, rds, legacy)
    env.update({"FARM_SHARDMAP": str(map_path), "FARM_REDIS_URL": rds.url(),
                "FARM_LEGACY_DSN": f"mysql://root@127.0.0.1:{bench.legacy_server().port}/legacy",
                "FARM_CONTROL_DSN": bench.dsn("farm_control"),
                "PYTHONPATH": str(ROOT)})
    return bench


def flush_redis(bench: Bench) -> None:
    """Empty the benchmark's private Redis."""
    Redis.from_url(bench.env["FARM_REDIS_URL"]).flushdb()


# --- target tables -------------------------------------------------------------------------


def target_tables() -> list[Target]:
    """Every table the migration writes: objects, forward mappings, mod lookups."""
    out = [Target(shard_table(s, t), *OBJECT_COLUMNS, "objects")
           for s in range(SHARDS) for t in OBJECT_TABLES]
    out += [Target(shard_table(s, t), *MAPPING_COLUMNS, "forward mappings")
            for s in range(SHARDS) for t in FORWARD_TABLES]
    out += [Target(mod_table(b, t), *MOD_COLUMNS[t], "mod lookups")
            for b in range(BUCKETS) for t in MOD_TABLES]
    return out


def all_written_tables() -> list[str]:
    """Every shard and mod table a run may touch (to empty between measurements; the mod
    fences are written only in the first bucket of each range of the map)."""
    return ([shard_table(s, t) for s in range(SHARDS) for t in sorted(SHARD_TABLES)]
            + [mod_table(b, t) for b in range(BUCKETS) for t in MOD_TABLES]
            + [mod_table(r["range"][0], t) for r in shard_map(0)["mod"]["ranges"]
               for t in MOD_FARM_TABLES])


def batches(items: list, size: int) -> Iterator[list]:
    """Consecutive slices of ``size`` items."""
    for i in range(0, len(items), size):
        yield items[i:i + size]


def count_rows(bench: Bench, names: list[str]) -> dict[str, int]:
    """``COUNT(*)`` of every table, 500 tables per statement."""
    out: dict[str, int] = {}
    conn = bench.connect()
    try:
        with conn.cursor() as cur:
            for part in batches(names, 500):
                cur.execute(" UNION ALL ".join(
                    f"SELECT {i}, COUNT(*) FROM {q}" for i, q in enumerate(part)))
                out.update({part[i]: n for i, n in cur.fetchall()})
    finally:
        conn.close()
    return out


def _execute_some(connect: Callable[[], pymysql.Connection], statements: list[str]) -> None:
    conn = connect()
    try:
        with conn.cursor() as cur:
            for sql in statements:
                cur.execute(sql)
    finally:
        conn.close()


def statements_parallel(connect: Callable[[], pymysql.Connection], statements: list[str],
                        threads: int = 4) -> None:
    """Run independent statements on ``threads`` connections from ``connect``, in parallel."""
    parts = [statements[i::threads] for i in range(threads)]
    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(partial(_execute_some, connect), parts))


def empty_tables(bench: Bench, names: list[str]) -> None:
    """Empty every non-empty table of ``names`` as ``farm shards init`` left it, open every
    table once again, then let the server settle (``settle``).

    Tables are truncated: InnoDB makes each file anew (AUTO_INCREMENT starts again). A
    ``DELETE`` keeps a file at the size it grew to, and rows loaded into it again skip the
    file's growth (200 tables loaded with ~150 kB each: 4,211 fsyncs and 2.9 s fresh, 228
    and 1.4 s emptied by ``DELETE``): each run and reference starts on files as fresh as
    the first migration's. About 3 ms a table, 4 at a time.
    """
    full = [q for q, n in count_rows(bench, names).items() if n]
    statements_parallel(bench.connect, [f"TRUNCATE TABLE {q}" for q in full])
    open_every_table(bench.connect)
    settle(bench.connect)


def group_counts(counts: dict[str, int]) -> dict[str, int]:
    """Target rows per group (objects, forward mappings, mod lookups)."""
    out: dict[str, int] = {}
    for t in target_tables():
        out[t.group] = out.get(t.group, 0) + counts.get(t.name, 0)
    return out


# --- migration -----------------------------------------------------------------------------


def legacy_rows(bench: Bench) -> int:
    """Rows in the six legacy tables."""
    conn = pymysql.connect(host="127.0.0.1", port=bench.legacy_server().port, user="root",
                           database="legacy")
    try:
        with conn.cursor() as cur:
            cur.execute(" UNION ALL ".join(f"SELECT COUNT(*) FROM `{t}`" for t in ORDER))
            return sum(n for (n,) in cur.fetchall())
    finally:
        conn.close()


def migrate(bench: Bench, workers: int, control: str,
            chunk_rows: int = CHUNK_SIZE) -> Migration:
    """Empty the target; with ``workers`` running already, time the run from its planning to
    its end and count what it wrote."""
    say(f"emptying the target, then migrating with {workers} running worker(s)")
    empty_tables(bench, all_written_tables())
    flush_redis(bench)
    usage: list[Usage] = []
    run_id, seconds = timed_run(bench, workers, control,
                                lambda rt: launch.migrate(rt, chunk_rows), usage)
    run = run_summary(bench, run_id, control)
    read = sum(k["rows_read"] for k in run["kinds"])
    counts = count_rows(bench, [t.name for t in target_tables()])
    return Migration(workers, Measure(f"migrate W={workers} legacy rows read", read, seconds),
                     Measure(f"migrate W={workers} target rows written",
                             sum(counts.values()), seconds), counts, usage[0])


def with_bench(fn: Callable[[Bench], None], own_legacy: bool = False,
               **server_options: str) -> None:
    """Start the private server (``server_options`` override its shard-host options; with
    ``own_legacy``, a second one for the legacy database), run ``fn(bench)``, and always
    stop them and clean up."""
    end_on_sigterm()
    sys.stdout.reconfigure(line_buffering=True)
    rds = PrivateRedis.start()
    server = ShardHostMariaDB.start_shard_host(**server_options)
    legacy = None
    try:
        legacy = ShardHostMariaDB.start_shard_host(**server_options) if own_legacy else None
        bench = make_bench(server, rds, legacy)
    except BaseException:
        server.stop()
        rds.stop()
        raise
    try:
        fn(bench)
    finally:
        server.stop()
        if legacy is not None:
            legacy.stop()
        rds.stop()
        shutil.rmtree(bench.workdir, ignore_errors=True)
