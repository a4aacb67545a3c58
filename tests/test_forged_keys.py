"""Whatever anyone who can reach Redis writes into the farm's own keys (``farmcore.keys``):
wrong types, numbers that are not counts, text that is not UTF-8. No process crashes or
stops for good on it, no item is lost or run twice, and every status view still answers."""

from __future__ import annotations

import json
import time
import zlib

import pytest
import redis

from dashboard.actions import Guard
from dashboard.app import create_app
from farmcore import keys
from farmcore.ledger import ChunkSpec
from jobs import accounting, enqueue_many, runtime
from jobs.queue import rq_queue
from tests.conftest import run_farm
from tests.farmkit import start_workers, stop
from workers import maintenance
from workers.metrics import SupervisorMetrics, report_job

Q = "fq"
ITEMS = [{"key": f"k{i}", "value": i} for i in range(5)]
# values no farm process writes where a number belongs (a count, a resume point)
NOT_A_NUMBER = {"text": b"abc", "negative": b"-3", "huge": b"9" * 30, "float": b"1.5",
                "nan": b"nan", "not UTF-8": b"\xff\xfe", "past the items": b"1000000"}

# what a lock key may hold that no housekeeper wrote: -> how to write it
NOT_A_LOCK = {"no expiry": lambda c, k: c.set(k, "someone"),
              "a hash": lambda c, k: c.hset(k, "a", "b"),
              "a year's expiry": lambda c, k: c.set(k, "someone", ex=365 * 86400),
              "a list": lambda c, k: c.rpush(k, "\xff")}


@pytest.fixture
def conn(rt) -> redis.Redis:
    """The test Redis database (emptied before and after the test), ``rt`` this process's
    runtime (the in-process worker's policy)."""
    runtime.install(rt)
    return rt.redis


def forge(conn: redis.Redis, key: str, value: bytes | str) -> None:
    """Write ``value`` at ``key``: bytes as a string, ``"hash"`` / ``"list"`` as that type."""
    conn.delete(key)
    if value == "hash":
        conn.hset(key, "evil", "1")
    elif value == "list":
        conn.rpush(key, "evil")
    else:
        conn.set(key, value)


def _enqueue(conn: redis.Redis, items: list[dict] = ITEMS) -> list[str]:
    enqueue_many(Q, "tests.kinds.record", items, connection=conn, batch=len(items),
                 id_key="key")
    return [j.decode() for j in conn.lrange(f"rq:queue:{Q}", 0, -1)]


def _drain(env: dict) -> None:
    """A real ``farm workers --burst`` runs every queued job of ``Q``."""
    proc = start_workers(env, 1, "--burst", "--queues", Q)
    proc.wait(timeout=120)
    out = stop(proc)
    assert proc.returncode == 0 and "Traceback" not in out, out


def _books_closed(conn: redis.Redis, done: int = 5) -> None:
    """Every item ran (``test:record``), none is counted, held or failed."""
    assert sorted(conn.hkeys("test:record")) == sorted(f"k{i}".encode() for i in range(done))
    assert int(conn.get(keys.items_queued(Q)) or 0) == 0
    assert accounting.in_flight(conn, Q) == {} and conn.hlen(keys.job_items(Q)) == 0
    assert conn.hlen(keys.failed_items(Q)) == 0


@pytest.mark.parametrize("how", NOT_A_LOCK)
def test_housekeeping_takes_over_a_lock_key_no_housekeeper_wrote(rt, conn, how):
    """Before: ``SET NX`` never succeeded on it, and that housekeeping (settling failed
    jobs, promoting deferred items, the lost-job sweep, redispatching chunks) stopped for
    good: waits for deferred items hung."""
    for name in ("maintenance:queue:farm", "maintenance:ledger", "maintenance:redispatch"):
        NOT_A_LOCK[how](conn, keys.leader(name))
    assert maintenance.run_once(rt, "me", ["farm"])
    for name in ("maintenance:queue:farm", "maintenance:ledger", "maintenance:redispatch"):
        assert conn.get(keys.leader(name)) == b"me"
        assert 0 < conn.pttl(keys.leader(name)) <= maintenance.REDISPATCH_SECONDS * 1000


def test_a_live_housekeeping_lock_is_respected(rt, conn):
    conn.set(keys.leader("maintenance:queue:farm"), "other", ex=maintenance.LOCK_SECONDS)
    conn.set(keys.leader("maintenance:ledger"), "other", ex=maintenance.LOCK_SECONDS)
    assert not maintenance.run_once(rt, "me", ["farm"])
    assert conn.get(keys.leader("maintenance:ledger")) == b"other"


@pytest.mark.parametrize("value", [*NOT_A_NUMBER.values(), "hash", "list"],
                         ids=[*NOT_A_NUMBER, "hash", "list"])
def test_a_resume_point_written_into_redis_skips_no_item(env, conn, value):
    """Before: past the items, every item was skipped and nothing recorded (lost); negative,
    the last items ran twice; text or another type failed the job on every delivery."""
    (job,) = _enqueue(conn)
    forge(conn, keys.item_progress(job), value)
    _drain(env)
    _books_closed(conn)
    assert not conn.exists(keys.item_progress(job))


NOT_A_COUNTER = {k: v for k, v in NOT_A_NUMBER.items() if k not in ("negative", "past the items")}


@pytest.mark.parametrize("value", [*NOT_A_COUNTER.values(), "hash", "list"],
                         ids=[*NOT_A_COUNTER, "hash", "list"])
def test_an_items_counter_written_into_redis_stops_no_enqueue(env, conn, value):
    """Before: the commit script failed at its INCRBY after it had queued the job (Redis keeps
    a script's writes before an error): every enqueue on the queue raised, its items
    queued uncounted."""
    forge(conn, keys.items_queued(Q), value)
    _enqueue(conn)
    assert int(conn.get(keys.items_queued(Q))) == 5
    _drain(env)
    _books_closed(conn)


@pytest.mark.parametrize("key", ["failed", "jobitems", "inflight"])
def test_a_hash_of_the_books_overwritten_with_a_string_stops_no_enqueue(env, conn, key):
    """The failure records, the jobs holding items and a dedup bucket: before, WRONGTYPE on
    every enqueue of the queue (of the items of that bucket), half written."""
    name = {"failed": keys.failed_items(Q), "jobitems": keys.job_items(Q),
            "inflight": keys.inflight(Q, zlib.crc32(b"k3") % accounting.DEDUP_BUCKETS)}[key]
    forge(conn, name, b"evil")
    _enqueue(conn)
    assert accounting.in_flight(conn, Q)["k3"]
    _drain(env)
    _books_closed(conn)


@pytest.mark.parametrize("value", [b"abc", b"1000000", "hash", "list"])
def test_a_failed_job_whose_resume_point_is_garbage_records_every_item(conn, value):
    """Before: the settle script took the job out of rq's failed registry, then failed on
    the resume point: its items were never recorded, and stayed held for ever (a wait for
    them hung); past the items, none was recorded."""
    (job,) = _enqueue(conn)
    rq_queue(conn, Q).remove(job)
    registry = rq_queue(conn, Q).failed_job_registry
    conn.zadd(registry.key, {job: time.time() + 600})
    forge(conn, keys.item_progress(job), value)
    assert maintenance.settle_failed(conn, Q) == 1
    failed = {k.decode(): json.loads(v) for k, v in conn.hgetall(keys.failed_items(Q)).items()}
    assert sorted(failed) == [f"k{i}" for i in range(5)]
    assert int(conn.get(keys.items_queued(Q))) == 0 and accounting.in_flight(conn, Q) == {}
    assert registry.count == 0 and conn.hlen(keys.job_items(Q)) == 0


FORGED_RECORDS = {b"not json": b"{", b"a list": b"[1, 2]", b"no fields": b'{"a": 1}',
                  b"\xff\xfe": b"\xff", b"job:evil": b'{"function": 7}'}


@pytest.mark.usefixtures("park_leftover_runs")
def test_status_failed_and_retry_answer_whatever_their_keys_hold(env, conn, rt):
    """``farm status``, ``farm failed``, ``farm retry-failed`` and the dashboard (before: a
    traceback on a throttle reason or failure record that is not the farm's, a Redis error
    line on a counter or record hash of another type)."""
    _enqueue(conn)
    conn.set(keys.items_queued(Q), "lots")
    conn.hset(keys.failed_items(Q), mapping=FORGED_RECORDS)
    run_id = rt.ledger.create_run("test", Q, {"handler": "tests.kinds.write_edges"},
                                  [ChunkSpec("edges", {"shard": 1, "start": 0, "count": 1})])
    conn.set(keys.throttle(run_id), b"\xff" * 500)
    conn.sadd("rq:queues", "rq:queue:fq2")
    conn.set(keys.items_queued("fq2"), "x")  # another queue: its hashes of another type
    conn.rpush(keys.failed_items("fq2"), "x")
    conn.set(keys.supervisors(), "not a hash")
    done = run_farm(env, "status", "--json", "--run", run_id)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    view = json.loads(done.stdout)
    assert view["queues"][Q]["items"] == 0 and view["queues"][Q]["failed_items"] == 5
    assert view["queues"]["fq2"]["failed_items"] == 0
    assert view["runs"][0]["throttled"].startswith("\ufffd")
    done = run_farm(env, "failed", "--json")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    mine = [r for r in lines if str(r.get("where", "")).startswith(f"queue {Q} ")]
    assert len(mine) == 5, lines  # failed chunks of other tests' runs may be listed too
    assert all("unreadable failure record" in r["last_error"] for r in mine), mine
    done = run_farm(env, "retry-failed")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.count("its failure record is not the farm's") == 5, done.stderr
    client = create_app(rt, Guard(allow=False)).test_client()
    for page in ("/", "/metrics"):
        answer = client.get(page)
        assert answer.status_code == 200, page
    assert "\ufffd" * 10 in client.get("/").get_data(as_text=True)


@pytest.mark.parametrize("value", ["hash", b"text"])
def test_a_job_timings_key_of_another_type_stops_no_worker_nor_supervisor(conn, monkeypatch,
                                                                         value):
    """A worker pushes a record per job it ends onto its supervisor's list, which drains it
    every tick: before, WRONGTYPE stopped the worker after its job (and the next, and the
    next) and the supervisor at its next tick."""
    key = keys.job_timings("test:1")
    forge(conn, key, value)
    monkeypatch.setenv("FARM_METRICS_KEY", key)
    report_job(conn, Q, "finished", 0.5)  # skipped, not raised
    metrics = SupervisorMetrics("h", key)
    assert metrics.drain(conn) == 0 and not conn.exists(key)
    report_job(conn, Q, "finished", 0.5)
    assert metrics.drain(conn) == 1


@pytest.mark.parametrize("value", [b"text", "list"])
def test_a_supervisors_key_of_another_type_stops_no_supervisor(env, conn, value):
    """Before: the supervisor's heartbeat raised WRONGTYPE, and it stopped with a traceback
    before its workers took a job."""
    forge(conn, keys.supervisors(), value)
    _enqueue(conn)
    _drain(env)
    _books_closed(conn)
