"""The shard-host bench every migration benchmark runs on: a private mariadbd configured
like a shard host (legacy, control database, 16 shards on two host names, 4096 mod
buckets), a private redis-server, ``farm`` commands with that environment, and the target tables.

``with_bench(fn)`` starts it, runs ``fn(bench)`` and always cleans up.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pymysql
import pymysql.cursors
from redis import Redis
from rq import Worker

from benchmarks._server import ShardHostMariaDB, end_on_sigterm, settle, table_opens
from benchmarks._usage import Usage, cpu_seconds, workers_cpu, workers_peak
from jobs.runtime import Runtime
from loaders.migration import migrate as migration
from loaders.migration.spec import ORDER
from shardfarm.settings import Settings
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

ROOT = Path(__file__).resolve().parent.parent
SHARDS = 16
BUCKETS = 4096
CHUNK_SIZE = migration.DEFAULT_CHUNK_ROWS
LOAD_THREADS = 2
SAMPLE_ROWS = 30_000
WORKERS_TIMEOUT = 3600.0
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


def say(message: str) -> None:
    """A progress line on stderr (the results go to stdout)."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


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


def _execute_some(bench: Bench, statements: list[str]) -> None:
    conn = bench.connect()
    try:
        with conn.cursor() as cur:
            for sql in statements:
                cur.execute(sql)
    finally:
        conn.close()


def execute_parallel(bench: Bench, statements: list[str], threads: int = 4) -> None:
    """Run independent statements on several connections in parallel."""
    parts = [statements[i::threads] for i in range(threads)]
    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(lambda part: _execute_some(bench, part), parts))


def empty_tables(bench: Bench, names: list[str]) -> None:
    """Empty every non-empty table of ``names``, then let the server settle (``settle``).

    Shard tables are truncated (AUTO_INCREMENT starts again); mod tables, which
    have none, get ``DELETE``: truncating thousands of tables takes minutes.
    """
    full = [q for q, n in count_rows(bench, names).items() if n]
    execute_parallel(bench, [f"TRUNCATE TABLE {q}" if q.startswith("`db") else f"DELETE FROM {q}"
                             for q in full])
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


def run_workers(bench: Bench, count: int, control: str) -> float:
    """Seconds ``farm workers --count N --burst`` takes from start until it exits."""
    env = {**bench.env, "FARM_CONTROL_DSN": bench.dsn(control)}
    log = bench.workdir / f"workers-{control}.log"
    with open(log, "wb") as out:
        start = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "scripts", "workers", "--count",
                                 str(count), "--burst"], env=env, cwd=ROOT, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=WORKERS_TIMEOUT)
        finally:
            _stop_group(proc)
        seconds = time.perf_counter() - start
    if rc:
        tail = log.read_text(errors="replace").strip()[-800:]
        raise RuntimeError(f"farm workers exited {rc}: {tail}")
    return seconds


@contextmanager
def running_workers(bench: Bench, count: int, control: str) -> Iterator[None]:
    """``farm workers --count N`` started and registered (idle) before the block, stopped
    after it: what a timing inside the block measures excludes the workers' start-up."""
    env = {**bench.env, "FARM_CONTROL_DSN": bench.dsn(control)}
    log = bench.workdir / f"workers-{control}-running.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "scripts", "workers", "--count",
                                 str(count)], env=env, cwd=ROOT, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        conn = Redis.from_url(bench.env["FARM_REDIS_URL"])
        deadline = time.monotonic() + 120
        while Worker.count(connection=conn) < count:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"workers did not start: {log.read_text()[-800:]}")
            time.sleep(0.1)
        yield proc
    finally:
        _stop_group(proc)


def timed_run(bench: Bench, workers: int, control: str, start: Callable[[Runtime], str],
              usage: list[Usage] | None = None) -> tuple[str, float]:
    """With ``workers`` already running, the seconds from ``start(runtime)`` (plan, record,
    enqueue, in this process) to the run's end, and its run ID; ``usage`` gets the run's
    ``Usage`` appended."""
    rt = Runtime(Settings.from_env({**bench.env, "FARM_CONTROL_DSN": bench.dsn(control)}))
    try:
        with running_workers(bench, workers, control) as group:
            legacy_pid = bench.legacy.proc.pid if bench.legacy else None
            cpu = (cpu_seconds(bench.server.proc.pid), workers_cpu(group.pid),
                   cpu_seconds(legacy_pid) if legacy_pid else 0.0)
            opens = table_opens(bench.server)
            t = time.perf_counter()
            run_id = start(rt)
            wait_run(bench, run_id, control)
            seconds = time.perf_counter() - t
            if usage is not None:
                usage.append(Usage(cpu_seconds(bench.server.proc.pid) - cpu[0],
                                   workers_cpu(group.pid) - cpu[1], workers_peak(group.pid),
                                   table_opens(bench.server) - opens,
                                   cpu_seconds(legacy_pid) - cpu[2] if legacy_pid else None))
            return run_id, seconds
    finally:
        rt.close()


def wait_run(bench: Bench, run_id: str, control: str, every: float = 0.02) -> None:
    """Poll the ledger until run ``run_id`` is no longer running."""
    conn = bench.connect(database=control)
    try:
        with conn.cursor() as cur:
            deadline = time.monotonic() + WORKERS_TIMEOUT
            while time.monotonic() < deadline:
                cur.execute("SELECT status FROM runs WHERE run_id = %s", (run_id,))
                if cur.fetchone()[0] != "running":
                    return
                time.sleep(every)
    finally:
        conn.close()
    raise RuntimeError(f"run {run_id} did not end")


def _stop_group(proc: subprocess.Popen) -> None:
    """End the process group started for ``proc``: SIGTERM, then SIGKILL after 20 s."""
    try:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=20)
        os.killpg(proc.pid, 0)  # raises ProcessLookupError when nothing of it is left
        os.killpg(proc.pid, signal.SIGKILL)
        say(f"note: stray processes of the worker supervisor {proc.pid} were killed")
    except (ProcessLookupError, subprocess.TimeoutExpired):
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def run_summary(bench: Bench, run_id: str, control: str) -> dict:
    """The run from ``farm status --json --run``; raises unless it is done without failures."""
    view = json.loads(bench.farm("status", "--json", "--run", run_id, control=control))
    run = view["runs"][0]
    failed = sum(k["failed"] for k in run["kinds"])
    if run["status"] != "done" or failed:
        why = bench.farm("failed", "--run", run_id, control=control).strip()[-1500:]
        raise RuntimeError(f"run {run_id} ended {run['status']} with {failed} failed "
                           f"chunk(s): {why}")
    return run


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
