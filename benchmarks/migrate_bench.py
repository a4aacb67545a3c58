"""End-to-end ``farm migrate`` throughput against references measured in the same run.

Usage: ``python -m benchmarks.migrate_bench [--users N] [--scale10]``.

Everything runs on one private mariadbd configured like a shard host (legacy,
control database, 16 shards on two host names, 4096 mod buckets) and on Redis
db 12 (flushed before and after). Measured:

- the migration with 1 and 2 workers (``farm workers --count W --burst``),
  legacy rows/s and target rows/s (objects, forward mappings, mod lookups);
- reference A: ``LOAD DATA LOCAL INFILE`` of exactly the rows the migration
  wrote, one statement per table, 2 client threads (as many as workers);
- reference B: one autocommitted ``INSERT`` per row from one client, on a
  proportional sample of the same rows;
- with ``--scale10``: the 2-worker migration at ten times the users.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pymysql
import pymysql.cursors
from redis import Redis

from benchmarks._server import SHARD_HOST_OPTIONS, ShardHostMariaDB
from loaders.migration import migrate as migration
from loaders.migration.spec import ORDER
from sharding.schema import (
    MAPPING_TABLES,
    MOD_TABLES,
    OBJECT_TABLES,
    SHARD_TABLES,
    mod_table,
    shard_table,
)

ROOT = Path(__file__).resolve().parent.parent
REDIS_URL = "redis://127.0.0.1:6379/12"
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


@dataclass
class Bench:
    """The private server, the shard map and the environment of every ``farm`` call."""

    server: ShardHostMariaDB
    workdir: Path
    env: dict[str, str]

    def connect(self, **kwargs: object) -> pymysql.Connection:
        """A root connection to the private server (utf8mb4, autocommit)."""
        return pymysql.connect(host="127.0.0.1", port=self.server.port, user="root",
                               charset="utf8mb4", autocommit=True, **kwargs)

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
    """CONTRACTS §3 map: 16 shards and 4096 mod buckets split over two host names."""
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


def make_bench(server: ShardHostMariaDB) -> Bench:
    """Write the shard map and build the environment every subprocess gets."""
    workdir = Path(tempfile.mkdtemp(prefix="farm-migrate-bench-", dir=TMP))
    map_path = workdir / "shardmap.json"
    map_path.write_text(json.dumps(shard_map(server.port)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    bench = Bench(server, workdir, env)
    env.update({"FARM_SHARDMAP": str(map_path), "FARM_REDIS_URL": REDIS_URL,
                "FARM_LEGACY_DSN": bench.dsn("legacy"),
                "FARM_CONTROL_DSN": bench.dsn("farm_control"),
                "PYTHONPATH": str(ROOT)})
    return bench


def say(message: str) -> None:
    """A progress line on stderr (the results go to stdout)."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def flush_redis() -> None:
    """Empty the benchmark's private Redis db."""
    Redis.from_url(REDIS_URL).flushdb()


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
    """Every shard and mod table a run may touch (to empty between measurements)."""
    return ([shard_table(s, t) for s in range(SHARDS) for t in sorted(SHARD_TABLES)]
            + [mod_table(b, t) for b in range(BUCKETS) for t in MOD_TABLES])


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
    """Empty every non-empty table of ``names``, then let InnoDB purge finish.

    Shard tables are truncated (AUTO_INCREMENT starts again); mod tables, which
    have none, get ``DELETE``: truncating thousands of tables takes minutes.
    """
    full = [q for q, n in count_rows(bench, names).items() if n]
    execute_parallel(bench, [f"TRUNCATE TABLE {q}" if q.startswith("`db") else f"DELETE FROM {q}"
                             for q in full])
    wait_purge(bench)


def wait_purge(bench: Bench, timeout: float = 120) -> None:
    """Wait until the InnoDB history list is short, so purge does not run during a timing."""
    deadline = time.monotonic() + timeout
    conn = bench.connect()
    try:
        with conn.cursor() as cur:
            while time.monotonic() < deadline:
                cur.execute("SHOW GLOBAL STATUS LIKE 'Innodb_history_list_length'")
                if int(cur.fetchone()[1]) < 100:
                    return
                time.sleep(0.5)
    finally:
        conn.close()
    say(f"note: InnoDB purge still running after {timeout:.0f}s")


def group_counts(counts: dict[str, int]) -> dict[str, int]:
    """Target rows per group (objects, forward mappings, mod lookups)."""
    out: dict[str, int] = {}
    for t in target_tables():
        out[t.group] = out.get(t.group, 0) + counts.get(t.name, 0)
    return out


# --- migration -----------------------------------------------------------------------------


def legacy_rows(bench: Bench) -> int:
    """Rows in the six legacy tables."""
    conn = bench.connect(database="legacy")
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
        raise RuntimeError(f"run {run_id} ended {run['status']} with {failed} failed chunk(s)")
    return run


def migrate(bench: Bench, workers: int, control: str) -> Migration:
    """Empty the target, start a run, time the workers and count what they wrote."""
    say(f"emptying the target, then migrating with {workers} worker(s)")
    empty_tables(bench, all_written_tables())
    flush_redis()
    out = bench.farm("migrate", "--chunk-size", str(CHUNK_SIZE), control=control)
    run_id = json.loads(out.strip().splitlines()[-1])["run_id"]
    seconds = run_workers(bench, workers, control)
    run = run_summary(bench, run_id, control)
    read = sum(k["rows_read"] for k in run["kinds"])
    counts = count_rows(bench, [t.name for t in target_tables()])
    return Migration(workers, Measure(f"migrate W={workers} legacy rows read", read, seconds),
                     Measure(f"migrate W={workers} target rows written",
                             sum(counts.values()), seconds), counts)


# --- reference A: LOAD DATA ----------------------------------------------------------------


def tsv_field(value: object) -> str:
    """One field as LOAD DATA reads it by default (backslash escapes, tab/newline separators)."""
    if value is None:
        return "\\N"
    if isinstance(value, bytes):
        value = value.decode("utf-8")
    return str(value).translate(_ESCAPES) if isinstance(value, str) else str(value)


def sample_quotas(counts: list[tuple[Target, int]], total: int) -> dict[str, int]:
    """Rows per table for a sample of ``total`` rows in proportion to each table's size."""
    rows = sum(n for _, n in counts)
    quotas, seen, taken = {}, 0, 0
    for t, n in counts:
        seen += n
        want = min(total, rows) * seen // rows if rows else 0
        quotas[t.name], taken = want - taken, want
    return quotas


def dump_table(cur: pymysql.cursors.SSCursor, t: Target, path: Path,
               quota: int) -> list[tuple]:
    """Write one table as TSV sorted by primary key; return its first ``quota`` rows."""
    sample: list[tuple] = []
    cur.execute(f"SELECT {t.columns} FROM {t.name} ORDER BY {t.key}")
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for row in cur:
            if len(sample) < quota:
                sample.append(row)
            f.write("\t".join(tsv_field(v) for v in row) + "\n")
    return sample


def dump(bench: Bench, counts: dict[str, int],
         into: Path) -> tuple[list[tuple[Target, Path, int]], list[tuple[Target, tuple]]]:
    """Dump every non-empty target table; also pick the row-at-a-time sample."""
    tables = [(t, counts[t.name]) for t in target_tables() if counts.get(t.name)]
    quotas = sample_quotas(tables, SAMPLE_ROWS)
    files, sample = [], []
    conn = bench.connect(cursorclass=pymysql.cursors.SSCursor)
    try:
        with conn.cursor() as cur:
            for i, (t, n) in enumerate(tables):
                path = into / f"{i:05d}.tsv"
                sample += [(t, row) for row in dump_table(cur, t, path, quotas[t.name])]
                files.append((t, path, n))
    finally:
        conn.close()
    return files, sample


def balance(files: list[tuple[Target, Path, int]], n: int) -> list[list]:
    """Split files into ``n`` lists of about equal rows (largest first to the lightest)."""
    bins: list[list] = [[] for _ in range(n)]
    load = [0] * n
    for item in sorted(files, key=lambda f: -f[2]):
        i = load.index(min(load))
        bins[i].append(item)
        load[i] += item[2]
    return bins


def _load_files(bench: Bench, files: list[tuple[Target, Path, int]]) -> None:
    conn = bench.connect(local_infile=True)
    try:
        with conn.cursor() as cur:
            for t, path, _ in files:
                cur.execute(f"LOAD DATA LOCAL INFILE %s INTO TABLE {t.name} "
                            f"CHARACTER SET utf8mb4 ({t.columns})", (str(path),))
    finally:
        conn.close()


def load_data(bench: Bench, files: list[tuple[Target, Path, int]]) -> Measure:
    """Truncate the dumped tables and time loading them back, ``LOAD_THREADS`` in parallel."""
    empty_tables(bench, [t.name for t, _, _ in files])
    bins = balance(files, LOAD_THREADS)
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=LOAD_THREADS) as pool:
        list(pool.map(lambda part: _load_files(bench, part), bins))
    seconds = time.perf_counter() - start
    rows = sum(n for _, _, n in files)
    check_counts(bench, {t.name: n for t, _, n in files})
    return Measure(f"LOAD DATA LOCAL INFILE, {LOAD_THREADS} client threads, "
                   f"{len(files)} statements", rows, seconds)


def check_counts(bench: Bench, expected: dict[str, int]) -> None:
    """Raise if any table does not hold the expected number of rows."""
    got = count_rows(bench, list(expected))
    wrong = [q for q, n in expected.items() if got[q] != n]
    if wrong:
        raise RuntimeError(f"{len(wrong)} table(s) reloaded with other counts, e.g. {wrong[0]}")


# --- reference B: one INSERT per row -------------------------------------------------------


def insert_rows(bench: Bench, sample: list[tuple[Target, tuple]]) -> Measure:
    """Truncate the sampled tables and time one autocommitted INSERT per row, one client."""
    empty_tables(bench, sorted({t.name for t, _ in sample}))
    conn = bench.connect()
    try:
        with conn.cursor() as cur:
            start = time.perf_counter()
            for t, row in sample:
                marks = ",".join(["%s"] * len(row))
                cur.execute(f"INSERT INTO {t.name} ({t.columns}) VALUES ({marks})", row)
            seconds = time.perf_counter() - start
    finally:
        conn.close()
    return Measure("row-at-a-time INSERT, 1 client, autocommit, proportional sample",
                   len(sample), seconds)


# --- report --------------------------------------------------------------------------------


def fmt_row(m: Measure) -> str:
    """One line of the results table."""
    return f"{m.label:<68} {m.rows:>10,} {m.seconds:>9.1f} {m.rate:>10,.0f}"


def print_header(bench: Bench, users: int, legacy: int, gen_seconds: float) -> None:
    """Server configuration and data set, as measured."""
    v = bench.server.variables()
    asked = SHARD_HOST_OPTIONS["table-open-cache"]
    capped = "" if v["table_open_cache"] == asked else (
        f" (asked {asked}; capped by open_files_limit {v['open_files_limit']})")
    print(f"private mariadbd {v['version']} on port {bench.server.port}: buffer pool "
          f"{int(v['innodb_buffer_pool_size']) >> 20}M, table_open_cache "
          f"{v['table_open_cache']}{capped}, table_definition_cache "
          f"{v['table_definition_cache']}, flush_log_at_trx_commit "
          f"{v['innodb_flush_log_at_trx_commit']}, max_connections {v['max_connections']}")
    print(f"legacy: {users:,} users, {legacy:,} rows (generated in {gen_seconds:.1f}s); "
          f"{SHARDS} shards on 2 host names, {BUCKETS} mod buckets, chunk size {CHUNK_SIZE:,}, "
          f"Redis {REDIS_URL}")


def print_table(migrations: list[Migration], refs: list[Measure],
                extra: list[Migration]) -> None:
    """The results table, then the target rows by group."""
    print(f"\n{'measurement':<68} {'rows':>10} {'seconds':>9} {'rows/s':>10}")
    for m in migrations:
        print(fmt_row(m.legacy))
        print(fmt_row(m.target))
    for r in refs:
        print(fmt_row(r))
    for m in extra:
        print(fmt_row(Measure(f"{m.legacy.label} (10x users)", m.legacy.rows, m.legacy.seconds)))
        print(fmt_row(Measure(f"{m.target.label} (10x users)", m.target.rows, m.target.seconds)))
    groups = group_counts(migrations[-1].counts)
    print("target rows written: " + ", ".join(f"{g} {n:,}" for g, n in groups.items())
          + "; the row-at-a-time sample takes rows from every table in the same proportions")


def print_ratios(w1: Migration, w2: Migration, load: Measure, insert: Measure) -> None:
    """Final line: migration vs references (target rows/s) and 1->2 worker scaling."""
    print(f"ratios (target rows/s): migration(W=2)/LOAD DATA = {w2.target.rate / load.rate:.2f}"
          f" (goal >= 0.50); migration(W=2)/row-at-a-time = "
          f"{w2.target.rate / insert.rate:.1f}x (goal >= 10x); "
          f"scaling 1->2 workers = {w2.target.rate / w1.target.rate:.2f}x")


# --- main ----------------------------------------------------------------------------------


def generate(bench: Bench, users: int) -> tuple[int, float]:
    """``farm legacy generate``; returns the legacy row count and the seconds taken."""
    say(f"generating {users:,} legacy users")
    start = time.perf_counter()
    bench.farm("legacy", "generate", "--users", str(users), "--seed", "1", "--replace")
    return legacy_rows(bench), time.perf_counter() - start


def references(bench: Bench, w2: Migration) -> tuple[Measure, Measure]:
    """Reference A (LOAD DATA) and B (row-at-a-time) on the rows the W=2 run wrote."""
    into = bench.workdir / "dump"
    into.mkdir()
    say("dumping the W=2 target, then LOAD DATA and row-at-a-time references")
    files, sample = dump(bench, w2.counts, into)
    load = load_data(bench, files)
    shutil.rmtree(into, ignore_errors=True)
    return load, insert_rows(bench, sample)


def run(bench: Bench, users: int, scale10: bool) -> None:
    """The whole benchmark on a started server."""
    say("farm shards init")
    bench.farm("shards", "init")
    legacy, gen_seconds = generate(bench, users)
    print_header(bench, users, legacy, gen_seconds)
    w1 = migrate(bench, 1, "farm_control_w1")
    w2 = migrate(bench, 2, "farm_control_w2")
    for m in (w1, w2):
        if m.legacy.rows != legacy:
            print(f"note: W={m.workers} read {m.legacy.rows:,} legacy rows of {legacy:,}")
    load, insert = references(bench, w2)
    extra = []
    if scale10:
        generate(bench, users * 10)
        extra.append(migrate(bench, 2, "farm_control_x10"))
    print_table([w1, w2], [load, insert], extra)
    print_ratios(w1, w2, load, insert)


def main(argv: Iterable[str] | None = None) -> None:
    """Parse the options, start the private server, run, and always clean up."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=5000, help="legacy users (~40 rows each)")
    ap.add_argument("--scale10", action="store_true", help="also migrate 10x the users (W=2)")
    args = ap.parse_args(None if argv is None else list(argv))
    sys.stdout.reconfigure(line_buffering=True)
    flush_redis()
    server = ShardHostMariaDB.start_shard_host()
    bench = make_bench(server)
    try:
        run(bench, args.users, args.scale10)
    finally:
        server.stop()
        flush_redis()
        shutil.rmtree(bench.workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
