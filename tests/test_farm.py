"""The farm with real worker processes: crashes, Redis loss, zombies, scaling, shutdown."""

import json
import os
import signal
import time

import pytest
from rq import Worker

from farmcore import keys
from farmcore.ledger import ChunkSpec
from jobs import runs
from sharding import ids
from sharding.schema import shard_table
from tests.conftest import SHARDS_A, SHARDS_B, run_farm
from tests.farmkit import children, start_workers, stop, until

pytestmark = pytest.mark.slow  # end-to-end: real workers, servers or long waits

HANDLER = "tests.kinds.write_edges"




def chunks(base: int, n: int, count: int = 200, pause: float = 0.0):
    """n chunks alternating between the two servers, rows base.. on each."""
    shards = [SHARDS_A[0] + 2, SHARDS_B[0] + 2]
    return [ChunkSpec("edges", {"shard": shards[i % 2], "start": base + i * count,
                                "count": count, "pause": pause}) for i in range(n)]


def rows_present(router, specs) -> int:
    """Distinct rows in the target, counted with plain SQL (not the handler's code)."""
    total = 0
    for spec in specs:
        a = spec.args
        owner = ids.encode(a["shard"], "user", 7)
        lo, hi = ids.encode(a["shard"], "pin", a["start"]), ids.encode(
            a["shard"], "pin", a["start"] + a["count"] - 1)
        q = shard_table(a["shard"], "user_has_pins")
        total += router.run(a["shard"], lambda cur, q=q, o=owner, lo=lo, hi=hi: (cur.execute(
            f"SELECT COUNT(*) FROM {q} WHERE from_id=%s AND to_id BETWEEN %s AND %s",
            (o, lo, hi)), cur.fetchone()[0])[1])
    return total


def test_run_completes_exactly_with_burst_workers(rt, env, router):
    specs = chunks(1_000_000, 6)
    run_id = runs.start(rt, "test", HANDLER, specs)
    proc = start_workers(env, 2, "--burst")
    proc.wait(timeout=120)
    assert runs.summary(rt, run_id) == {"run_id": run_id, "status": "done",
                                        "loaded": {"edges": 1200}, "quarantined": {"edges": 0},
                                        "failed_chunks": 0}
    assert rows_present(router, specs) == 1200


def test_sigkilled_worker_chunk_runs_again_exactly(rt, env, router):
    specs = chunks(2_000_000, 3, count=300, pause=0.1)  # ~0.6 s per chunk
    run_id = runs.start(rt, "test", HANDLER, specs)
    proc = start_workers(env, 1)
    try:
        until(lambda: rt.ledger.progress(run_id)[0]["running"], what="a running chunk")
        victim = children(proc.pid)[0]
        os.kill(victim, signal.SIGKILL)
        assert runs.wait(rt, run_id, timeout=90) == "done"
    finally:
        stop(proc)
    attempts = [rt.ledger.chunk(run_id, c)["attempts"] for c in range(3)]
    assert max(attempts) >= 2  # the killed chunk ran again
    assert rows_present(router, specs) == 900
    assert runs.summary(rt, run_id)["loaded"] == {"edges": 900}


def test_redis_flushed_mid_run_then_resume(rt, env, router):
    specs = chunks(3_000_000, 8, count=100, pause=0.1)
    run_id = runs.start(rt, "test", HANDLER, specs)
    proc = start_workers(env, 1)
    try:
        until(lambda: rt.ledger.progress(run_id)[0]["done"] >= 1, what="a finished chunk")
        rt.redis.flushdb()  # Redis lost everything: queued jobs are gone
        out = run_farm(env, "resume", run_id, "--wait", timeout=120)
        assert out.returncode == 0, out.stderr
        summary = json.loads(out.stdout.strip().splitlines()[-1])
        assert summary["status"] == "done" and summary["loaded"] == {"edges": 800}
    finally:
        stop(proc)
    assert rows_present(router, specs) == 800


def test_frozen_zombie_is_fenced(rt, env, router):
    specs = chunks(4_000_000, 1, count=400, pause=0.2)  # ~1.6 s of work
    run_id = runs.start(rt, "test", HANDLER, specs)
    zombie = start_workers(env, 1)
    try:
        until(lambda: rt.ledger.chunk(run_id, 0)["state"] == "running", what="chunk start")
        worker_pid = children(zombie.pid)[0]
        os.kill(worker_pid, signal.SIGSTOP)  # freeze mid-chunk: its lease will expire
        os.kill(zombie.pid, signal.SIGSTOP)  # and its supervisor, so it cannot help
        heir = start_workers(env, 1)
        try:
            assert runs.wait(rt, run_id, timeout=90) == "done"
            fence = rt.ledger.chunk(run_id, 0)["fence"]
            os.kill(zombie.pid, signal.SIGCONT)
            os.kill(worker_pid, signal.SIGCONT)  # the zombie wakes up and tries to go on
            time.sleep(3)
            chunk = rt.ledger.chunk(run_id, 0)
            assert chunk["state"] == "done" and chunk["fence"] == fence >= 2
        finally:
            stop(heir)
    finally:
        os.kill(zombie.pid, signal.SIGCONT)
        out = stop(zombie)
    assert "taken over" in out or "no longer current" in out or "lease lost" in out
    assert rows_present(router, specs) == 400


def _worker_count(conn) -> int:
    return len(Worker.all(connection=conn))


def test_scale_and_signals(env, rt):
    proc = start_workers(env, 1)
    try:
        until(lambda: _worker_count(rt.redis) == 1, what="1 worker")
        assert run_farm(env, "scale", "3").returncode == 0
        until(lambda: _worker_count(rt.redis) == 3, timeout=30, what="3 workers")
        assert len(children(proc.pid)) == 3
        assert run_farm(env, "scale", "1").returncode == 0
        until(lambda: len(children(proc.pid)) == 1, timeout=30, what="scale down to 1")
        rt.redis.delete(keys.desired_workers(None))
        os.kill(proc.pid, signal.SIGUSR1)
        until(lambda: len(children(proc.pid)) == 2, timeout=30, what="SIGUSR1 -> 2")
        os.kill(proc.pid, signal.SIGUSR2)
        until(lambda: len(children(proc.pid)) == 1, timeout=30, what="SIGUSR2 -> 1")
    finally:
        stop(proc)
    assert proc.returncode == 0


def test_sigterm_finishes_job_in_hand_and_loses_nothing(env, rt):
    from jobs import enqueue_many
    items = [{"key": f"s{i}", "value": i, "seconds": 1.0} for i in range(4)]
    enqueue_many("farm", "tests.kinds.slow_record", items, connection=rt.redis, batch=1)
    proc = start_workers(env, 1)
    until(lambda: any(w.get_state() == "busy" for w in Worker.all(connection=rt.redis)),
          what="a busy worker")
    stop(proc)
    assert proc.returncode == 0
    done = rt.redis.hlen("test:record")
    assert 1 <= done < 4  # the job in hand finished, the rest stayed queued
    assert rt.redis.llen("rq:queue:farm") == 4 - done
    proc = start_workers(env, 1, "--burst")
    proc.wait(timeout=60)
    assert sorted(rt.redis.hkeys("test:record")) == [b"s0", b"s1", b"s2", b"s3"]


def test_second_sigterm_stops_at_once_and_the_job_runs_later(env, rt):
    from jobs import enqueue_many
    enqueue_many("farm", "tests.kinds.slow_record", [{"key": "long", "value": 1,
                                                     "seconds": 6}], connection=rt.redis)
    proc = start_workers(env, 1)
    until(lambda: any(w.get_state() == "busy" for w in Worker.all(connection=rt.redis)),
          what="a busy worker")
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    time.sleep(1.2)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=15)
    assert time.monotonic() - t0 < 10 and rt.redis.hlen("test:record") == 0
    retry = start_workers({**env}, 1)  # the interrupted job is retried, not lost
    try:
        until(lambda: rt.redis.hget("test:record", "long"), timeout=90, what="the retried job")
    finally:
        stop(retry)
