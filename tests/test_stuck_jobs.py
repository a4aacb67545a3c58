"""A worker SIGKILLed after taking a job off its queue and before starting it (rq keeps the
job in the queue's intermediate list): housekeeping delivers it again, once, a minute after
it was first seen there, or fails it when it has no deliveries left; it never touches a job
a live worker has just taken (real Redis, real worker processes)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import redis
from rq.intermediate_queue import IntermediateQueue

from farmcore import keys
from jobs import enqueue_many
from jobs.queue import rq_queue
from tests.conftest import ROOT
from tests.farmkit import until
from tests.test_lost_jobs import _counter, _drain, _failed
from workers import maintenance
from workers.worker import FarmWorker

Q = "sq"
ITEMS = [{"key": f"k{i}", "value": i} for i in range(4)]
# a worker process that SIGKILLs itself once it has taken a job, before starting it
KILLED_ON_TAKING = ("import os, signal, sys\n"
                    "import workers.worker as w\n"
                    "w.taken = lambda job: os.kill(os.getpid(), signal.SIGKILL)\n"
                    f"sys.exit(w.main(['--queues', '{Q}', '--burst']))\n")
# a worker in whose hands a job is between taken and started while a housekeeping round runs
ROUND_ON_TAKING = ("import sys\n"
                   "import workers.worker as w\n"
                   "from farmcore import keys\n"
                   "from jobs import runtime\n"
                   "from workers import maintenance\n"
                   "def taken(job):\n"
                   "    rt = runtime.get()\n"
                   f"    rt.redis.delete(keys.leader('maintenance:queue:{Q}'))\n"
                   f"    maintenance.run_once(rt, 'in-the-window', ['{Q}'])\n"
                   "    mark = rt.redis.keys('*first_seen*')\n"
                   "    rt.redis.rpush('test:marks', *mark or [b'none'])\n"
                   "w.taken = taken\n"
                   f"sys.exit(w.main(['--queues', '{Q}', '--burst']))\n")


def _taken_and_killed(env: dict, conn: redis.Redis) -> str:
    """Enqueue ITEMS as one job, let a real worker take it and die; the job's ID."""
    enqueue_many(Q, "tests.kinds.record", ITEMS, connection=conn, batch=len(ITEMS), id_key="key")
    out = subprocess.run([sys.executable, "-c", KILLED_ON_TAKING], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == -9, out.stderr
    inter = IntermediateQueue(rq_queue(conn, Q).key, connection=conn)
    ids = inter.get_job_ids()
    assert len(ids) == 1 and not conn.llen(f"rq:queue:{Q}"), ids
    return ids[0]


def _round(rt) -> None:
    """One housekeeping round of the queue (its lock taken afresh)."""
    rt.redis.delete(keys.leader(f"maintenance:queue:{Q}"))
    maintenance.run_once(rt, "me", [Q])


def _age(conn: redis.Redis, job_id: str, seconds: float) -> None:
    """Move the time housekeeping first saw the job back by ``seconds`` (the clock's jump)."""
    key = IntermediateQueue(rq_queue(conn, Q).key, connection=conn).get_first_seen_key(job_id)
    conn.set(key, float(conn.get(key)) - seconds)


def test_a_job_whose_worker_died_before_starting_it_runs_once(env, rt):
    conn = rt.redis
    job_id = _taken_and_killed(env, conn)
    _round(rt)
    _age(conn, job_id, maintenance.STUCK_SECONDS - 30)
    _round(rt)  # seen for less than STUCK_SECONDS: a live worker may be about to start it
    assert conn.lrange(f"{rq_queue(conn, Q).key}:intermediate", 0, -1) == [job_id.encode()]
    _age(conn, job_id, 30)
    _round(rt)
    until(lambda: (_round(rt), conn.llen(f"rq:queue:{Q}"))[1] == 1,
          what="the job delivered again (after its rq Retry interval)")
    assert not conn.llen(f"rq:queue:{Q}:intermediate")
    _drain(conn, Q)
    assert {k.decode(): int(v) for k, v in conn.hgetall("test:record").items()} == \
        {i["key"]: i["value"] for i in ITEMS}
    assert _counter(conn, Q) == 0 and not _failed(conn, Q)
    _round(rt)
    assert not conn.llen(f"rq:queue:{Q}") and not conn.exists("rq:queue:sq:intermediate")


def test_a_stuck_job_with_no_deliveries_left_is_failed_with_its_items(env, rt):
    conn = rt.redis
    job_id = _taken_and_killed(env, conn)
    conn.hset(f"rq:job:{job_id}", "retries_left", 0)
    _round(rt)
    _age(conn, job_id, maintenance.STUCK_SECONDS)
    _round(rt)
    failed = _failed(conn, Q)
    assert sorted(failed) == sorted(i["key"] for i in ITEMS)
    assert all("before starting it" in f["error"] for f in failed.values()), failed
    assert _counter(conn, Q) == 0
    assert not conn.llen(f"rq:queue:{Q}") and not conn.llen(f"rq:queue:{Q}:intermediate")


@pytest.mark.parametrize("mark", [b"not a time", None])
def test_entries_written_by_anyone_stop_no_redelivery(env, rt, mark):
    """A missing job, a job key that is not a hash, and a first-seen mark that is not a
    time (or of another type) in front of a stuck job: the stuck job is still delivered, a
    minute after the mark is made anew (a forged mark never makes a job look abandoned)."""
    conn = rt.redis
    job_id = _taken_and_killed(env, conn)
    inter = f"rq:queue:{Q}:intermediate"
    conn.set("rq:job:forged", "x")
    conn.lpush(inter, job_id.encode(), b"gone", b"forged")
    conn.lrem(inter, -1, job_id)  # the stuck job last, behind the garbage
    first_seen = IntermediateQueue(rq_queue(conn, Q).key, connection=conn).get_first_seen_key
    if mark is None:
        conn.rpush(first_seen(job_id), 1)
    else:
        conn.set(first_seen(job_id), mark)
    _round(rt)
    assert conn.lrange(inter, 0, -1) == [job_id.encode()]  # the garbage gone, the job kept
    _age(conn, job_id, maintenance.STUCK_SECONDS)
    until(lambda: (_round(rt), conn.llen(f"rq:queue:{Q}"))[1] == 1,
          what="the stuck job delivered again")
    assert not conn.llen(inter)
    _drain(conn, Q)
    assert conn.hlen("test:record") == len(ITEMS)


def test_a_round_reads_a_slice_of_a_huge_intermediate_list(env, rt):
    """Whatever is written there, a round looks at STUCK_SLICE entries at most."""
    conn = rt.redis
    inter = f"rq:queue:{Q}:intermediate"
    for start in range(0, 3 * maintenance.STUCK_SLICE, 1000):
        conn.rpush(inter, *[f"none-{i}" for i in range(start, start + 1000)])
    before = conn.llen(inter)
    _round(rt)
    assert before - conn.llen(inter) == maintenance.STUCK_SLICE


def test_an_entry_of_a_job_that_ran_is_dropped_and_nothing_is_run_again(env, rt):
    """An entry of a job whose status says it ran (left there, or written by anyone):
    housekeeping drops it a minute later and delivers nothing."""
    conn = rt.redis
    enqueue_many(Q, "tests.kinds.record", ITEMS, connection=conn, batch=len(ITEMS), id_key="key")
    q = rq_queue(conn, Q)
    job_id = conn.lmove(q.key, f"{q.key}:intermediate").decode()  # taken, as rq takes it
    conn.hset(f"rq:job:{job_id}", "status", "finished")
    _round(rt)
    _age(conn, job_id, maintenance.STUCK_SECONDS)
    _round(rt)
    assert not conn.llen(f"rq:queue:{Q}:intermediate") and not conn.llen(f"rq:queue:{Q}")
    assert not q.scheduled_job_registry.get_job_ids() and not _failed(conn, Q)
    assert q.fetch_job(job_id).get_status() == "finished" and not conn.exists("test:record")


def test_rqs_own_worker_maintenance_leaves_a_stuck_job_to_housekeeping(env, rt):
    """rq's workers clean the intermediate lists every ten minutes and would fail the job:
    the farm's workers leave it to housekeeping, which delivers it again (one cleaner)."""
    conn = rt.redis
    job_id = _taken_and_killed(env, conn)
    _round(rt)
    _age(conn, job_id, maintenance.STUCK_SECONDS)
    FarmWorker([rq_queue(conn, Q)], connection=conn).clean_registries()
    assert conn.lrange(f"rq:queue:{Q}:intermediate", 0, -1) == [job_id.encode()]
    assert not rq_queue(conn, Q).failed_job_registry.get_job_ids()
    until(lambda: (_round(rt), conn.llen(f"rq:queue:{Q}"))[1] == 1,
          what="the job delivered again")


def test_two_housekeepers_at_one_stuck_job_deliver_it_once(env, rt, monkeypatch):
    """Rounds can overlap (a round longer than its lock): the second housekeeper finishes
    its delivery while the first is between its check and its write; the first writes
    nothing (one delivery, one use of the job's delivery budget)."""
    conn = rt.redis
    job_id = _taken_and_killed(env, conn)
    _round(rt)
    _age(conn, job_id, maintenance.STUCK_SECONDS)
    queue = rq_queue(conn, Q)
    budget = queue.fetch_job(job_id).retries_left
    checked, other = maintenance._abandoned, []

    def overtaken(inter, job):
        found = checked(inter, job)
        if not other:  # the other housekeeper, all the way, at this very step
            other.append("running")
            other.append(maintenance._redeliver(rq_queue(conn, Q), job))
        return found
    monkeypatch.setattr(maintenance, "_abandoned", overtaken)
    assert maintenance._redeliver(queue, job_id) is False and other == ["running", True]
    assert queue.fetch_job(job_id).retries_left == budget - 1
    assert queue.scheduled_job_registry.get_job_ids() == [job_id]
    assert not conn.llen(f"rq:queue:{Q}") and not conn.llen(f"rq:queue:{Q}:intermediate")


def test_a_job_a_worker_starts_is_timed_afresh_if_it_is_ever_taken_again(env, rt):
    """A round that looks while a live worker holds a job between taking and starting it
    marks it; starting the job deletes the mark, so a later take of the same job (delivered
    again after its worker died mid-run) is not taken for abandoned at once."""
    conn = rt.redis
    enqueue_many(Q, "tests.kinds.ordered_record", ITEMS, connection=conn, batch=len(ITEMS),
                 id_key="key")
    out = subprocess.run([sys.executable, "-c", ROUND_ON_TAKING], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    (marked,) = conn.lrange("test:marks", 0, -1)
    assert b"first_seen" in marked  # the round saw it in the window
    assert not conn.exists(marked) and not conn.llen(f"rq:queue:{Q}:intermediate")
    assert conn.lrange("test:order", 0, -1) == [i["key"].encode() for i in ITEMS]


def test_a_job_whose_worker_starts_it_meanwhile_is_neither_delivered_nor_failed(env, rt,
                                                                               monkeypatch):
    """A worker frozen for a minute between taking and starting a job wakes and starts it
    while housekeeping is between its check and its write: housekeeping writes nothing."""
    conn = rt.redis
    job_id = _taken_and_killed(env, conn)
    _round(rt)
    _age(conn, job_id, maintenance.STUCK_SECONDS)
    queue = rq_queue(conn, Q)
    checked = maintenance._abandoned

    def woken(inter, job):
        found = checked(inter, job)
        conn.hset(f"rq:job:{job_id}", "status", "started")  # the worker starts it, as rq does
        conn.lrem(f"rq:queue:{Q}:intermediate", 1, job_id)
        return found
    monkeypatch.setattr(maintenance, "_abandoned", woken)
    assert maintenance._redeliver(queue, job_id) is False
    assert queue.fetch_job(job_id).get_status() == "started"
    assert not queue.scheduled_job_registry.get_job_ids() and not conn.llen(f"rq:queue:{Q}")
    assert not queue.failed_job_registry.get_job_ids() and not _failed(conn, Q)


def test_an_entry_of_a_started_job_is_dropped_and_the_job_left_running(env, rt):
    """A readable job whose status says it started (written by anyone, or left by rq's own
    workers of several queues): its entry goes, nothing is delivered or failed."""
    conn = rt.redis
    job_id = _taken_and_killed(env, conn)
    conn.hset(f"rq:job:{job_id}", "status", "started")
    _round(rt)
    _age(conn, job_id, maintenance.STUCK_SECONDS)
    _round(rt)
    queue = rq_queue(conn, Q)
    assert not conn.llen(f"rq:queue:{Q}:intermediate") and not conn.llen(f"rq:queue:{Q}")
    assert not queue.scheduled_job_registry.get_job_ids()
    assert not queue.failed_job_registry.get_job_ids() and not _failed(conn, Q)
