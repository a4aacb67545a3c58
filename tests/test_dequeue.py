"""A worker of several queues takes jobs as a worker of one does: into the queue's
intermediate list, so a worker SIGKILLed between taking a job and starting it loses
nothing (real Redis, real worker processes)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import redis
from rq.exceptions import DequeueTimeout

from jobs import enqueue_many
from jobs.dequeue import FarmQueue
from tests.conftest import ROOT
from tests.farmkit import spawn, stop, until
from tests.test_stuck_jobs import ITEMS, KILLED_ON_TAKING, Q, _age, _round
from workers import maintenance

FIRST = "sq-first"  # the queue the workers prefer; empty unless a test fills it
BOTH = f"{FIRST},{Q}"


def _enqueue(conn: redis.Redis, queue: str, items: list[dict]) -> None:
    enqueue_many(queue, "tests.kinds.ordered_record", items, connection=conn, batch=1, id_key="key")


def _worker(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "workers.worker", "--queues", BOTH, *args],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_a_worker_of_two_queues_killed_before_starting_a_job_loses_nothing(env, rt):
    conn = rt.redis
    _enqueue(conn, Q, ITEMS[:1])
    out = subprocess.run([sys.executable, "-c", KILLED_ON_TAKING.replace(f"'{Q}'", f"'{BOTH}'")],
                         env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == -9, out.stderr
    (job_id,) = conn.lrange(f"rq:queue:{Q}:intermediate", 0, -1)  # (rq's BLPOP: in none)
    _round(rt)
    _age(conn, job_id.decode(), maintenance.STUCK_SECONDS)
    until(lambda: (_round(rt), conn.llen(f"rq:queue:{Q}"))[1] == 1,
          what="the job delivered again")
    assert _worker(env, "--burst").returncode == 0
    assert conn.hgetall("test:record") == {b"k0": b"0"}
    assert not conn.llen(f"rq:queue:{Q}:intermediate")


def test_a_worker_of_two_queues_takes_the_first_queue_first_and_leaves_no_entries(env, rt):
    conn = rt.redis
    _enqueue(conn, Q, ITEMS[:2])
    _enqueue(conn, FIRST, ITEMS[2:])
    out = _worker(env, "--burst")
    assert out.returncode == 0, out.stderr
    order = [k.decode() for k in conn.lrange("test:order", 0, -1)]
    assert order == [i["key"] for i in ITEMS[2:] + ITEMS[:2]], order
    assert conn.hlen("test:record") == len(ITEMS)
    assert not conn.exists(f"rq:queue:{Q}:intermediate", f"rq:queue:{FIRST}:intermediate")


def test_an_idle_worker_of_two_queues_takes_a_job_of_its_second_queue(env, rt):
    conn = rt.redis
    worker = spawn([sys.executable, "-m", "workers.worker", "--queues", BOTH], env)
    try:
        until(lambda: conn.scard("rq:workers"), what="the worker registered")
        _enqueue(conn, Q, ITEMS[:1])
        until(lambda: conn.hlen("test:record"), what="the job of the second queue run")
    finally:
        stop(worker)
    assert not conn.llen(f"rq:queue:{Q}:intermediate")


@pytest.mark.parametrize("timeout", [None, 1])
def test_taking_from_empty_queues_keeps_rqs_contract(rt, timeout):
    """None: nothing taken at once; a timeout: rq's DequeueTimeout once it has passed."""
    keys = [f"rq:queue:{FIRST}", f"rq:queue:{Q}"]
    t = time.monotonic()
    if timeout is None:
        assert FarmQueue.lpop(keys, None, rt.redis) is None
    else:
        with pytest.raises(DequeueTimeout):
            FarmQueue.lpop(keys, timeout, rt.redis)
        assert time.monotonic() - t >= timeout
