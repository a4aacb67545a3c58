"""Runs never spin or hang: a paused run produces no jobs, every pending chunk without a live
job gets exactly one, and ``retry-failed`` covers every unfinished chunk (real Redis, the
real control database, real workers)."""

from __future__ import annotations

import json

import pytest

from farmcore import keys
from farmcore.ledger import ChunkSpec, Lease
from jobs import runs
from jobs.dispatch import chunk_item, dispatch
from jobs.queue import rq_queue
from jobs.runtime import Runtime
from tests.conftest import SHARDS_A, run_farm
from tests.farmkit import start_workers, until
from workers import maintenance

HANDLER = "tests.kinds.write_edges"


pytestmark = pytest.mark.usefixtures("park_leftover_runs")


def _make_run(rt: Runtime, base: int, n: int) -> str:
    """A run recorded in the ledger whose chunks were never given a job."""
    chunks = [ChunkSpec("edges", {"shard": SHARDS_A[0] + 5, "start": base + 50 * i,
                                  "count": 50}) for i in range(n)]
    return rt.ledger.create_run("test", "farm", {"handler": HANDLER}, chunks)


def _jobs(rt: Runtime, run_id: str) -> int:
    """Jobs in Redis (queued or scheduled) carrying a chunk of ``run_id`` (the session's
    ledger holds other tests' runs too)."""
    q = rq_queue(rt.redis, "farm")
    ids = q.get_job_ids() + q.scheduled_job_registry.get_job_ids()
    jobs = [j for j in q.job_class.fetch_many(ids, connection=rt.redis, serializer=q.serializer)
            if j is not None]
    return sum(item[1]["run_id"] == run_id for j in jobs for item in j.kwargs["items"])


def _housekeeping(rt: Runtime, rounds: int) -> None:
    """``rounds`` rounds of the supervisors' housekeeping, each one due (no lock left over)."""
    for _ in range(rounds):
        for name in ("maintenance:ledger", "maintenance:queue:farm", "maintenance:redispatch"):
            rt.redis.delete(keys.leader(name))
        maintenance.run_once(rt, "test-owner", ["farm"])


def test_a_paused_run_whose_lease_expired_produces_no_jobs(rt):
    run_id = _make_run(rt, 11_000_000, 3)
    dead = rt.ledger.claim(run_id, 0, "killed-worker", lease_seconds=0.05)
    assert isinstance(dead, Lease)
    rt.ledger.set_paused(run_id, True)
    # this chunk's own state: expire_leases() also counts other tests' leftover leases
    until(lambda: rt.ledger.expire_leases() >= 0
          and rt.ledger.chunk(run_id, 0)["state"] == "pending",
          what="the dead worker's lease to expire")
    _housekeeping(rt, 8)
    assert _jobs(rt, run_id) == 0  # nothing dispatched while paused, however many rounds
    lost = rt.ledger.chunk(run_id, 0)
    assert lost["state"] == "pending" and "lease expired" in lost["last_error"]
    assert runs.unpause(rt, run_id) == 3 and _jobs(rt, run_id) == 3  # each chunk once
    assert runs.resume(rt, run_id) == 0 and _jobs(rt, run_id) == 3
    _housekeeping(rt, 3)
    assert _jobs(rt, run_id) == 3


@pytest.mark.slow
def test_a_pending_chunk_whose_job_was_used_up_is_dispatched_again(rt, env):
    run_id = runs.start(rt, "test", HANDLER, [
        ChunkSpec("edges", {"shard": SHARDS_A[0] + 5, "start": 12_000_000 + 50 * i,
                            "count": 50}) for i in range(4)])
    assert _jobs(rt, run_id) == 4
    rq_queue(rt.redis, "farm").empty()  # the jobs are gone (used up, or lost with Redis)
    assert _jobs(rt, run_id) == 0
    _housekeeping(rt, 1)
    assert _jobs(rt, run_id) == 4
    _housekeeping(rt, 3)
    assert _jobs(rt, run_id) == 4  # at most one job per chunk
    proc = start_workers(env, 1, "--burst")
    proc.wait(timeout=120)
    assert rt.ledger.refresh_status(run_id) == "done"


@pytest.mark.slow
def test_retry_failed_covers_every_unfinished_chunk(rt, env):
    run_id = _make_run(rt, 13_000_000, 3)  # pending chunks, no job, nothing failed
    out = run_farm(env, "retry-failed", "--run", run_id)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["chunks"] == 3 and _jobs(rt, run_id) == 3
    again = run_farm(env, "retry-failed", "--run", run_id)
    assert json.loads(again.stdout)["chunks"] == 0 and _jobs(rt, run_id) == 3
    proc = start_workers(env, 1, "--burst")
    proc.wait(timeout=120)
    assert rt.ledger.refresh_status(run_id) == "done"


def test_a_chunk_already_carried_by_a_live_job_is_not_dispatched_twice(rt):
    run_id = _make_run(rt, 14_000_000, 2)
    run = rt.ledger.run(run_id)
    assert dispatch(rt.redis, run, [0, 1]) == 2
    assert dispatch(rt.redis, run, [0, 1]) == 0
    assert runs.resume(rt, run_id) == 0 and _jobs(rt, run_id) == 2
    from jobs.accounting import in_flight
    assert set(in_flight(rt.redis, "farm")) == {chunk_item(run_id, 0), chunk_item(run_id, 1)}


@pytest.mark.slow
def test_a_worker_sees_a_paused_run_and_leaves_its_chunk_pending(rt, env):
    run_id = runs.start(rt, "test", HANDLER, [
        ChunkSpec("edges", {"shard": SHARDS_A[0] + 5, "start": 15_000_000, "count": 50})])
    rt.ledger.set_paused(run_id, True)
    proc = start_workers(env, 1, "--burst")
    proc.wait(timeout=120)
    assert rt.ledger.chunk(run_id, 0)["state"] == "pending" and _jobs(rt, run_id) == 0
    assert runs.unpause(rt, run_id) == 1
    proc = start_workers(env, 1, "--burst")
    proc.wait(timeout=120)
    until(lambda: rt.ledger.refresh_status(run_id) == "done", what="the run to finish")
