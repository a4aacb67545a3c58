"""The ledger at fleet scale: ``farm status``, ``farm runs``, ``farm failed`` and the
dashboard's run summaries with 1,000 runs and 1,000,000 chunk rows in the control database.

A private mariadbd holds the control database and a private redis-server the queues, so
the shared servers are left alone. The ledger is filled with ``LOAD DATA LOCAL INFILE``
(runs spread over 60 days, most done, some failed, running or paused), then each command
is timed in-process (the interpreter's start-up is not the ledger's cost), best of three.
Goal: each answers in under 1 s. Usage: ``python -m benchmarks.ledger_scale [--runs 1000]
[--chunks-per-run 1000]``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import tempfile
import time
from collections.abc import Callable

import pymysql

from benchmarks._server import end_on_sigterm
from farmcore import control_schema, ledger_size
from farmcore.ledger import Ledger
from shardfarm.mysql.db import ensure_database
from shardfarm.mysql.dsn import DSN
from tests.servers import PrivateMariaDB, PrivateRedis

KINDS = ("migrate", "verify", "reverse", "rebalance", "feeds", "export")
GOAL_S = 1.0


def _run_rows(runs: int) -> list[tuple]:
    """``(run_id, kind, status, paused, created_at, finished_at)``: the newest 5 running
    (one paused), every 50th failed, the rest done; one run every ~86 minutes back."""
    out = []
    now = time.time()
    for i in range(runs):
        at = now - (runs - i) * 5184  # 60 days over the runs
        status = "running" if i >= runs - 5 else "failed" if i % 50 == 7 else "done"
        kind = KINDS[i % len(KINDS)]
        out.append((f"{kind}-{i:06d}", kind, status, int(i == runs - 2),
                    time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(at)),
                    None if status == "running" else
                    time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(at + 600))))
    return out


def _chunk_lines(run: tuple, n: int) -> list[str]:
    """Tab-separated chunk rows of one run, states matching the run's status."""
    run_id, kind, status, _paused, created, _fin = run
    lines = []
    for c in range(n):
        state = ("pending" if c % 3 else "done") if status == "running" else (
            "failed" if status == "failed" and c % 97 == 0 else "done")
        args = json.dumps({"table": "pins", "shard": c % 4096, "lo": c * 1000,
                           "hi": c * 1000 + 999})
        fin = created if state == "done" else "\\N"
        err = "boom: a worker raised" if state == "failed" else "\\N"
        lines.append("\t".join((run_id, str(c), kind, args, state, "1", "1", fin, "1000",
                                "1000", "0.25", err)))
    return lines


def fill(dsn: DSN, port: int, runs: int, per_run: int) -> None:
    """Fill the control database's ``runs`` and ``chunks`` with LOAD DATA LOCAL."""
    rows = _run_rows(runs)
    conn = pymysql.connect(host="127.0.0.1", port=port, user="root", database=dsn.database,
                           local_infile=True, autocommit=True)
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO runs (run_id, kind, status, queue, params, paused, "
                        "total_chunks, created_at, finished_at) VALUES "
                        f"(%s,%s,%s,'farm','{{}}',%s,{per_run},%s,%s)", rows)
        with tempfile.NamedTemporaryFile("w", suffix=".tsv", delete=False) as f:
            for run in rows:
                f.write("\n".join(_chunk_lines(run, per_run)) + "\n")
        cur.execute(f"LOAD DATA LOCAL INFILE '{f.name}' INTO TABLE chunks "
                    "(run_id, chunk_id, kind, args, state, attempts, fence, finished_at, "
                    "rows_read, rows_written, seconds, last_error)")
        os.unlink(f.name)
        cur.execute("ANALYZE TABLE runs, chunks")
    conn.close()


def timed(fn: Callable[[], object], repeat: int = 3) -> float:
    """The best of ``repeat`` wall times of ``fn``, seconds."""
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def farm(*args: str) -> Callable[[], None]:
    """Run ``farm ARGS`` in this process (stdout swallowed); exit 0 required."""
    from scripts.cli import main

    def call() -> None:
        with contextlib.redirect_stdout(io.StringIO()):
            try:
                main(list(args))
            except SystemExit as exc:
                if exc.code not in (0, None):
                    raise RuntimeError(f"farm {' '.join(args)} exited {exc.code}") from None
    return call


def measure(led: Ledger) -> dict[str, float]:
    """Seconds of each command and ledger query the operator and the dashboard use."""
    newest = led.runs(limit=1)[0]
    cases: dict[str, Callable[[], object]] = {
        "farm status": farm("status"), "farm status --json": farm("status", "--json"),
        "farm runs": farm("runs"), "farm runs --kind export": farm("runs", "--kind", "export"),
        "farm failed": farm("failed"), "farm runs --limit 1000": farm("runs", "--limit", "1000"),
        "ledger.list_runs (dashboard)": lambda: led.list_runs(None, 50),
        "ledger.progress (newest run)": lambda: led.progress(newest),
        "ledger.refresh_status (per chunk)": lambda: led.refresh_status(newest),
        "ledger.dispatchable": led.dispatchable, "ledger.expire_leases": led.expire_leases,
        "ledger size": lambda: ledger_size.size(led.pool),
    }
    return {name: timed(fn) for name, fn in cases.items()}


def main() -> None:
    """Start the private servers, fill the ledger, time everything, print the table."""
    end_on_sigterm()
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--chunks-per-run", type=int, default=1000)
    args = ap.parse_args()
    db, rds = PrivateMariaDB.start(buffer_pool="512M"), PrivateRedis.start()
    try:
        dsn = DSN.parse(f"mysql://root@127.0.0.1:{db.port}/farm_control")
        os.environ.update(FARM_CONTROL_DSN=f"mysql://root@127.0.0.1:{db.port}/farm_control",
                          FARM_REDIS_URL=rds.url())
        ensure_database(dsn)
        control_schema.ensure(dsn)
        t = time.perf_counter()
        fill(dsn, db.port, args.runs, args.chunks_per_run)
        print(f"filled {args.runs:,} runs, {args.runs * args.chunks_per_run:,} chunk rows in "
              f"{time.perf_counter() - t:.1f}s")
        led = Ledger(dsn)
        for run_id in led.runs(limit=args.runs):  # what the last chunk of each run did
            led.refresh_status(run_id)
        print(f"ledger size: {json.dumps(ledger_size.size(led.pool))}")
        worst = 0.0
        for name, s in measure(led).items():
            worst = max(worst, s)
            print(f"  {name:<32} {s * 1000:8.1f} ms")
        led.close()
        print(f"slowest {worst * 1000:.0f} ms: goal < {GOAL_S * 1000:.0f} ms "
              f"{'met' if worst < GOAL_S else 'NOT met'}")
    finally:
        rds.stop()
        db.stop()


if __name__ == "__main__":
    main()
