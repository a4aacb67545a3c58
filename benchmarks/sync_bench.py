"""``farm sync`` under a sustained legacy write load, against the full re-run path.

Usage: ``python -m benchmarks.sync_bench [--users N] [--rate 2000] [--seconds 30]
[--backlog-seconds 30]``.

Servers: the legacy database on a private mariadbd writing a ROW binary log with GTIDs
(as ``farm sync`` needs), the control database and 16 shards / 4096 mod buckets on a
second private mariadbd configured like a shard host, Redis database 1 of the local
redis-server (``redis://127.0.0.1:6379/1``, refused unless empty; emptied at the end),
2 workers running throughout. ``farm migrate --wait`` first, then:

1. lag: a legacy write load paced to ``--rate`` row changes per second (inserts of pins,
   likes and follows; updates of users, boards and pins, some moving a pin to another
   board; deletes of likes, follows, pins, and now and then a board or a user, which
   cascade in the target) runs for ``--seconds`` while one ``farm sync`` follows it.
   Every 0.5 s the lag is sampled: transactions (the server's ``gtid_binlog_pos`` against
   sync_state's checkpoint) and seconds (the age of the oldest committed transaction not
   yet checkpointed; the load records each commit's GTID and time);
2. sync apply rate: with sync stopped, ``--backlog-seconds`` worth of the same changes
   (written as fast as they go), then ``farm sync --until-caught-up`` timed from start
   to exit;
3. reference, same servers: the same amount of the same changes, then ``farm migrate
   --wait`` (the full re-run path that converges the target) timed from start to exit.

Row changes are rows changed in the binlog: each statement's affected rows (ROW format
logs exactly the rows a statement changed). The referencing columns the cascades look up
(``boards.user_id``, ``pins.board_id``, ...) are indexed first, as the README advises
for a busy legacy server.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pymysql
from redis import Redis

from benchmarks._bench import TMP, Bench, say, shard_map
from benchmarks._server import (
    ShardHostMariaDB,
    end_on_sigterm,
    questions,
    start_table_stats,
    table_stats,
)
from benchmarks._usage import children_cpu, cpu_seconds
from benchmarks._workers import ROOT, running_workers, stop_group
from benchmarks.sync_load import CONTROL, SAMPLE_EVERY, Load, Sampler, p95
from loaders.migration.binlog import behind
from tests.servers import PrivateMariaDB

REDIS_URL = "redis://127.0.0.1:6379/1"
WORKERS = 2
LAG_GOAL_SECONDS = 2.0
RATE_GOAL = 5.0
INDEXES = {"boards": ["user_id"], "pins": ["user_id", "board_id"],
           "comments": ["pin_id", "user_id"], "follows": ["board_id"], "likes": ["pin_id"]}


def farm_env(bench: Bench) -> dict[str, str]:
    """The environment of every ``farm`` subprocess."""
    return {**bench.env, "FARM_CONTROL_DSN": bench.dsn(CONTROL)}


def start_sync(bench: Bench) -> subprocess.Popen:
    """One ``farm sync`` process, its output to a file in the work directory."""
    with open(bench.workdir / "sync.log", "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "scripts", "--log-level", "INFO", "sync"],
                                env=farm_env(bench),
                                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def wait_caught_up(bench: Bench, legacy_port: int, proc: subprocess.Popen | None,
                   timeout: float = 600) -> float:
    """Seconds until sync leads and its checkpoint equals the server's position."""
    start = time.monotonic()
    control = bench.connect(database=CONTROL)
    legacy = pymysql.connect(host="127.0.0.1", port=legacy_port, user="root", autocommit=True)
    try:
        while time.monotonic() - start < timeout:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"farm sync exited {proc.returncode}: "
                                   f"{(bench.workdir / 'sync.log').read_text()[-800:]}")
            with legacy.cursor() as cur:
                cur.execute("SELECT @@gtid_binlog_pos")
                server = cur.fetchone()[0] or ""
            with control.cursor() as cur:
                cur.execute("SELECT gtid FROM sync_state")
                row = cur.fetchone()
            if row and row[0] and behind(row[0], server) == 0:
                return time.monotonic() - start
            time.sleep(0.05)
    finally:
        control.close()
        legacy.close()
    raise RuntimeError(f"farm sync did not catch up within {timeout:.0f}s")


def applied_keys(bench: Bench) -> dict[str, int]:
    """Legacy keys sync has applied per table (sync_state, summed over its checkpoints)."""
    conn = bench.connect(database=CONTROL)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT applied FROM sync_state")
            row = cur.fetchone()
    finally:
        conn.close()
    return json.loads(row[0]) if row and row[0] else {}


def timed_farm(bench: Bench, *args: str, profile: str | None = None) -> tuple[float, str]:
    """Seconds ``farm ARGS`` takes from start to exit, and its log (INFO, stderr); with
    ``profile``, run under ``py-spy record`` (raw collapsed stacks written to that file)."""
    cmd = [sys.executable, "-m", "scripts", "--log-level", "INFO", *args]
    if profile:
        spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        cmd = [spy, "record", "--rate", "50", "--format", "raw", "--idle", "--threads",
               "--output", profile, "--", *cmd]
    start = time.perf_counter()
    p = subprocess.run(cmd, env=farm_env(bench), cwd=ROOT, capture_output=True, text=True,
                       timeout=3600)
    if p.returncode:
        raise RuntimeError(f"farm {' '.join(args)} exited {p.returncode}: "
                           f"{p.stderr.strip()[-800:]}")
    return time.perf_counter() - start, p.stderr


def describe(found: list[tuple[int, float]]) -> str:
    """Batches applied, their seconds and size."""
    if not found:
        return "no batch logged"
    secs = [t for _, t in found]
    return (f"{len(found)} batches applied in {sum(secs):.1f}s (mean {sum(secs) / len(secs):.2f}s"
            f", max {max(secs):.2f}s; {sum(k for k, _ in found) / len(found):,.0f} keys each)")


def batches(log: str) -> list[tuple[int, float]]:
    """``(keys, seconds)`` of every batch a ``farm sync`` log says it applied."""
    found = re.findall(r"applied (\d+) legacy keys .* in ([\d.]+)s", log)
    return [(int(k), float(t)) for k, t in found]


def make_bench(shards: ShardHostMariaDB, legacy: PrivateMariaDB) -> Bench:
    """The shard map on the shard host, the legacy DSN on the binlog server, Redis db 1."""
    workdir = Path(tempfile.mkdtemp(prefix="farm-sync-bench-", dir=TMP))
    map_path = workdir / "shardmap.json"
    map_path.write_text(json.dumps(shard_map(shards.port)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    bench = Bench(shards, workdir, env)
    env.update({"FARM_SHARDMAP": str(map_path), "FARM_REDIS_URL": REDIS_URL,
                "FARM_LEGACY_DSN": f"mysql://root@127.0.0.1:{legacy.port}/legacy",
                "FARM_CONTROL_DSN": bench.dsn(CONTROL), "PYTHONPATH": str(ROOT)})
    return bench


def index_referencing_columns(legacy: PrivateMariaDB) -> None:
    """The indexes the README advises for the cascades' lookups."""
    for table, cols in INDEXES.items():
        legacy.sql(f"ALTER TABLE legacy.`{table}` "
                   + ", ".join(f"ADD INDEX `by_{c}` (`{c}`)" for c in cols))


def legacy_rows(legacy: PrivateMariaDB) -> int:
    """Rows in the six legacy tables."""
    return sum(legacy.sql(f"SELECT COUNT(*) FROM legacy.`{t}`")[0][0]
               for t in ("users", "boards", "pins", "comments", "follows", "likes"))


@dataclass
class Result:
    """Every figure the report prints."""

    users: int = 0
    legacy_rows: int = 0
    migrate_seconds: float = 0.0
    load_rows: int = 0
    load_seconds: float = 0.0
    load_kinds: dict[str, int] = field(default_factory=dict)
    samples: list[tuple[float, int, float, int]] = field(default_factory=list)
    drain_seconds: float = 0.0
    backlog_rows: int = 0
    backlog_write_seconds: float = 0.0
    sync_seconds: float = 0.0
    sync_keys: dict[str, int] = field(default_factory=dict)
    lag_keys: int = 0
    sync_statements: tuple[int, int] = (0, 0)  # shard host, legacy
    sync_rows_read: tuple[int, int] = (0, 0)  # rows read: shard host, legacy
    sync_cpu: tuple[float, float, float] = (0.0, 0.0, 0.0)  # shard host, legacy, farm sync
    verify: str = ""
    batches: list[tuple[int, float]] = field(default_factory=list)  # catch-up: (keys, seconds)
    lag_batches: list[tuple[int, float]] = field(default_factory=list)  # while following
    read_most: list[tuple[str, int]] = field(default_factory=list)  # shard host, catch-up
    rerun_rows: int = 0
    rerun_seconds: float = 0.0


def run(bench: Bench, legacy: PrivateMariaDB, args: argparse.Namespace) -> Result:
    """The three measurements, workers running throughout."""
    r = Result(users=args.users)
    say("farm shards init")
    bench.farm("shards", "init", "--tune", control=CONTROL)
    say(f"generating {args.users:,} legacy users on the binlog server")
    bench.farm("legacy", "generate", "--users", str(args.users), "--seed", str(args.seed),
               "--replace", control=CONTROL)
    index_referencing_columns(legacy)
    r.legacy_rows = legacy_rows(legacy)
    with running_workers(bench, WORKERS, CONTROL):
        say("farm migrate --wait")
        r.migrate_seconds, _ = timed_farm(bench, "migrate", "--wait")
        load = Load.open(legacy.port, args.seed)
        try:
            lag_phase(bench, legacy, load, args, r)
            sync_phase(bench, legacy, load, args, r)
            rerun_phase(bench, load, args, r)
        finally:
            load.close()
    return r


def lag_phase(bench: Bench, legacy: PrivateMariaDB, load: Load, args: argparse.Namespace,
              r: Result) -> None:
    """Sync follows the paced load; lag sampled every 0.5 s."""
    sync = start_sync(bench)
    try:
        say("farm sync started; waiting until it leads and is caught up")
        wait_caught_up(bench, legacy.port, sync)
        say(f"legacy write load at {args.rate:,} row changes/s for {args.seconds:.0f}s")
        keys = applied_keys(bench)
        first, kinds = load.rows, dict(load.by_kind)
        with Sampler(bench, legacy.port, load) as sampler:
            r.load_seconds = load.paced(args.rate, args.seconds)
            r.load_rows = load.rows - first
            r.drain_seconds = wait_caught_up(bench, legacy.port, sync)
        r.samples = [s for s in sampler.samples if s[0] <= sampler.samples[0][0]
                     + r.load_seconds] if sampler.samples else []
        r.load_kinds = {k: n - kinds.get(k, 0) for k, n in load.by_kind.items()}
        r.lag_keys = sum(applied_keys(bench).values()) - sum(keys.values())
    finally:
        stop_group(sync)
        r.lag_batches = batches((bench.workdir / "sync.log").read_text(errors="replace"))


def sync_phase(bench: Bench, legacy: PrivateMariaDB, load: Load, args: argparse.Namespace,
               r: Result) -> None:
    """A backlog written with sync stopped, then ``farm sync --until-caught-up`` timed."""
    want = int(args.rate * args.backlog_seconds)
    say(f"sync stopped; writing a backlog of {want:,} row changes")
    first = load.rows
    r.backlog_write_seconds = load.amount(want)
    r.backlog_rows = load.rows - first
    say("farm sync --until-caught-up")
    keys = applied_keys(bench)
    asked = (questions(bench.server), questions(legacy))
    servers = (cpu_seconds(bench.server.proc.pid), cpu_seconds(legacy.proc.pid), children_cpu())
    start_table_stats(bench.server)
    r.sync_seconds, log = timed_farm(bench, "sync", "--until-caught-up", profile=args.py_spy)
    r.batches = batches(log)
    r.sync_cpu = (cpu_seconds(bench.server.proc.pid) - servers[0],
                  cpu_seconds(legacy.proc.pid) - servers[1], children_cpu() - servers[2])
    now = (questions(bench.server), questions(legacy))
    r.sync_statements = (now[0][0] - asked[0][0], now[1][0] - asked[1][0])
    r.sync_rows_read = (now[0][1] - asked[0][1], now[1][1] - asked[1][1])
    r.read_most = table_stats(bench.server)
    after = applied_keys(bench)
    r.sync_keys = {t: n - keys.get(t, 0) for t, n in after.items() if n - keys.get(t, 0)}
    wait_caught_up(bench, legacy.port, None, timeout=5)  # it did apply everything
    if args.verify:
        say("farm verify")
        try:
            bench.farm("verify", control=CONTROL)
            r.verify = "farm verify: 0 mismatches after the catch-up"
        except RuntimeError as exc:
            r.verify = f"farm verify FAILED after the catch-up: {str(exc)[-400:]}"


def rerun_phase(bench: Bench, load: Load, args: argparse.Namespace, r: Result) -> None:
    """The same amount of the same changes, then the full re-run path timed."""
    want = int(args.rate * args.backlog_seconds)
    say(f"writing {want:,} more row changes, then farm migrate --wait (the re-run path)")
    first = load.rows
    load.amount(want)
    r.rerun_rows = load.rows - first
    r.rerun_seconds, _ = timed_farm(bench, "migrate", "--wait")


def report(r: Result, args: argparse.Namespace) -> None:
    """Figures, ratios and goals."""
    load_rate = r.load_rows / r.load_seconds if r.load_seconds else 0.0
    lags = [s[1] for s in r.samples]
    secs = [s[2] for s in r.samples]
    status_secs = [s[3] for s in r.samples]
    sync_rate = r.backlog_rows / r.sync_seconds if r.sync_seconds else 0.0
    rerun_rate = r.rerun_rows / r.rerun_seconds if r.rerun_seconds else 0.0
    print(f"legacy: {r.users:,} users, {r.legacy_rows:,} rows on a private binlog mariadbd "
          f"(ROW, GTID); 16 shards + 4096 mod buckets on a private shard host; {WORKERS} "
          f"workers; Redis {REDIS_URL}; first farm migrate --wait {r.migrate_seconds:.1f}s")
    print(f"load: {r.load_rows:,} row changes in {r.load_seconds:.1f}s = {load_rate:,.0f}/s "
          f"(target {args.rate:,}/s): " + ", ".join(f"{k} {n:,}" for k, n in
                                                    r.load_kinds.items()))
    print(f"lag while following ({len(r.samples)} samples every {SAMPLE_EVERY}s): "
          f"transactions max {max(lags, default=0):,} / p95 {p95(lags):,.0f}; seconds max "
          f"{max(secs, default=0):.2f} / p95 {p95(secs):.2f} (farm sync status's own "
          f"lag_seconds: max {max(status_secs, default=0)} / p95 {p95(status_secs):.0f}); "
          f"caught up {r.drain_seconds:.2f}s after the load stopped; {r.lag_keys:,} legacy "
          f"keys applied (touched keys and their cascades, per batch); {describe(r.lag_batches)}")
    print(f"sync apply: backlog of {r.backlog_rows:,} row changes (written in "
          f"{r.backlog_write_seconds:.1f}s), farm sync --until-caught-up {r.sync_seconds:.1f}s "
          f"(process start to exit) = {sync_rate:,.0f} row changes/s; CPU seconds meanwhile: "
          f"farm sync {r.sync_cpu[2]:.1f}, shard-host mariadbd {r.sync_cpu[0]:.1f}, legacy "
          f"mariadbd {r.sync_cpu[1]:.1f} (2 cores); legacy keys applied "
          f"{sum(r.sync_keys.values()):,} (" + ", ".join(f"{t} {n:,}" for t, n in
                                                        r.sync_keys.items()) + ")"
          + f"; statements meanwhile: shard host {r.sync_statements[0]:,}, legacy "
          f"{r.sync_statements[1]:,}; rows read: shard host {r.sync_rows_read[0]:,}, "
          f"legacy {r.sync_rows_read[1]:,}; {describe(r.batches)}")
    print("shard host rows read during the catch-up, by table: "
          + ", ".join(f"{t} {n:,}" for t, n in r.read_most))
    print("catch-up batches (keys/seconds): " + ", ".join(f"{k:,}/{t:.2f}" for k, t in r.batches))
    if r.verify:
        print(r.verify)
    print(f"re-run reference: {r.rerun_rows:,} row changes, farm migrate --wait "
          f"{r.rerun_seconds:.1f}s = {rerun_rate:,.0f} row changes/s (re-reads all "
          f"{r.legacy_rows:,} legacy rows: its rate scales with the database, not the changes)")
    ratio = sync_rate / load_rate if load_rate else 0.0
    lag_max = max(secs, default=0.0)
    print(f"ratios: sync apply / load = {ratio:.2f}x (goal >= {RATE_GOAL:.0f}x: "
          f"{'met' if ratio >= RATE_GOAL else 'NOT MET'}); sync apply / re-run = "
          f"{sync_rate / rerun_rate if rerun_rate else 0:.1f}x; lag max {lag_max:.2f}s (goal "
          f"< {LAG_GOAL_SECONDS:.0f}s: {'met' if lag_max < LAG_GOAL_SECONDS else 'NOT MET'}); "
          f"load {load_rate:,.0f}/s (asked {args.rate:,}/s: "
          f"{'met' if load_rate >= 0.98 * args.rate else 'NOT reached'})")


def main(argv: Iterable[str] | None = None) -> None:
    """Parse the options, start the servers, run, report, clean up."""
    end_on_sigterm()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=5000, help="legacy users (~40 rows each)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rate", type=int, default=2000, help="legacy row changes per second")
    ap.add_argument("--seconds", type=float, default=30.0, help="length of the paced load")
    ap.add_argument("--backlog-seconds", type=float, default=30.0,
                    help="backlog (and re-run reference) size, in seconds of --rate")
    ap.add_argument("--py-spy", metavar="FILE",
                    help="profile the timed catch-up with py-spy (raw stacks to FILE)")
    ap.add_argument("--no-verify", dest="verify", action="store_false",
                    help="skip farm verify after the catch-up")
    args = ap.parse_args(None if argv is None else list(argv))
    sys.stdout.reconfigure(line_buffering=True)
    redis = Redis.from_url(REDIS_URL)
    if redis.dbsize():
        raise SystemExit(f"{REDIS_URL} is not empty: refusing to use (and empty) it")
    legacy = shards = None
    workdir = None
    try:
        legacy = PrivateMariaDB.start_binlog(server_id=11, innodb_buffer_pool_size="512M")
        shards = ShardHostMariaDB.start_shard_host()
        bench = make_bench(shards, legacy)
        workdir = bench.workdir
        result = run(bench, legacy, args)
        report(result, args)
    except BaseException:
        for name, server in (("shard host", shards), ("legacy", legacy)):
            if server is not None:
                log = server.datadir.parent / "error.log"
                tail = log.read_text(errors="replace").splitlines()[-15:] if log.exists() else []
                say(f"{name} mariadbd (exit {server.proc.poll()}), last lines of its log:\n"
                    + "\n".join(tail))
        raise
    finally:
        for server in (shards, legacy):
            if server is not None:
                server.stop()
        redis.flushdb()
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
