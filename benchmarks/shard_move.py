"""Moving one shard of 1M rows to another server: ``farm shards move`` against
``mysqldump | mysql`` of the same database between the same two servers, same run.

Two private mariadbd servers (source and destination); shard 0 holds 250k pins and
750k ``user_has_pins`` rows on the source. The reference copies the database with
``mysqldump --single-transaction | mysql``; the farm then moves it with 2 workers
(copy run, catch-up, freeze, verify, flip). Prints both times and the ratio
(reference / farm: above 1 means the farm is faster).

Usage: ``python -m benchmarks.shard_move [--rows 1000000] [--workers 2]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis

from benchmarks._server import ShardHostMariaDB, end_on_sigterm
from benchmarks._usage import children, cpu_seconds
from farmcore import control_schema
from shardfarm.mysql.db import ensure_database
from shardfarm.mysql.dsn import DSN
from sharding.mapsource import ShardMapSource
from sharding.provision import init_databases
from sharding.router import Router

ROOT = Path(__file__).resolve().parent.parent
WORKER_LOG = open(os.environ.get("BENCH_WORKER_LOG", os.devnull), "w")  # noqa: SIM115
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/3")  # emptied after


def _map(src: int, dst: int) -> dict:
    def host(port: int) -> dict:
        return {"host": "127.0.0.1", "port": port, "user": "root", "password": ""}
    return {"version": 1, "hosts": {"SrcA": host(src), "SrcB": host(src), "DstA": host(dst),
                                    "DstB": host(dst)},
            "shards": [{"range": [0, 0], "master": "SrcA", "slave": "SrcB"}], "open": [[0, 0]],
            "mod": {"buckets": 1, "ranges": [{"range": [0, 0], "master": "SrcA",
                                              "slave": "SrcB"}]}}


def _fill(server: ShardHostMariaDB, rows: int) -> None:
    pins, edges = rows // 4, rows - rows // 4
    server.sql("INSERT INTO db00000.pins (local_id, data) SELECT seq, JSON_OBJECT('legacy_id', "
               "seq, 'details', CONCAT('pin number ', seq), 'link', "
               f"CONCAT('https://example.com/', seq)) FROM db00000.seq_1_to_{int(pins)}")
    server.sql("INSERT INTO db00000.user_has_pins (from_id, to_id, sequence) SELECT "
               "(3 << 36) | (seq DIV 50 + 1), (1 << 36) | seq, 1400000000 + seq "
               f"FROM db00000.seq_1_to_{int(edges)}")


def _reference(src: ShardHostMariaDB, dst: ShardHostMariaDB) -> float:
    t = time.monotonic()
    dump = subprocess.Popen(["mysqldump", "-h127.0.0.1", f"-P{src.port}", "-uroot",
                             "--single-transaction", "--databases", "db00000"],
                            stdout=subprocess.PIPE)
    subprocess.run(["mysql", "-h127.0.0.1", f"-P{dst.port}", "-uroot"], stdin=dump.stdout,
                   check=True)
    dump.wait()
    seconds = time.monotonic() - t
    dst.sql("DROP DATABASE db00000")
    return seconds


def _farm(env: dict, workers: int, rows_per_chunk: int | None) -> tuple[float, dict, float]:
    """The move's seconds, its summary, and the CPU seconds its workers used."""
    proc = subprocess.Popen([sys.executable, "-m", "scripts", "workers", "--count",
                             str(workers)], env=env, cwd=ROOT, start_new_session=True,
                            stdout=WORKER_LOG, stderr=subprocess.STDOUT)
    try:
        time.sleep(3)  # the workers start (outside the measurement)
        kids = children(proc.pid)
        before = sum(cpu_seconds(k) for k in kids)
        t = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "scripts", "shards", "move", "0-0", "--to",
                              "DstA/DstB", "--wait", *(["--rows-per-chunk", str(rows_per_chunk)]
                                                        if rows_per_chunk else [])],
                             env=env, cwd=ROOT, capture_output=True, text=True, check=True)
        seconds = time.monotonic() - t
        return (seconds, json.loads(out.stdout.splitlines()[-1]),
                sum(cpu_seconds(k) for k in kids) - before)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def main() -> None:
    """Fill the source, time the reference, then the farm's move; print the ratio."""
    end_on_sigterm()
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rows-per-chunk", type=int, default=None,
                    help="Passed to farm shards move (default: its own).")
    args = ap.parse_args()
    src, dst = ShardHostMariaDB.start_shard_host(), ShardHostMariaDB.start_shard_host()
    try:
        path = Path(tempfile.mkdtemp()) / "map.json"
        path.write_text(json.dumps(_map(src.port, dst.port)))
        router = Router(ShardMapSource(path))
        init_databases(router)
        router.close()
        _fill(src, args.rows)
        control = f"mysql://root@127.0.0.1:{src.port}/farm_control"
        ensure_database(DSN.parse(control))
        control_schema.ensure(DSN.parse(control))
        env = {**os.environ, "FARM_SHARDMAP": str(path), "FARM_CONTROL_DSN": control,
               "FARM_REDIS_URL": REDIS_URL, "PYTHONPATH": str(ROOT)}
        servers = (src.proc.pid, dst.proc.pid)
        cpu0 = [cpu_seconds(p) for p in servers]
        ref = _reference(src, dst)
        cpu1 = [cpu_seconds(p) for p in servers]
        farm, summary, workers_cpu = _farm(env, args.workers, args.rows_per_chunk)
        cpu2 = [cpu_seconds(p) for p in servers]
        print(f"mysqldump | mysql: {ref:.1f} s for {args.rows} rows; CPU s: source server "
              f"{cpu1[0] - cpu0[0]:.1f}, destination server {cpu1[1] - cpu0[1]:.1f}")
        print(f"farm shards move:  {farm:.1f} s (froze writes {summary['frozen_seconds']} s, "
              f"{summary['rows']['pins'] + summary['rows']['user_has_pins']} rows); CPU s: "
              f"source server {cpu2[0] - cpu1[0]:.1f}, destination server "
              f"{cpu2[1] - cpu1[1]:.1f}, workers {workers_cpu:.1f}")
        print(f"farm phases (s): {summary['seconds']}")
        spent = src.sql("SELECT kind, COUNT(*), SUM(seconds), SUM(rows_written) FROM "
                        "farm_control.chunks WHERE run_id = %s AND rows_written > 0 "
                        "GROUP BY kind", (summary["run_id"],))
        print("copy chunks (worker seconds): " + ", ".join(
            f"{kind} {n} chunk(s) {float(sec):.2f} s for {int(rows)} rows"
            for kind, n, sec, rows in spent))
        print(f"ratio (reference / farm): {ref / farm:.2f}x")
    finally:
        src.stop()
        dst.stop()
        redis.Redis.from_url(REDIS_URL).flushdb()


if __name__ == "__main__":
    main()
