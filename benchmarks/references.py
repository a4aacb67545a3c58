"""Reference figures (rq and raw Redis) that shardfarm's own queueing is compared against.

Everything runs against one dedicated Redis db (13 by default); only that db is flushed.
``used_memory`` is server-wide, so bytes-per-job is only meaningful on an otherwise idle Redis.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from redis import Redis
from rq import Queue
from rq.serializers import JSONSerializer

FUNC = "benchmarks.noop.noop"
QUEUE = "bench"
BATCH = 1000
ROOT = Path(__file__).resolve().parent.parent

_WORKER_SNIPPET = """
import sys
from redis import Redis
from rq import SimpleWorker, Worker
from rq.serializers import JSONSerializer
cls = SimpleWorker if sys.argv[2] == "simple" else Worker
conn = Redis.from_url(sys.argv[1])
cls([sys.argv[3]], connection=conn, serializer=JSONSerializer).work(
    burst=True, logging_level="WARNING")
"""


def _used_memory(r: Redis) -> int:
    return int(r.info("memory")["used_memory"])


def _measure(redis_url: str, n: int, fill: Callable[[Redis], None]) -> dict:
    """Flush the db, run ``fill(conn)``, return throughput and memory per job, flush again."""
    r = Redis.from_url(redis_url)
    r.flushdb()
    before = _used_memory(r)
    t = time.perf_counter()
    fill(r)
    elapsed = time.perf_counter() - t
    after = _used_memory(r)
    r.flushdb()
    return {"jobs_per_s": n / elapsed, "bytes_per_job": (after - before) / n}


def _rq_enqueue(r: Redis, n: int) -> None:
    q = Queue(QUEUE, connection=r, serializer=JSONSerializer)
    for start in range(0, n, BATCH):
        datas = [Queue.prepare_data(FUNC, kwargs={"i": i})
                 for i in range(start, min(start + BATCH, n))]
        with r.pipeline() as pipe:
            q.enqueue_many(datas, pipeline=pipe)
            pipe.execute()


def rq_enqueue_many(redis_url: str, n: int = 100_000) -> dict:
    """Enqueue n no-op jobs via ``Queue.enqueue_many`` + pipeline (JSONSerializer), 1000 a batch."""
    return _measure(redis_url, n, lambda r: _rq_enqueue(r, n))


def _rpush(r: Redis, n: int) -> None:
    for start in range(0, n, BATCH):
        with r.pipeline(transaction=False) as pipe:
            for i in range(start, min(start + BATCH, n)):
                pipe.rpush(QUEUE, json.dumps({"f": FUNC, "k": {"i": i}}))
            pipe.execute()


def raw_rpush(redis_url: str, n: int = 100_000) -> dict:
    """The floor: pipelined RPUSH of n small JSON payloads, 1000 a batch."""
    return _measure(redis_url, n, lambda r: _rpush(r, n))


def _burst(redis_url: str, kind: str) -> float:
    """Run one burst worker subprocess to completion; return its wall time in seconds."""
    cmd = [sys.executable, "-c", _WORKER_SNIPPET, redis_url, kind, QUEUE]
    t = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True)
    return time.perf_counter() - t


def _worker_rate(redis_url: str, n: int, kind: str) -> dict:
    r = Redis.from_url(redis_url)
    r.flushdb()
    startup = _burst(redis_url, kind)
    _rq_enqueue(r, n)
    elapsed = _burst(redis_url, kind)
    q = Queue(QUEUE, connection=r, serializer=JSONSerializer)
    left = q.count
    finished = q.finished_job_registry.count
    r.flushdb()
    if left or finished != n:
        raise RuntimeError(f"{kind} worker left {left} queued, finished {finished}/{n}")
    return {"jobs_per_s": n / elapsed, "startup_s": startup,
            "jobs_per_s_corrected": n / max(elapsed - startup, 1e-9)}


def rq_simpleworker_rate(redis_url: str, n: int = 2000) -> dict:
    """Drain n no-op jobs with one burst ``SimpleWorker`` process (no fork per job)."""
    return _worker_rate(redis_url, n, "simple")


def rq_forking_worker_rate(redis_url: str, n: int = 500) -> dict:
    """Drain n no-op jobs with one burst forking ``Worker`` process (one fork per job)."""
    return _worker_rate(redis_url, n, "fork")
