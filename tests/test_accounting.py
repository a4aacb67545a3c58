"""Items in flight on real Redis: atomic commit, bounded dedup, exact counters."""

from __future__ import annotations

import pytest
import redis
from rq import SimpleWorker
from rq.serializers import JSONSerializer

from farmcore import keys
from jobs import accounting, enqueue_many, lost
from jobs.queue import item_id, rq_queue

ITEMS = [{"key": f"k{i}", "value": i} for i in range(120)]


@pytest.fixture
def conn(settings):
    c = redis.Redis.from_url(settings.redis_url)
    c.flushdb()
    yield c
    c.flushdb()


def _drain(conn: redis.Redis, queue: str = "t") -> None:
    q = rq_queue(conn, queue)
    SimpleWorker([q], connection=conn, serializer=JSONSerializer,
                 job_class=q.job_class).work(burst=True)


def _queued_items(conn: redis.Redis, queue: str = "t") -> list[str]:
    """Item IDs carried by the jobs on the queue, read from rq's job data (plain rq API)."""
    q = rq_queue(conn, queue)
    return sorted(i[0] for job in q.get_jobs() for i in job.kwargs["items"])


def _counter(conn: redis.Redis, queue: str = "t") -> int:
    return int(conn.get(keys.items_queued(queue)) or 0)


class _Dropped(redis.Redis):
    """A client whose next pipeline loses the connection, before or after Redis ran it."""

    after = False
    armed = True

    def pipeline(self, *args, **kwargs):
        pipe = super().pipeline(*args, **kwargs)
        if not self.armed:
            return pipe
        self.armed, execute = False, pipe.execute

        def dropped(*a, **k):
            if self.after:
                execute(*a, **k)
            raise redis.ConnectionError("connection lost (injected)")
        pipe.execute = dropped
        return pipe


def _ids(conn: redis.Redis, queue: str = "t") -> list[tuple[str, bytes]]:
    """Items in the dedup index of ``queue`` and their jobs, read with plain Redis commands."""
    return sorted((k.decode(), v) for key in conn.scan_iter(match=keys.inflight(queue, None))
                  for k, v in conn.hgetall(key).items())


EXPECTED = sorted(item_id("tests.kinds.record", kw) for kw in ITEMS)


@pytest.mark.slow
def test_a_connection_lost_before_the_commit_leaves_every_item_enqueueable(conn, settings):
    broken = _Dropped.from_url(settings.redis_url)
    with pytest.raises(redis.ConnectionError):
        enqueue_many("t", "tests.kinds.record", ITEMS, connection=broken)
    again = enqueue_many("t", "tests.kinds.record", ITEMS, connection=conn)
    assert again.as_dict() == {"enqueued": 120, "duplicates": 0}
    assert _queued_items(conn) == EXPECTED and _counter(conn) == 120


def test_a_reply_lost_after_the_commit_keeps_each_item_queued_once(conn, settings):
    broken = _Dropped.from_url(settings.redis_url)
    broken.after = True
    with pytest.raises(redis.ConnectionError):
        enqueue_many("t", "tests.kinds.record", ITEMS, connection=broken)
    again = enqueue_many("t", "tests.kinds.record", ITEMS, connection=conn)
    assert again.as_dict() == {"enqueued": 0, "duplicates": 120}
    assert _queued_items(conn) == EXPECTED and _counter(conn) == 120


@pytest.mark.slow
def test_finished_items_can_be_enqueued_again(conn):
    assert enqueue_many("t", "tests.kinds.record", ITEMS, connection=conn).enqueued == 120
    _drain(conn)
    assert conn.hlen("test:record") == 120 and _counter(conn) == 0
    conn.delete("test:record")
    assert enqueue_many("t", "tests.kinds.record", ITEMS, connection=conn).enqueued == 120
    _drain(conn)
    assert conn.hlen("test:record") == 120 and _counter(conn) == 0


@pytest.mark.slow
def test_dedup_holds_only_items_in_flight(conn):
    enqueue_many("t", "tests.kinds.record", ITEMS, connection=conn)
    assert sorted(i for i, _ in _ids(conn)) == EXPECTED
    _drain(conn)
    assert _ids(conn) == [] and conn.keys("farm:inflight:*") == []


def test_duplicates_within_one_input_and_across_calls(conn):
    res = enqueue_many("t", "tests.kinds.record", [*ITEMS[:10], *ITEMS[:10]], connection=conn)
    assert res.as_dict() == {"enqueued": 10, "duplicates": 10}
    res = enqueue_many("t", "tests.kinds.record", ITEMS[5:15], connection=conn, batch=3)
    assert res.as_dict() == {"enqueued": 5, "duplicates": 5}
    assert _queued_items(conn) == sorted(i[0] for i in _ids(conn)) and _counter(conn) == 15


def test_a_deleted_job_does_not_keep_its_items_as_duplicates(conn):
    """An operator's `rq empty` (or an evicted job) must not make items unenqueueable."""
    enqueue_many("t", "tests.kinds.record", ITEMS[:5], connection=conn)
    rq_queue(conn, "t").empty()
    assert enqueue_many("t", "tests.kinds.record", ITEMS[:5], connection=conn).enqueued == 5


def test_advance_moves_once_whoever_repeats_it(conn):
    enqueue_many("t", "tests.kinds.record", ITEMS[:10], connection=conn, batch=10)
    job_id = _ids(conn)[0][1].decode()
    ids = [i for i, _ in _ids(conn)]
    assert accounting.advance(conn, "t", job_id, 5, 10, ids[:5]) == 5
    assert accounting.advance(conn, "t", job_id, 5, 10, ids[:5]) == 0  # a zombie's repeat
    assert accounting.advance(conn, "t", job_id, 3, 10, ids[:3]) == 0  # a zombie behind
    assert _counter(conn) == 5 and len(_ids(conn)) == 5
    assert accounting.advance(conn, "t", job_id, 10, 10, ids) == 5
    assert _counter(conn) == 0 and _ids(conn) == []
    assert not conn.exists(keys.item_progress(job_id))  # nothing left behind
    for progress in (10, 7):  # a zombie still running the finished job
        assert accounting.advance(conn, "t", job_id, progress, 10, ids) == 0
    assert _counter(conn) == 0


def test_a_half_done_job_keeps_its_progress_however_long_it_waits(conn):
    """The resume point lived 7 days: a job left half done longer (a queue without workers
    over a holiday) started again from 0, and its second advance counted the first half out
    twice (the counter fell below the items still queued; a wait ended early)."""
    enqueue_many("t", "tests.kinds.record", ITEMS[:10], connection=conn, batch=10)
    job_id = _ids(conn)[0][1].decode()
    ids = [i for i, _ in _ids(conn)]
    assert accounting.advance(conn, "t", job_id, 5, 10, ids[:5]) == 5
    assert conn.ttl(keys.item_progress(job_id)) == -1  # no expiry
    assert accounting.advance(conn, "t", job_id, 10, 10, ids) == 5
    assert not conn.exists(keys.item_progress(job_id))


@pytest.mark.parametrize("end", ["settled", "reaped"])
def test_a_job_counted_out_leaves_no_progress_behind(conn, end):
    """Without an expiry, whatever counts a half-done job out must delete its progress."""
    enqueue_many("t", "tests.kinds.record", ITEMS[:10], connection=conn, batch=10)
    job_id = _ids(conn)[0][1].decode()
    ids = [i for i, _ in _ids(conn)]
    assert accounting.advance(conn, "t", job_id, 4, 10, ids[:4]) == 4
    if end == "settled":
        conn.zadd("test:failed-registry", {job_id: 0})
        records = [(item, "{}") for item in ids]
        assert accounting.settle(conn, "t", "test:failed-registry", job_id, records)
    else:
        conn.delete(accounting.JOB_PREFIX + job_id)
        assert lost.reap(conn, "t", job_id, ids) == (6, 6)
    assert _counter(conn) == 0
    assert not conn.exists(keys.item_progress(job_id))


def test_a_deferred_item_stays_in_flight_until_it_runs(conn):
    enqueue_many("t", "tests.kinds.flaky_once", [{"key": "f", "value": 1}], connection=conn)
    _drain(conn)  # first run fails: the item is deferred as a scheduled job of its own
    assert conn.hget("test:record", "f") is None
    assert enqueue_many("t", "tests.kinds.flaky_once", [{"key": "f", "value": 1}],
                        connection=conn).duplicates == 1
    scheduled = rq_queue(conn, "t").scheduled_job_registry.get_job_ids()
    assert len(scheduled) == 1 and _ids(conn)[0][1].decode() == scheduled[0]
    assert _counter(conn) == 1
    from workers.maintenance import promote_scheduled
    for job_id in scheduled:  # time passes: the deferral is due
        conn.zadd(rq_queue(conn, "t").scheduled_job_registry.key, {job_id: 0})
    promote_scheduled(conn, rq_queue(conn, "t"))
    _drain(conn)
    assert conn.hget("test:record", "f") == b"1"
    assert _counter(conn) == 0 and _ids(conn) == []
