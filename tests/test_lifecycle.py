"""Time limits are honoured: a chunk's job timeout follows its size, and a chunk that runs out
of time ends the attempt cleanly and is tried again with twice the time (real workers, rq's
own timeout)."""

from __future__ import annotations

import time

import pytest

from farmcore.context import ChunkContext
from farmcore.ledger import ChunkSpec, Lease
from jobs import runs
from jobs.queue import rq_queue
from jobs.runtime import Runtime
from shardfarm.errors import ChunkTimeoutError
from tests.farmkit import start_workers, stop, until


def _job_timeouts(rt: Runtime, run_id: str) -> list[int]:
    q = rq_queue(rt.redis, "farm")
    ids = q.get_job_ids() + q.scheduled_job_registry.get_job_ids()
    jobs = q.job_class.fetch_many(ids, connection=rt.redis, serializer=q.serializer)
    return [j.timeout for j in jobs if j and j.kwargs["items"][0][1]["run_id"] == run_id]


def test_a_chunk_job_timeout_follows_the_chunks_size(rt):
    hours = 2
    run_id = runs.start(rt, "test", "tests.kinds.sleepy", [ChunkSpec("nap", {"seconds": 0})],
                        params={"chunk_rows": 100 * 3600 * hours})
    assert _job_timeouts(rt, run_id) and min(_job_timeouts(rt, run_id)) >= 3600 * hours


@pytest.mark.slow
def test_a_chunk_that_outlives_its_job_timeout_ends_cleanly_and_gets_more_time(rt, env):
    run_id = runs.start(rt, "test", "tests.kinds.sleepy", [ChunkSpec("nap", {"seconds": 3})],
                        params={"chunk_timeout": 2})
    assert _job_timeouts(rt, run_id) == [2]
    proc = start_workers(env, 1)
    try:
        until(lambda: rt.ledger.refresh_status(run_id) != "running", timeout=90,
              what="the run to end")
    finally:
        out = stop(proc)
    chunk = rt.ledger.chunk(run_id, 0)
    assert rt.ledger.run(run_id)["status"] == "done", (chunk, out)
    assert chunk["attempts"] == 2  # the first attempt ran out of time, the second had 4 s
    finished = [int(a) for a in rt.redis.lrange(f"test:sleepy:{run_id}", 0, -1)]
    assert finished == [2]
    assert "JobTimeoutException" in out and "Traceback" not in out
    assert rq_queue(rt.redis, "farm").failed_job_registry.count == 0  # rq never gave up


def test_past_its_deadline_a_chunk_stops_at_the_next_check(rt, ledger):
    run_id = ledger.create_run("test", "farm", {"handler": "tests.kinds.sleepy"},
                               [ChunkSpec("nap", {"seconds": 0})])
    lease = ledger.claim(run_id, 0, "me")
    assert isinstance(lease, Lease)
    ctx = ChunkContext(rt.settings, rt.router, ledger, lease, {}, time_limit=time.monotonic() + 60)
    ctx.check()  # in time
    ctx.time_limit = time.monotonic() - 0.001
    with pytest.raises(ChunkTimeoutError):
        ctx.check()
    ledger.fail(lease, "test", None)


def test_a_chunk_a_worker_cannot_route_fails_with_the_reason(rt, ledger, farm_env, tmp_path,
                                                              park_leftover_runs):
    """Before, a worker whose shard map could not be read claimed the chunk, raised, and left
    it 'running' under its lease with no line logged: 'farm status' showed it running."""
    from jobs import lifecycle
    from shardfarm.settings import Settings
    run_id = ledger.create_run("test", "farm", {"handler": "tests.kinds.sleepy"},
                               [ChunkSpec("nap", {"seconds": 0})])
    gone = Settings.from_env({**farm_env, "FARM_SHARDMAP": str(tmp_path / "gone.json")})
    lost = Runtime(gone)
    try:
        assert lifecycle.execute(lost, run_id, 0) == "failed"
    finally:
        lost.close()
    chunk = ledger.chunk(run_id, 0)
    assert chunk["state"] == "failed" and chunk["lease_owner"] is None, chunk
    assert "cannot read shard map" in chunk["last_error"] and "gone.json" in chunk["last_error"]
