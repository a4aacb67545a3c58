"""The lost-job scan at scale: a mass loss reads the dedup index a bounded slice a round,
whatever the index holds (on a private Redis, whose command counts are the test's own)."""

from __future__ import annotations

import pytest
import redis

from farmcore import keys
from jobs import accounting, lost
from tests.servers import PrivateRedis
from tests.test_lost_jobs import Q, _counter, _enqueue, _failed


@pytest.fixture
def big_index():
    """A private Redis (its command counts are this test's alone) whose dedup index holds
    400,000 items of a live job, beside which 3 jobs of 5 items each are then lost."""
    server = PrivateRedis.start()
    conn = redis.Redis.from_url(server.url())
    try:
        conn.hset(accounting.JOB_PREFIX + "live", "status", "started")
        per_bucket: dict[str, dict[str, str]] = {}
        for i in range(BIG_INDEX):
            item = f"big{i}"
            per_bucket.setdefault(accounting.buckets(Q, [item])[0], {})[item] = "live"
        with conn.pipeline(transaction=False) as pipe:
            for bucket, entries in per_bucket.items():
                pipe.hset(bucket, mapping=entries)
            pipe.execute()
        yield conn
    finally:
        conn.close()
        server.stop()


BIG_INDEX = 400_000


def test_a_mass_loss_reads_the_dedup_index_in_bounded_slices(big_index):
    """Each sweep round with a lost job read the whole dedup index (65,536 buckets, all its
    entries into the client), round after round while jobs were lost: time and memory grew
    with the index. A round now reads at most SCAN_BUCKETS buckets, stops once SCAN_ITEMS
    entries were read, and sends back only the lost jobs' items; a pass reaps them all."""
    conn = big_index
    jobs = _enqueue(conn, [{"key": f"k{i}", "value": i} for i in range(15)])
    conn.delete(*(accounting.JOB_PREFIX + job for job in jobs))
    before = accounting.in_flight(conn, Q)
    assert len(before) == BIG_INDEX + 15
    per_call = max(conn.hlen(b) for b in conn.scan_iter(match=keys.inflight(Q, None),
                                                        count=10_000)) * lost.SCAN_CALL
    rounds, counted = 0, 0
    while rounds == 0 or conn.zcard(keys.lost_jobs(Q)):
        rounds += 1
        assert rounds <= 2 * accounting.DEDUP_BUCKETS // lost.SCAN_CALL
        calls, sent = _stats(conn)
        counted += lost.sweep(conn, Q)
        calls2, sent2 = _stats(conn)
        assert calls2 - calls <= lost.SCAN_BUCKETS        # buckets read this round
        assert sent2 - sent < 200_000                     # bytes to the client this round
    assert counted == 15 and _counter(conn) == 0
    assert sorted(_failed(conn)) == sorted(f"k{i}" for i in range(15))
    assert accounting.in_flight(conn, Q) == {k: v for k, v in before.items() if v == "live"}
    out = lost.scan(conn, Q)  # nothing marked: nothing read
    assert (out.buckets, out.entries) == (0, 0)
    job = _enqueue(conn, [{"key": "m", "value": 1}])[-1]
    conn.delete(accounting.JOB_PREFIX + job)
    conn.hset(keys.job_items(Q), job, 2)  # an item the index does not name: a whole pass
    assert lost.reap(conn, Q, job, final=False) == (0, 0)  # marked
    out = lost.scan(conn, Q)
    assert out.buckets <= lost.SCAN_BUCKETS
    assert lost.SCAN_ITEMS <= out.entries <= lost.SCAN_ITEMS + per_call


def _stats(conn: redis.Redis) -> tuple[int, int]:
    """HGETALL calls (a script's too) and bytes sent to clients, since the server started."""
    cmd = conn.info("commandstats").get("cmdstat_hgetall", {}).get("calls", 0)
    return int(cmd), int(conn.info("stats")["total_net_output_bytes"])
