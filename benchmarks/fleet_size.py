"""The full-size map on this machine: every job kind on 4,096 shards and 4,096 mod buckets.

Usage: ``python -m benchmarks.fleet_size [--users 1500] [--shards-per-pair 512]
[--compare 64] [--kinds migrate,reverse,rebalance,feeds,export]``.

On ``benchmarks._fleet``'s layout (eight host pairs on two private ``mariadbd`` servers,
a private redis-server): ``farm shards init`` (timed), every table opened once
(``_fleet.open_every_table``, timed: each reference runs on tables the run before it
opened, so each run finds them open too), ``farm legacy generate`` (set-up), then for each
kind, in order (each builds on the one before):

- the planner alone, in this process with no worker running: its seconds and the
  statements it sent (``Questions`` of both servers, before and after);
- the run with 2 workers already running: seconds from planning to the run's end, chunks,
  rows written;
- the reference, right after the run, on the rows it wrote (``benchmarks.fleet_refs``:
  ``LOAD DATA`` for migrate, reverse and rebalance, Redis pipelines for feeds, ``INTO
  OUTFILE`` + ``gzip -6`` for export), and the ratio ``reference seconds / run seconds``;
- the per-chunk overhead, from the ledger: ``(2 × the run's span − Σ chunk seconds) /
  chunks``, i.e. worker time per chunk spent outside the handler (queue, claim, lease,
  finish, status) — and the same for a run of 2,000 no-op chunks.

``--compare N`` runs everything again on N shards per pair (64: 512 shards) and prints
the per-chunk overheads side by side: they must not grow with the number of shards.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rq import Worker

from benchmarks import _fleet, fleet_refs
from benchmarks._bench import Measure
from benchmarks._fleet import Fleet, fleet, say
from exporters import export as exporter
from farmcore import prune
from farmcore.ledger import ChunkSpec
from jobs import runs
from jobs.runtime import Runtime
from loaders import feeds as feeder
from loaders.mappings import rebalance as rebalancer
from loaders.mappings import reverse as reverser
from loaders.migration import migrate as migration
from shardfarm.settings import Settings
from sharding import fencing
from workers import launch

DATE = "2026-11-20"
WORKERS = 2
NOOP_CHUNKS = 2000
REBALANCE_THRESHOLD = 10
NOOP_MODULE = "benchmarks.noop"


@dataclass
class Kind:
    """A job kind: its planner alone, and the start of its run."""

    name: str
    plan: Callable[[Runtime], object]
    start: Callable[[Runtime], str]
    reference: Callable[[Fleet, Path], Measure]


KINDS = [
    Kind("migrate", lambda rt: migration.plan(rt.settings, rt.router, rt.ledger),
         lambda rt: launch.migrate(rt), fleet_refs.migrate),
    Kind("reverse", lambda rt: reverser.plan(rt.router, []),
         lambda rt: launch.reverse(rt, [], reverser.DEFAULT_CHUNK_ROWS), fleet_refs.reverse),
    Kind("rebalance", lambda rt: rebalancer.plan(rt.router, "board_followedby_users",
                                                 REBALANCE_THRESHOLD, 4),
         lambda rt: launch.rebalance(rt, "board_followedby_users", REBALANCE_THRESHOLD, 4),
         fleet_refs.rebalance),
    Kind("feeds", lambda rt: feeder.plan(rt.router),
         lambda rt: launch.feeds(rt, None, feeder.DEFAULT_CHUNK_USERS, feeder.DEFAULT_LENGTH),
         fleet_refs.feeds),
    Kind("export", lambda rt: exporter.plan(rt.router, DATE, rt.settings.export_url, []),
         lambda rt: launch.export(rt, DATE, None, [], "jsonl", "master", False),
         fleet_refs.export),
]


def questions(f: Fleet) -> int:
    """Statements both servers have received so far."""
    n = 0
    for s in (0, 1):
        conn = f.connect(s)
        with conn.cursor() as cur:
            cur.execute("SHOW GLOBAL STATUS LIKE 'Questions'")
            n += int(cur.fetchone()[1])
        conn.close()
    return n


def planner(f: Fleet, rt: Runtime, kind: Kind) -> tuple[float, int]:
    """Seconds and statements (less this measurement's own 4) of the planner."""
    q0 = questions(f)
    t = time.perf_counter()
    kind.plan(rt)
    seconds = time.perf_counter() - t
    return seconds, questions(f) - q0 - 4


def wait_done(rt: Runtime, run_id: str, every: float = 0.05) -> str:
    """Poll the ledger until the run ends; its status."""
    while (status := rt.ledger.run(run_id)["status"]) == "running":
        time.sleep(every)
    return status


def overhead(rt: Runtime, run_id: str) -> dict:
    """Chunks, rows written, the run's span and the per-chunk time outside the handler."""
    (chunks, busy, rows, span), = rt.ledger.pool.query(
        "SELECT COUNT(*), SUM(c.seconds), SUM(c.rows_written), TIMESTAMPDIFF(MICROSECOND, "
        "r.created_at, r.finished_at) / 1e6 FROM chunks c JOIN runs r ON r.run_id = c.run_id "
        "WHERE c.run_id = %s GROUP BY r.run_id", (run_id,))
    per = (WORKERS * float(span) - float(busy or 0)) / chunks if chunks else 0.0
    return {"chunks": int(chunks), "rows": int(rows or 0), "span_s": float(span),
            "overhead_ms": round(per * 1000, 1)}


def timed_run(f: Fleet, rt: Runtime, start: Callable[[Runtime], str], **env: str) -> dict:
    """The run with ``WORKERS`` running workers: seconds from its start to its end."""
    with f.workers(WORKERS, **env):
        while Worker.count(connection=rt.redis) < WORKERS:
            time.sleep(0.1)
        t = time.perf_counter()
        run_id = start(rt)
        status = wait_done(rt, run_id)
        seconds = time.perf_counter() - t
    if status != "done":
        why = [f"{r['kind']} chunk {r['chunk_id']}: {r['last_error']}"
               for r in rt.ledger.failures(run_id, limit=5)]
        raise RuntimeError(f"run {run_id} ended {status}: {why}")
    return {"seconds": round(seconds, 1), **overhead(rt, run_id)}


def noop_run(rt: Runtime) -> str:
    """A run of ``NOOP_CHUNKS`` chunks whose handler does nothing."""
    chunks = [ChunkSpec("noop", {"i": i}) for i in range(NOOP_CHUNKS)]
    return runs.start(rt, "noop", "benchmarks.noop.noop_chunk", chunks, {})


def measure(f: Fleet, kinds: list[str], scratch: Path) -> dict[str, dict]:
    """Every kind's planner, run and reference on a built fleet (legacy generated), then the
    no-ops; ``scratch``: the references' files, under the servers' ``secure_file_priv``."""
    rt = Runtime(Settings.from_env(f.env))
    out: dict[str, dict] = {"shards init": {"seconds": round(f.timings["init"], 1)},
                            "open tables": {"seconds": round(f.timings["open tables"], 1)}}
    try:
        for kind in (k for k in KINDS if k.name in kinds):
            say(f"{kind.name}: planner, then the run with {WORKERS} running workers")
            plan_s, plan_q = planner(f, rt, kind)
            out[kind.name] = {**timed_run(f, rt, kind.start), "plan_s": round(plan_s, 2),
                              "plan_queries": plan_q}
            say(f"{kind.name}: the reference on the same rows")
            ref = kind.reference(f, scratch)
            out[kind.name].update(ref=ref.label, ref_rows=ref.rows, ref_s=round(ref.seconds, 2),
                                  ratio=round(ref.seconds / out[kind.name]["seconds"], 2))
            say(f"{kind.name}: {json.dumps(out[kind.name])}")
        say(f"{NOOP_CHUNKS} no-op chunks")
        out["no-op chunks"] = timed_run(f, rt, noop_run, FARM_JOB_MODULES=NOOP_MODULE)
        out["runs prune"] = prune_all(rt)
    finally:
        rt.close()
    return out


def prune_all(rt: Runtime) -> dict:
    """What ``farm runs prune`` does, for every run above (ended a second ago or more; the
    command forgets a run's fences a day after it ended): their fence rows deleted on every
    shard and mod bucket, and their ledger rows; the seconds, the runs and chunks removed,
    and the fence rows (``rows``)."""
    time.sleep(1.1)
    say("pruning every run above: its fences on every shard and bucket, its ledger rows")
    start = time.perf_counter()
    fences = fencing.forget(rt.router, prune.prunable(rt.ledger.pool, 1))
    report = prune.prune(rt.ledger.pool, 1)
    return {"seconds": round(time.perf_counter() - start, 1), "chunks": report.chunks,
            "rows": fences, "runs": report.runs}


def on_layout(per_pair: int, users: int, kinds: list[str]) -> dict[str, dict]:
    """Build the layout with ``per_pair`` shards per host pair and measure it."""
    _fleet.SHARDS_PER_PAIR, _fleet.SHARDS = per_pair, per_pair * _fleet.PAIRS
    scratch = Path(tempfile.mkdtemp(prefix="farm-fleet-refs-", dir=_fleet.TMP))
    try:
        with fleet(None, secure_file_priv=str(scratch)) as f:
            say(f"farm legacy generate --users {users}")
            f.farm("legacy", "generate", "--users", str(users), "--seed", "1")
            return measure(f, kinds, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def print_table(shards: int, results: dict[str, dict]) -> None:
    """One line per kind (for ``runs prune``, rows are the fence rows it deleted)."""
    print(f"\n{shards:,} shards, {_fleet.BUCKETS:,} mod buckets, 2 servers, {WORKERS} workers")
    print(f"{'kind':<14}{'seconds':>9}{'chunks':>8}{'rows':>10}{'plan s':>8}{'plan q':>8}"
          f"{'ms/chunk outside handler':>26}{'ref. rows':>11}{'ref. s':>8}{'ratio':>7}")
    for name, r in results.items():
        print(f"{name:<14}{r['seconds']:>9}{r.get('chunks', ''):>8}{r.get('rows', ''):>10}"
              f"{r.get('plan_s', ''):>8}{r.get('plan_queries', ''):>8}"
              f"{r.get('overhead_ms', ''):>26}{r.get('ref_rows', ''):>11}{r.get('ref_s', ''):>8}"
              f"{r.get('ratio', ''):>7}")
    for name, r in results.items():
        if "ref" in r:
            print(f"  {name} reference: {r['ref']}")


def main() -> None:
    """Parse the options, run on the full layout (and the smaller one), print the tables."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=1500)
    ap.add_argument("--shards-per-pair", type=int, default=512)
    ap.add_argument("--compare", type=int, default=0, metavar="N",
                    help="also run on N shards per pair and compare per-chunk overheads")
    ap.add_argument("--kinds", default=",".join(k.name for k in KINDS))
    args = ap.parse_args()
    os.environ["FARM_JOB_MODULES"] = NOOP_MODULE  # the no-op run's handler, here and in workers
    kinds = args.kinds.split(",")
    layouts = [args.shards_per_pair] + ([args.compare] if args.compare else [])
    results = {n: on_layout(n, args.users, kinds) for n in layouts}
    for n, r in results.items():
        print_table(n * _fleet.PAIRS, r)
    if args.compare:
        big, small = results[layouts[0]], results[layouts[1]]
        print("\nper-chunk overhead, ms: " + ", ".join(
            f"{k} {small[k]['overhead_ms']} -> {big[k]['overhead_ms']}"
            for k in big if "overhead_ms" in big[k] and k in small))
    print(json.dumps({str(n * _fleet.PAIRS): r for n, r in results.items()}))


if __name__ == "__main__":
    main()
