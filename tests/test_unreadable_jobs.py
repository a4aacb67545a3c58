"""Whatever anyone writes into an rq job's hash: a hash rq cannot restore is refused like a
foreign job (`farm failed` lists it with its reason, its hash goes), and neither a worker
nor the housekeeping crashes on it or stops serving the jobs beside it."""

from __future__ import annotations

import json
import logging
import time

import pytest
import redis
from rq.job_lifecycle import record_job_failure
from rq.registry import StartedJobRegistry

from farmcore import keys
from jobs import enqueue_many
from jobs.farmjob import FarmJob
from jobs.queue import enqueue_later, rq_queue
from tests.conftest import run_farm
from tests.farmkit import start_workers, stop
from workers import maintenance

# The fields of rq's job hash that made rq's restore raise (each crashed a worker).
UNREADABLE = [("status", "bogus"), ("created_at", "garbage"), ("timeout", "abc"),
              ("result_ttl", "x"), ("retries_left", "x")]


@pytest.fixture
def env(plain_env):
    """The farm's environment as operators set it (``plain_env``)."""
    return plain_env


@pytest.fixture
def conn(plain_conn):
    """Its Redis (``plain_conn``)."""
    return plain_conn


def _enqueue(conn: redis.Redis, key: str, value: int) -> str:
    """One farm batch of one item on queue ``farm``; returns its rq job ID."""
    enqueue_many("farm", "tests.kinds.record", [{"key": key, "value": value}],
                 connection=conn, id_key="key")
    return conn.lindex("rq:queue:farm", -1).decode()


def _failed_items(conn: redis.Redis) -> dict[str, dict]:
    """``farm failed``'s records of queue ``farm``, by item ID."""
    return {k.decode(): json.loads(v) for k, v in conn.hgetall(keys.failed_items("farm")).items()}


@pytest.mark.slow
@pytest.mark.parametrize(("field", "value"), UNREADABLE)
def test_a_worker_refuses_a_job_whose_hash_rq_cannot_restore(env, conn, field, value):
    bad = _enqueue(conn, "bad", 1)
    conn.hset(f"rq:job:{bad}", field, value)
    _enqueue(conn, "good", 2)
    proc = start_workers(env, 1, "--burst")
    proc.wait(timeout=60)
    out = stop(proc)
    assert proc.returncode == 1 and conn.llen("rq:queue:farm") == 0, out  # it ran a failure
    assert out.splitlines()[-1] == ("farm: error: of what this burst ran, 1 job failed "
                                    "('farm failed' lists them)"), out
    assert conn.hgetall("test:record") == {b"good": b"2"}  # the next job still ran
    assert not conn.exists(f"rq:job:{bad}")
    listed = run_farm(env, "failed", "--json")
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    mine = [r for r in rows if r.get("where") == "queue farm item bad"]
    assert len(mine) == 1 and mine[0]["args"] == {"key": "bad", "value": 1}
    assert "unreadable" in mine[0]["last_error"] and f"{field}=" in mine[0]["last_error"]
    assert "Traceback" not in out and "unhandled exception" not in out, out


@pytest.mark.slow
def test_a_job_key_that_is_not_a_hash_is_no_job_not_a_crash(env, conn):
    bad = _enqueue(conn, "bad", 1)
    conn.delete(f"rq:job:{bad}")
    conn.set(f"rq:job:{bad}", "not a hash")
    _enqueue(conn, "good", 2)
    proc = start_workers(env, 1, "--burst")
    proc.wait(timeout=60)
    out = stop(proc)
    assert proc.returncode == 0 and conn.llen("rq:queue:farm") == 0, out
    assert conn.hgetall("test:record") == {b"good": b"2"}
    assert "is not an rq job hash" in out and "Traceback" not in out, out


def _housekeeping(rt) -> None:
    """One due round of the queue's housekeeping (the ledger's is left to other tests)."""
    rt.redis.delete(keys.leader("maintenance:queue:farm"))
    rt.redis.set(keys.leader("maintenance:ledger"), "someone else", ex=maintenance.LOCK_SECONDS)
    maintenance.run_once(rt, "test-owner", ["farm"])


def _failed_for_good(conn: redis.Redis, key: str) -> str:
    """A farm batch that failed for good (its worker died before settling it)."""
    job_id = _enqueue(conn, key, 4)
    q = rq_queue(conn, "farm")
    q.remove(job_id)
    job = FarmJob.fetch(job_id, connection=conn, serializer=q.serializer)
    with conn.pipeline() as pipe:
        record_job_failure(job, "RuntimeError: boom", pipe)
        pipe.execute()
    return job_id


def _scene(conn: redis.Redis) -> dict[str, str]:
    """A due delayed item, a failed job to settle, unreadable jobs in the scheduled
    registry (due) and the started one (expired: their worker is gone), and a key that is
    not a job hash in each registry."""
    q = rq_queue(conn, "farm")
    jobs = {name: enqueue_later(conn, "farm", "tests.kinds.record",
                                [[name, {"key": name, "value": 3}]], delay=60)
            for name in ("later", "sched_bad")}
    for job_id in jobs.values():
        conn.zadd(q.scheduled_job_registry.key, {job_id: 0})  # time passes: due
    conn.hset(f"rq:job:{jobs['sched_bad']}", "created_at", "garbage")
    jobs["wip_bad"] = _enqueue(conn, "wip_bad", 5)
    q.remove(jobs["wip_bad"])
    conn.hset(f"rq:job:{jobs['wip_bad']}", mapping={"status": "bogus", "timeout": "abc"})
    conn.zadd(StartedJobRegistry("farm", connection=conn).key,
              {f"{jobs['wip_bad']}:x": time.time() - 60})
    jobs["failed"] = _failed_for_good(conn, "failed")
    conn.set("rq:job:notahash", "x")  # a key that is not a job hash, in every registry
    conn.zadd(q.scheduled_job_registry.key, {"notahash": 0})
    conn.zadd(q.started_job_registry.key, {"notahash:x": time.time() - 60})
    conn.zadd(q.failed_job_registry.key, {"notahash": time.time() + 60})
    return jobs


def test_housekeeping_refuses_unreadable_jobs_and_does_the_rest(rt, conn, caplog):
    jobs = _scene(conn)
    with caplog.at_level(logging.WARNING):
        _housekeeping(rt)
    assert not [r for r in caplog.records if r.exc_info], "a housekeeping step raised"
    q = rq_queue(conn, "farm")
    assert q.job_ids == [jobs["later"]]  # the legitimate delayed item is due and queued
    assert q.scheduled_job_registry.count == q.started_job_registry.count == 0
    assert q.failed_job_registry.count == 0  # every failure settled in the same round
    failed = _failed_items(conn)
    assert sorted(failed) == ["failed", "sched_bad", "wip_bad"]
    assert "boom" in failed["failed"]["error"]
    assert "created_at='garbage'" in failed["sched_bad"]["error"]
    assert "status='bogus'" in failed["wip_bad"]["error"]
    values = {"failed": 4, "sched_bad": 3, "wip_bad": 5}
    for name, value in values.items():
        assert not conn.exists(f"rq:job:{jobs[name]}")
        assert failed[name]["kwargs"] == {"key": name, "value": value}


def test_a_housekeeping_step_that_fails_does_not_skip_the_later_ones(rt, conn, monkeypatch):
    q = rq_queue(conn, "farm")
    later = enqueue_later(conn, "farm", "tests.kinds.record", [["later", {"key": "l", "value": 1}]],
                          delay=60)
    conn.zadd(q.scheduled_job_registry.key, {later: 0})
    _failed_for_good(conn, "failed")

    def broken(queue):
        raise RuntimeError("injected: a registry entry rq cannot handle")
    monkeypatch.setattr(maintenance, "clean_registries", broken)
    _housekeeping(rt)
    assert q.job_ids == [later] and q.failed_job_registry.count == 0
    assert list(_failed_items(conn)) == ["failed"]


def test_a_job_that_cannot_be_settled_does_not_stop_the_others(rt, conn, monkeypatch):
    first, second = _failed_for_good(conn, "first"), _failed_for_good(conn, "second")
    real = maintenance.settle.settle_job

    def settle_job(c, queue, job_id):
        if job_id == first:
            raise ValueError("injected: whatever was written into this job")
        return real(c, queue, job_id)
    monkeypatch.setattr(maintenance.settle, "settle_job", settle_job)
    assert maintenance.settle_failed(conn, "farm") == 1
    assert rq_queue(conn, "farm").failed_job_registry.get_job_ids() == [first]
    assert list(_failed_items(conn)) == ["second"] and not conn.exists(f"rq:job:{second}")
