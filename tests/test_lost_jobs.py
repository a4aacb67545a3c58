"""Jobs whose rq hash is deleted or overwritten (by anyone with Redis access, an eviction, a
partial restore) while their items are counted as queued: the items are counted out once,
recorded in ``farm failed``, no longer block their IDs, and a wait for them ends (exit 1).

Each fault is injected at the exact step, on the real Redis."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import redis
from rq import SimpleWorker
from rq.serializers import JSONSerializer

from farmcore import keys
from jobs import accounting, enqueue_many, lost
from jobs.items import _fail
from jobs.itemwait import ItemWatch
from jobs.policy import JobPolicy
from jobs.queue import rq_queue
from jobs.settle import retry_failed
from shardfarm.errors import FatalError
from tests.conftest import ROOT
from workers import maintenance

Q = "lq"
ITEMS = [{"key": f"k{i}", "value": i} for i in range(10)]
REASON = "job data lost or overwritten in Redis"


def _enqueue(conn: redis.Redis, items: list[dict] = ITEMS, batch: int = 5) -> list[str]:
    """Enqueue ``items`` (IDs are their keys); returns the rq job IDs on the queue, in order."""
    enqueue_many(Q, "tests.kinds.record", items, connection=conn, batch=batch, id_key="key")
    return [j.decode() for j in conn.lrange(f"rq:queue:{Q}", 0, -1)]


def _counter(conn: redis.Redis, queue: str = Q) -> int:
    return int(conn.get(keys.items_queued(queue)) or 0)


def _failed(conn: redis.Redis, queue: str = Q) -> dict[str, dict]:
    return {k.decode(): json.loads(v) for k, v in conn.hgetall(keys.failed_items(queue)).items()}


def _drain(conn: redis.Redis, queue: str = Q) -> None:
    q = rq_queue(conn, queue)
    SimpleWorker([q], connection=conn, serializer=JSONSerializer,
                 job_class=q.job_class).work(burst=True)


def _keys(n: range) -> list[str]:
    return [f"k{i}" for i in n]


def _sweep(conn: redis.Redis) -> int:
    """Housekeeping's sweep, round after round until no job is marked lost (a pass of the
    dedup index: ``DEDUP_BUCKETS / SCAN_BUCKETS`` rounds at most); items counted out."""
    n = lost.sweep(conn, Q)
    for _ in range(accounting.DEDUP_BUCKETS // lost.SCAN_BUCKETS + 1):
        if not conn.zcard(keys.lost_jobs(Q)):
            return n
        n += lost.sweep(conn, Q)
    raise AssertionError("a pass of the dedup index did not count the lost jobs out")


def _housekeep(rt) -> None:
    """Housekeeping rounds (each lock taken afresh) until no job is marked lost."""
    for i in range(accounting.DEDUP_BUCKETS // lost.SCAN_BUCKETS + 2):
        rt.redis.delete(keys.leader(f"maintenance:queue:{Q}"))
        maintenance.run_once(rt, f"me{i}", [Q])
        if not rt.redis.zcard(keys.lost_jobs(Q)):
            return
    raise AssertionError("housekeeping did not count the lost jobs out")


def test_housekeeping_counts_out_and_records_the_items_of_a_deleted_job(rt):
    conn = rt.redis
    lost_job, _ = _enqueue(conn)
    conn.delete(accounting.JOB_PREFIX + lost_job)          # the fault: the job's hash goes
    _housekeep(rt)
    assert _counter(conn) == 5
    failed = _failed(conn)
    assert sorted(failed) == _keys(range(5))
    assert all(REASON in doc["error"] and doc["job"] == lost_job for doc in failed.values())
    assert sorted(accounting.in_flight(conn, Q)) == _keys(range(5, 10))
    _drain(conn)
    assert sorted(k.decode() for k in conn.hkeys("test:record")) == _keys(range(5, 10))
    assert _counter(conn) == 0 and accounting.in_flight(conn, Q) == {}
    n, kept = retry_failed(conn, Q, JobPolicy.from_env())  # arguments unknown: listed, kept
    assert n == 0 and len(kept) == 5 and "arguments were lost" in kept[0]
    assert enqueue_many(Q, "tests.kinds.record", ITEMS[:5], connection=conn,
                        id_key="key").enqueued == 5
    conn.delete(keys.leader(f"maintenance:queue:{Q}"))  # the next round (its lock is 4 s)
    assert maintenance.run_once(rt, "me2", [Q])  # nothing is counted out twice
    assert _counter(conn) == 5


def test_a_job_overwritten_with_a_string_blocks_nothing_and_is_counted_out(rt):
    conn = rt.redis
    lost_job, _ = _enqueue(conn)
    conn.set(accounting.JOB_PREFIX + lost_job, "not a job")
    again = enqueue_many(Q, "tests.kinds.record", ITEMS[:5], connection=conn, id_key="key")
    assert again.as_dict() == {"enqueued": 5, "duplicates": 0}
    _drain(conn)                                   # the worker skips the string, runs the rest
    assert conn.hlen("test:record") == 10
    _housekeep(rt)
    assert _counter(conn) == 0
    record = _failed(conn)[f"job:{lost_job}"]      # its items moved on: only the loss is told
    assert REASON in record["error"] and "5 unfinished item(s)" in record["error"]
    assert list(_failed(conn)) == [f"job:{lost_job}"]


def test_a_job_lost_half_way_counts_out_only_its_unfinished_items(plain_conn):
    conn = plain_conn
    (job,) = _enqueue(conn, batch=10)
    assert accounting.advance(conn, Q, job, 4, 10, _keys(range(4))) == 4
    conn.delete(accounting.JOB_PREFIX + job)
    assert _sweep(conn) == 6
    assert _counter(conn) == 0 and sorted(_failed(conn)) == _keys(range(4, 10))
    assert accounting.in_flight(conn, Q) == {}
    assert _sweep(conn) == 0 and _counter(conn) == 0


def test_a_job_that_finishes_while_housekeeping_looks_is_counted_once(plain_conn, monkeypatch):
    conn = plain_conn
    (job,) = _enqueue(conn, ITEMS[:5])
    real = lost.not_hashes

    def finishes_meanwhile(c, job_ids):
        job_ids = list(job_ids)
        assert job_ids == [job]                   # the sweep has read the job's entry
        accounting.advance(conn, Q, job, 5, 5, _keys(range(5)))  # its worker finishes it
        conn.delete(accounting.JOB_PREFIX + job)  # and rq's result_ttl lets its hash go
        return real(c, job_ids)

    monkeypatch.setattr(lost, "not_hashes", finishes_meanwhile)
    assert _sweep(conn) == 0
    assert _counter(conn) == 0 and _failed(conn) == {}


def test_a_worker_still_running_a_reaped_job_cannot_count_it_again(plain_conn):
    conn = plain_conn
    (job,) = _enqueue(conn, ITEMS[:5])
    conn.delete(accounting.JOB_PREFIX + job)
    assert _sweep(conn) == 5 and _counter(conn) == 0
    conn.hset(accounting.JOB_PREFIX + job, "last_heartbeat", "x")  # its heartbeat writes again
    assert accounting.advance(conn, Q, job, 5, 5, _keys(range(5))) == 0
    assert _counter(conn) == 0
    assert lost.reap(conn, Q, job, _keys(range(5))) == (-1, 0)  # a hash again: left be


def test_a_failed_job_whose_data_is_gone_is_settled_with_its_items(plain_conn):
    conn = plain_conn
    (job,) = _enqueue(conn, ITEMS[:5])
    conn.zadd(rq_queue(conn, Q).failed_job_registry.key, {job: time.time() + 600})
    conn.delete(accounting.JOB_PREFIX + job)      # e.g. its failure_ttl ran out first
    assert maintenance.settle_failed(conn, Q) == 1
    _sweep(conn)
    assert _counter(conn) == 0 and sorted(_failed(conn)) == _keys(range(5))
    assert rq_queue(conn, Q).failed_job_registry.count == 0


@pytest.mark.parametrize("fault", ["deleted", "overwritten"])
def test_waiting_calls_the_items_of_a_lost_job_failed_never_done(plain_conn, fault):
    conn = plain_conn
    watch = ItemWatch(conn, Q)
    enqueue_many(Q, "tests.kinds.record", ITEMS, connection=conn, batch=5, id_key="key",
                 on_ids=watch.add)
    lost_job = conn.lindex(f"rq:queue:{Q}", 0).decode()
    if fault == "deleted":
        conn.delete(accounting.JOB_PREFIX + lost_job)
    else:
        conn.set(accounting.JOB_PREFIX + lost_job, "not a job")
    first = watch.poll()
    assert (first.done, first.failed, first.finished) == (0, 5, False)
    assert _counter(conn) == 5 and sorted(_failed(conn)) == _keys(range(5))
    _drain(conn)
    last = watch.poll()
    assert (last.done, last.failed, last.finished) == (5, 5, True)
    assert _counter(conn) == 0


@pytest.mark.slow
def test_enqueue_wait_ends_with_exit_1_when_its_job_is_overwritten(plain_env, tmp_path):
    conn = redis.Redis.from_url(plain_env["FARM_REDIS_URL"])
    items = tmp_path / "items.jsonl"
    items.write_text("".join(json.dumps(kw) + "\n" for kw in ITEMS[:3]))
    proc = subprocess.Popen([sys.executable, "-m", "scripts", "enqueue", Q, "tests.kinds.record",
                             "--file", str(items), "--wait", "--id-key", "key"], env=plain_env,
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (job := conn.lindex(f"rq:queue:{Q}", 0)):  # no worker: the job stays queued
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.05)
    conn.set(accounting.JOB_PREFIX + job.decode(), "not a job")
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 1, err
    assert json.loads(out.strip().splitlines()[-1]) == {"enqueued": 3, "duplicates": 0,
                                                        "done": 0, "failed": 3}
    assert "3 item(s) failed: 'farm failed'" in err and _counter(conn) == 0


def test_a_job_written_into_redis_by_hand_is_recorded_when_it_fails_and_counts_nothing(rt):
    """A farm batch enqueued with rq itself (not by ``enqueue_many``: its items never
    counted) that fails: its items are listed in ``farm failed``, and no counter goes below
    zero (nothing of it was counted, nothing is counted out)."""
    conn = rt.redis
    items = [["r1", {"cmd": "true"}], ["r2", {"cmd": "true"}]]  # a function not allowed
    rq_queue(conn, Q).enqueue("jobs.items.run_items", function="subprocess.getoutput",
                              items=items)
    _drain(conn)
    maintenance.run_once(rt, "me", [Q])
    assert sorted(_failed(conn)) == ["r1", "r2"]
    assert _counter(conn) == 0 and conn.hlen(keys.job_items(Q)) == 0


def test_reaping_keeps_the_failure_record_an_item_already_has(plain_conn):
    """An item its worker failed (with its arguments) before the checkpoint that releases
    it keeps that record when its job is then reaped: 'farm retry-failed' can still run it."""
    conn = plain_conn
    (job,) = _enqueue(conn, ITEMS[:5])
    _fail(conn, Q, "tests.kinds.record", ["k0", ITEMS[0]], 1, FatalError("bad k0"), job)
    conn.delete(accounting.JOB_PREFIX + job)
    assert _sweep(conn) == 5
    failed = _failed(conn)
    assert failed["k0"]["kwargs"] == ITEMS[0] and "bad k0" in failed["k0"]["error"]
    assert all(REASON in failed[k]["error"] for k in _keys(range(1, 5)))
    n, kept = retry_failed(conn, Q, JobPolicy.from_env())
    assert n == 1 and len(kept) == 4


@pytest.mark.parametrize("cursor", [b"banana", b"1.5", b"99999999999999999999999", None])
def test_a_sweep_cursor_written_by_anyone_does_not_stop_the_sweep(plain_conn, cursor):
    conn = plain_conn
    (job,) = _enqueue(conn, ITEMS[:5])
    if cursor is None:
        conn.rpush(keys.lost_sweep(Q), "not a cursor")
    else:
        conn.set(keys.lost_sweep(Q), cursor)
    conn.delete(accounting.JOB_PREFIX + job)
    assert _sweep(conn) == 5
    assert _counter(conn) == 0 and sorted(_failed(conn)) == _keys(range(5))


@pytest.mark.parametrize("count", ["lots", "1.5", "-3", "1e400"])
def test_a_count_written_into_job_items_stops_no_reap(plain_conn, count):
    """A job's entry in keys.job_items that is not a count is the items the dedup index
    still names; a sweep reaps it and the jobs after it (every round failed on it before)."""
    conn = plain_conn
    first, second = _enqueue(conn)
    conn.hset(keys.job_items(Q), first, count)
    conn.delete(accounting.JOB_PREFIX + first, accounting.JOB_PREFIX + second)
    assert _sweep(conn) == 10
    assert _counter(conn) == 0 and sorted(_failed(conn)) == _keys(range(10))
    assert conn.hlen(keys.job_items(Q)) == 0 and accounting.in_flight(conn, Q) == {}


def test_settling_a_failed_job_whose_count_is_not_a_number(plain_conn):
    conn = plain_conn
    (job,) = _enqueue(conn, ITEMS[:5])
    registry = rq_queue(conn, Q).failed_job_registry
    conn.zadd(registry.key, {job: time.time() + 600})
    conn.hset(keys.job_items(Q), job, "lots")
    assert maintenance.settle_failed(conn, Q) == 1
    _sweep(conn)
    assert _counter(conn) == 0 and sorted(_failed(conn)) == _keys(range(5))
    assert registry.count == 0 and conn.hlen(keys.job_items(Q)) == 0


def test_a_job_the_reap_fails_on_does_not_stop_the_others(plain_conn):
    conn = plain_conn
    first, second = _enqueue(conn)
    conn.rpush(keys.item_progress(first), "not a resume point")   # GET fails on it
    conn.delete(accounting.JOB_PREFIX + first, accounting.JOB_PREFIX + second)
    assert _sweep(conn) == 5
    assert _counter(conn) == 5 and sorted(_failed(conn)) == _keys(range(5, 10))
    assert conn.hkeys(keys.job_items(Q)) == [first.encode()]      # left as it was, whole
    assert accounting.in_flight(conn, Q) == {k: first for k in _keys(range(5))}


def test_settling_failed_jobs_whose_data_is_gone_reads_no_dedup_index(plain_conn):
    """Each such job read the whole dedup index (65,536 buckets, over a second even when
    empty): settling only marks them, and the sweep's scan finds their items."""
    conn = plain_conn
    jobs = _enqueue(conn, batch=2)
    registry = rq_queue(conn, Q).failed_job_registry
    conn.zadd(registry.key, {job: time.time() + 600 for job in jobs})
    conn.delete(*(accounting.JOB_PREFIX + job for job in jobs))
    assert maintenance.settle_failed(conn, Q) == 5
    assert registry.count == 0 and conn.zcard(keys.lost_jobs(Q)) == 5
    assert _counter(conn) == 10 and _failed(conn) == {} and conn.get(keys.lost_scan(Q)) is None
    assert _sweep(conn) == 10
    assert _counter(conn) == 0 and sorted(_failed(conn)) == _keys(range(10))
    assert accounting.in_flight(conn, Q) == {} and conn.hlen(keys.lost_named(Q)) == 0


def test_a_wait_for_an_item_no_reap_can_free_ends_with_the_error(plain_conn):
    """Housekeeping logs such a job and goes on; a wait cannot: it would wait for ever."""
    conn = plain_conn
    watch = ItemWatch(conn, Q)
    enqueue_many(Q, "tests.kinds.record", ITEMS[:5], connection=conn, id_key="key",
                 on_ids=watch.add)
    (job,) = [j.decode() for j in conn.lrange(f"rq:queue:{Q}", 0, -1)]
    conn.rpush(keys.item_progress(job), "not a resume point")
    conn.delete(accounting.JOB_PREFIX + job)
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        watch.poll()


def test_a_job_reaped_while_its_worker_runs_it_leaves_no_false_loss(plain_conn):
    """The sweep reaps a job whose hash went while its worker runs it (an eviction, a stray
    DEL); the worker goes on and finishes every item. Those items were recorded in 'farm
    failed' as lost and stayed there for good, though each ran."""
    conn = plain_conn
    enqueue_many(Q, "tests.kinds.loses_its_job", ITEMS[:5], connection=conn, id_key="key")
    _drain(conn)
    assert conn.exists("test:lost:k0") and conn.hlen("test:record") == 5
    assert _failed(conn) == {}
    assert _counter(conn) == 0 and accounting.in_flight(conn, Q) == {}
    assert conn.hlen(keys.job_items(Q)) == 0


@pytest.mark.parametrize("entries", ["named", "unnamed"])
def test_a_reaped_job_whose_data_comes_back_and_runs_is_not_a_loss(plain_conn, entries):
    """A queued job's hash goes (a partial restore, a DEL), the sweep reaps it, then the
    hash is back (restored) and a worker runs it: its items are done, counted out once, and
    no 'lost' record of them (by ID, or the job's 'IDs unknown' line) is left."""
    conn = plain_conn
    (job,) = _enqueue(conn, ITEMS[:5])
    saved = conn.dump(accounting.JOB_PREFIX + job)
    conn.delete(accounting.JOB_PREFIX + job)
    if entries == "unnamed":  # the index lost them too: the reap cannot name the items
        for key in conn.keys(keys.inflight(Q, None)):
            conn.delete(key)
    while conn.hexists(keys.job_items(Q), job):
        _sweep(conn)
    assert _counter(conn) == 0 and len(_failed(conn)) == (5 if entries == "named" else 1)
    conn.restore(accounting.JOB_PREFIX + job, 0, saved)
    _drain(conn)
    assert conn.hlen("test:record") == 5
    assert _failed(conn) == {}
    assert _counter(conn) == 0 and accounting.in_flight(conn, Q) == {}


def test_a_reaped_job_that_comes_back_and_fails_for_good_lists_each_item_once(plain_conn):
    """Back after its reap, the job runs 2 items, checkpoints, and rq then gives up on it:
    'farm failed' lists exactly its 3 unfinished items, by ID with their arguments, and
    no longer the reap's line of the job (which would count them twice)."""
    conn = plain_conn
    (job,) = _enqueue(conn, ITEMS[:5])
    saved = conn.dump(accounting.JOB_PREFIX + job)
    conn.delete(accounting.JOB_PREFIX + job)
    for key in conn.keys(keys.inflight(Q, None)):
        conn.delete(key)
    while conn.hexists(keys.job_items(Q), job):
        _sweep(conn)
    conn.restore(accounting.JOB_PREFIX + job, 0, saved)
    assert accounting.advance(conn, Q, job, 2, 5, _keys(range(2))) == 0  # counted out: 0
    conn.zadd(rq_queue(conn, Q).failed_job_registry.key, {job: time.time() + 600})
    assert maintenance.settle_failed(conn, Q) == 1
    failed = _failed(conn)
    assert sorted(failed) == _keys(range(2, 5))
    assert all(failed[k]["kwargs"] == ITEMS[int(k[1:])] for k in failed)
    assert _counter(conn) == 0 and not conn.exists(keys.item_progress(job))
