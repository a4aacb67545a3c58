"""Entries of rq's worker registry that anyone can forge in Redis: `farm status`, the
dashboard (page and `/metrics`) and a supervisor's metrics skip them (status counts them),
and still show the real workers."""

from __future__ import annotations

import json
import socket
import time

import pytest
import redis
from rq import Worker
from rq.serializers import JSONSerializer

from dashboard.actions import Guard
from dashboard.app import create_app
from farmcore import keys
from jobs import status
from tests.conftest import run_farm
from workers import metrics as metrics_mod
from workers.metrics import SupervisorMetrics

REAL = f"{socket.gethostname()}:4242:abcdef"
HOST = socket.gethostname()


@pytest.fixture
def env(farm_env, ledger):
    redis.Redis.from_url(farm_env["FARM_REDIS_URL"]).flushdb()
    yield dict(farm_env)
    redis.Redis.from_url(farm_env["FARM_REDIS_URL"]).flushdb()


FORGED = {"rq:worker:evil": {"birth": "garbage"},
          "rq:worker:evil-beat": {"last_heartbeat": "garbage", "state": "busy"},
          "rq:worker:evil-pid": {"pid": "abc"},
          b"rq:worker:\xff": {"birth": "2024-01-01T00:00:00Z"},  # a name that is not text
          "rq:worker:evil-string": "not a hash",
          "evil-no-prefix": {"birth": "2024-01-01T00:00:00Z"}}


def forge(conn: redis.Redis, key: str | bytes) -> None:
    """Add ``key`` to rq's registry of workers, written as ``FORGED`` says."""
    value = FORGED[key]
    if isinstance(value, dict):
        conn.hset(key, mapping=value)
    else:
        conn.set(key, value)
    conn.sadd("rq:workers", key)


@pytest.fixture
def conn(env):
    """Redis with the entry of one real (idle) worker."""
    c = redis.Redis.from_url(env["FARM_REDIS_URL"])
    real = Worker(["farm"], connection=c, name=REAL, serializer=JSONSerializer)
    real.register_birth()
    real.set_state("idle")
    return c


@pytest.mark.parametrize("key", list(FORGED))
def test_each_forged_worker_entry_is_skipped(rt, conn, key):
    forge(conn, key)
    view = status.workers_view(rt)
    assert list(view) == [HOST] and view[HOST]["workers"] == 1


UNREADABLE = len(FORGED)


def test_farm_status_skips_and_counts_forged_worker_entries(env, conn):
    for key in FORGED:
        forge(conn, key)
    out = run_farm(env, "status")
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    line = next(x for x in out.stdout.splitlines() if x.startswith("workers:"))
    assert f"{HOST}: 1 alive" in line and f"{UNREADABLE} unreadable" in line
    out = run_farm(env, "status", "--json")
    assert out.returncode == 0, out.stderr
    view = json.loads(out.stdout)
    assert view["unreadable_workers"] == UNREADABLE and list(view["workers"]) == [HOST]


def test_dashboard_page_and_metrics_answer_despite_forged_worker_entries(rt, conn):
    for key in FORGED:
        forge(conn, key)
    client = create_app(rt, Guard(allow=False)).test_client()
    page = client.get("/")
    assert page.status_code == 200 and REAL in page.get_data(as_text=True)
    scraped = client.get("/metrics")
    assert scraped.status_code == 200
    assert f'shardfarm_workers{{host="{HOST}",state="idle"}} 1.0' in scraped.get_data(as_text=True)


def test_supervisor_metrics_skip_forged_worker_entries(conn):
    for key in FORGED:
        forge(conn, key)
    metrics = SupervisorMetrics(HOST, "farm:timings:test")
    metrics.observe_workers(conn, [4242], desired=1)
    assert metrics.registry.get_sample_value(
        "shardfarm_supervisor_workers", {"host": HOST, "state": "alive"}) == 1


FORGED_SUPERVISORS = [b"garbage", b"[1, 2]", b'{"host": "h"}',
                      b'{"host": 7, "at": 1e12, "desired": 1}',
                      b'{"host": "h", "at": "now", "desired": 1}',
                      b'{"host": "h", "at": 1e12, "desired": "1"}',
                      b'{"host": "h", "at": 1e12, "desired": true}']


def test_forged_supervisor_heartbeats_are_skipped(rt, conn):
    """``farm status``, the dashboard and a command's worker check read the supervisors'
    heartbeats: entries that are not one (before: a traceback) are skipped."""
    real = {"host": HOST, "pid": 1, "workers": 1, "desired": 3, "queues": ["farm"],
            "at": time.time(), "farm_id": None}
    conn.hset(keys.supervisors(), mapping={f"evil{i}": raw
                                           for i, raw in enumerate(FORGED_SUPERVISORS)})
    conn.hset(keys.supervisors(), "real", json.dumps(real))
    assert [d["host"] for d in status.read_supervisors(conn)] == [HOST]
    assert status.workers_view(rt)[HOST]["desired"] == 3


FORGED_TIMINGS = [b"garbage", b"[1, 2]", b'{"queue": "q"}', b'{"queue": 7, "outcome": "x", '
                  b'"seconds": 1}', b'{"queue": "q", "outcome": "finished", "seconds": "1"}',
                  b'{"queue": "q", "outcome": "finished", "seconds": -1}',
                  b'{"queue": "q", "outcome": {"a": 1}, "seconds": 1}', b"\xff"]


def test_forged_job_timings_are_skipped_by_the_supervisor(conn):
    """A supervisor drains its workers' job records every tick: records pushed by anyone
    else (before: the tick raised, and the supervisor stopped) are skipped, and so are
    new label pairs past MAX_SERIES."""
    key = keys.job_timings("test:1")
    real = json.dumps({"queue": "farm", "outcome": "finished", "seconds": 0.5})
    many = [json.dumps({"queue": f"q{i}", "outcome": "finished", "seconds": 1})
            for i in range(250)]
    conn.rpush(key, *FORGED_TIMINGS, real, *many)
    metrics = SupervisorMetrics(HOST, key)
    while metrics.drain(conn):
        pass
    get = metrics.registry.get_sample_value
    assert get("shardfarm_jobs_ended_total", {"queue": "farm", "outcome": "finished"}) == 1
    assert get("shardfarm_jobs_ended_total", {"queue": "q", "outcome": "finished"}) is None
    series = {s.labels["queue"] for m in metrics.registry.collect()
              if m.name == "shardfarm_jobs_ended" for s in m.samples}
    assert len(series) == metrics_mod.MAX_SERIES < 250
