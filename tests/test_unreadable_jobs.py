"""Whatever anyone writes into an rq job's hash: a hash rq cannot restore is refused like a
foreign job (`farm failed` lists it with its reason, its hash goes), and neither a worker
nor the housekeeping crashes on it or stops serving the jobs beside it."""

from __future__ import annotations

import json

import pytest
import redis

from jobs import enqueue_many
from tests.conftest import run_farm
from tests.farmkit import start_workers, stop

# The fields of rq's job hash that made rq's restore raise (each crashed a worker).
UNREADABLE = [("status", "bogus"), ("created_at", "garbage"), ("timeout", "abc"),
              ("result_ttl", "x"), ("retries_left", "x")]


@pytest.fixture
def env(farm_env, ledger):
    redis.Redis.from_url(farm_env["FARM_REDIS_URL"]).flushdb()
    yield dict(farm_env)
    redis.Redis.from_url(farm_env["FARM_REDIS_URL"]).flushdb()


@pytest.fixture
def conn(env):
    return redis.Redis.from_url(env["FARM_REDIS_URL"])


def _enqueue(conn: redis.Redis, key: str, value: int) -> str:
    """One farm batch of one item on queue ``farm``; returns its rq job ID."""
    enqueue_many("farm", "tests.kinds.record", [{"key": key, "value": value}],
                 connection=conn, id_key="key")
    return conn.lindex("rq:queue:farm", -1).decode()


@pytest.mark.slow
@pytest.mark.parametrize(("field", "value"), UNREADABLE)
def test_a_worker_refuses_a_job_whose_hash_rq_cannot_restore(env, conn, field, value):
    bad = _enqueue(conn, "bad", 1)
    conn.hset(f"rq:job:{bad}", field, value)
    _enqueue(conn, "good", 2)
    proc = start_workers(env, 1, "--burst")
    proc.wait(timeout=60)
    out = stop(proc)
    assert proc.returncode == 0 and conn.llen("rq:queue:farm") == 0, out
    assert conn.hgetall("test:record") == {b"good": b"2"}  # the next job still ran
    assert not conn.exists(f"rq:job:{bad}")
    listed = run_farm(env, "failed", "--json")
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    mine = [r for r in rows if r.get("where") == "queue farm item bad"]
    assert len(mine) == 1 and mine[0]["args"] == {"key": "bad", "value": 1}
    assert "unreadable" in mine[0]["last_error"] and f"{field}=" in mine[0]["last_error"]
    assert "Traceback" not in out and "unhandled exception" not in out, out
