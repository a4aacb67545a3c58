"""Enqueue and dispatch: shardfarm against rq and raw Redis, measured in the same run.

``python -m benchmarks.farm_queue`` prints, for 100,000 enqueued jobs, jobs/s and
Redis bytes per job of ``jobs.enqueue_many`` vs rq's ``Queue.enqueue_many`` with
a pipeline and raw pipelined RPUSH; and no-op jobs/s of one worker process:
the farm's worker (items packed 100 per rq job, and one item per rq job) vs
rq's SimpleWorker and forking Worker. Uses Redis db 13 only.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from redis import Redis

from benchmarks import references as ref
from farmcore import keys
from jobs import enqueue_many
from jobs.queue import item_id

QUEUE = ref.QUEUE
os.environ["FARM_JOB_MODULES"] = "benchmarks.noop"  # the no-op job, allowed as an operator would


def farm_enqueue(redis_url: str, n: int, batch: int = 100) -> dict:
    """Enqueue n no-op items with ``jobs.enqueue_many`` (dedup on, the default)."""
    def fill(r: Redis) -> None:
        enqueue_many(QUEUE, ref.FUNC, ({"i": i} for i in range(n)), connection=r, batch=batch)
    return ref._measure(redis_url, n, fill)


def _farm_burst(redis_url: str) -> float:
    env = {**os.environ, "FARM_REDIS_URL": redis_url, "PYTHONPATH": str(ref.ROOT)}
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "workers.worker", "--queues", QUEUE, "--burst"],
                   cwd=ref.ROOT, env=env, check=True)
    return time.perf_counter() - t


def farm_worker_rate(redis_url: str, n: int, batch: int) -> dict:
    """Drain n no-op items (``batch`` per rq job) with one farm worker process."""
    r = Redis.from_url(redis_url)
    r.flushdb()
    startup = _farm_burst(redis_url)
    enqueue_many(QUEUE, ref.FUNC, ({"i": i} for i in range(n)), connection=r, batch=batch)
    elapsed = _farm_burst(redis_url)
    left = int(r.get(keys.items_queued(QUEUE)) or 0) + r.llen(f"rq:queue:{QUEUE}")
    failed = r.hlen(keys.failed_items(QUEUE))
    r.flushdb()
    if left or failed:
        raise RuntimeError(f"farm worker left {left} items queued, {failed} failed")
    return {"jobs_per_s": n / elapsed, "startup_s": startup,
            "jobs_per_s_corrected": n / max(elapsed - startup, 1e-9)}


def _bytes(r: Redis, pattern: str) -> tuple[int, int]:
    """(keys, bytes) of the keys matching ``pattern`` (MEMORY USAGE, all samples)."""
    names = list(r.scan_iter(match=pattern, count=10_000))
    return len(names), sum(r.memory_usage(k, samples=0) or 0 for k in names)


def dedup_memory(redis_url: str, n: int) -> dict:
    """Redis bytes the farm keeps for n items: in flight, and after one worker finished them;
    the reference is the never-trimmed set of their IDs the farm used to keep."""
    r = Redis.from_url(redis_url)
    r.flushdb()
    enqueue_many(QUEUE, ref.FUNC, ({"i": i} for i in range(n)), connection=r, batch=100)
    inflight = _bytes(r, keys.inflight(QUEUE, None))[1]
    elapsed = _farm_burst(redis_url)
    farm_keys, after = _bytes(r, f"{keys.PREFIX}:*")
    ids = list(r.scan_iter(match=keys.inflight(QUEUE, None)))  # none when all went well
    r.flushdb()
    for start in range(0, n, 10_000):
        top = min(n, start + 10_000)
        r.sadd("bench:ids", *(item_id(ref.FUNC, {"i": i}) for i in range(start, top)))
    reference = _bytes(r, "bench:ids")[1]
    r.flushdb()
    return {"n": n, "inflight_bytes": inflight, "after_bytes": after, "farm_keys_after": farm_keys,
            "left_in_dedup": len(ids), "reference_bytes": reference, "drain_s": elapsed}


def _row(name: str, d: dict, ref_rate: float | None = None) -> str:
    b = f"{d['bytes_per_job']:.0f}" if "bytes_per_job" in d else "-"
    c = d.get("jobs_per_s_corrected", d["jobs_per_s"])
    ratio = f"{c / ref_rate:.1f}x" if ref_rate else ""
    return f"{name:<46} {d['jobs_per_s']:>9.0f} {c:>11.0f} {b:>9} {ratio:>7}"


def main() -> None:
    """Run every measurement and print the table with ratios."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--redis-url", default="redis://127.0.0.1:6379/13")
    ap.add_argument("--n", type=int, default=100_000, help="jobs for the enqueue figures")
    ap.add_argument("--dispatch-n", type=int, default=100_000, help="items for the worker figures")
    ap.add_argument("--dedup-n", type=int, default=1_000_000,
                    help="items for the dedup memory figure (0: skip)")
    a = ap.parse_args()
    rq_enq = ref.rq_enqueue_many(a.redis_url, a.n)
    raw = ref.raw_rpush(a.redis_url, a.n)
    ours = farm_enqueue(a.redis_url, a.n)
    simple = ref.rq_simpleworker_rate(a.redis_url, 2000)
    fork = ref.rq_forking_worker_rate(a.redis_url, 500)
    farm_items = farm_worker_rate(a.redis_url, a.dispatch_n, batch=100)
    farm_single = farm_worker_rate(a.redis_url, 2000, batch=1)
    print(f"{'measurement':<46} {'jobs/s':>9} {'corr. /s':>11} {'B/job':>9} {'vs rq':>7}")
    print(_row(f"rq Queue.enqueue_many + pipeline (n={a.n})", rq_enq))
    print(_row(f"raw pipelined RPUSH (n={a.n})", raw, rq_enq["jobs_per_s"]))
    print(_row(f"farm enqueue_many, dedup on (n={a.n})", ours, rq_enq["jobs_per_s"]))
    print(f"  memory per job: farm {ours['bytes_per_job'] / rq_enq['bytes_per_job']:.0%} of rq's")
    print(_row("rq SimpleWorker, 1 process (n=2000)", simple))
    print(_row("rq forking Worker, 1 process (n=500)", fork, simple["jobs_per_s_corrected"]))
    print(_row(f"farm worker, 100 items/job (n={a.dispatch_n})", farm_items,
               simple["jobs_per_s_corrected"]))
    print(_row("farm worker, 1 item/job (n=2000)", farm_single, simple["jobs_per_s_corrected"]))
    print("  dispatch goal: >= 1,230 no-op jobs/s per process (Pyres), >= 7x SimpleWorker")
    if a.dedup_n:
        d = dedup_memory(a.redis_url, a.dedup_n)
        print(f"dedup memory, {d['n']:,} items: {d['inflight_bytes']:,} B while queued; "
              f"{d['after_bytes']:,} B in {d['farm_keys_after']} farm key(s) after one worker "
              f"ran them all ({d['drain_s']:.0f} s), {d['left_in_dedup']} dedup keys left; "
              f"reference (a set of their IDs, never trimmed): {d['reference_bytes']:,} B")


if __name__ == "__main__":
    main()
