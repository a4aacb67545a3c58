"""Items that stop trying end in `farm failed` with their arguments and reason, `farm
retry-failed` runs them again, and the queued-items counter never drifts (real workers)."""

from __future__ import annotations

import json
import os

import pytest

from farmcore import keys
from jobs import enqueue_many
from tests.conftest import park_unfinished_runs, run_farm
from tests.farmkit import start_workers, stop, until

pytestmark = pytest.mark.slow  # end-to-end: real workers, servers or long waits

LATE = '''
from rq import get_current_job


def record(key: str, value: int) -> None:
    """Record key -> value, like tests.kinds.record, from a module only some machines have."""
    get_current_job().connection.hset("test:record", key, value)
'''


@pytest.fixture
def env(plain_env):
    """The farm's environment as operators set it (``plain_env``)."""
    return plain_env


@pytest.fixture
def conn(plain_conn):
    """Its Redis (``plain_conn``)."""
    return plain_conn


def _failed(env) -> list[dict]:
    out = run_farm(env, "failed", "--json")
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    return [r for r in rows if "where" in r]  # items and jobs (chunks of other tests' runs too)


def _queue(env) -> dict:
    out = run_farm(env, "status", "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["queues"]["farm"]


def test_an_item_the_workers_cannot_import_is_listed_and_retried(env, conn, tmp_path,
                                                                 monkeypatch, ledger):
    (tmp_path / "latejobs").mkdir()
    (tmp_path / "latejobs" / "__init__.py").write_text(LATE)
    monkeypatch.syspath_prepend(str(tmp_path))  # the enqueuing machine has the module
    items = [{"key": f"late{i}", "value": i} for i in range(3)]
    env["FARM_JOB_MODULES"] = "tests.kinds,latejobs"
    monkeypatch.setenv("FARM_JOB_MODULES", env["FARM_JOB_MODULES"])
    enqueue_many("farm", "latejobs.record", items, connection=conn)
    proc = start_workers(env, 1)  # workers without the module on their path
    try:
        until(lambda: len(_failed(env)) == 3, what="three failed items")
        assert _queue(env) | {"jobs": 0} == {"jobs": 0, "items": 0, "scheduled": 0,
                                               "failed_jobs": 0, "failed_items": 3}
    finally:
        stop(proc)
    failed = _failed(env)
    assert {f["args"]["key"] for f in failed} == {"late0", "late1", "late2"}
    assert all("cannot import 'latejobs.record'" in f["last_error"] for f in failed)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])  # module deployed
    proc = start_workers(env, 1)
    try:
        park_unfinished_runs(ledger)  # other tests' runs: this one is about items
        out = run_farm(env, "retry-failed")
        assert json.loads(out.stdout) == {"chunks": 0, "items": 3, "not_retried": 0}
        until(lambda: conn.hlen("test:record") == 3, what="the retried items")
        until(lambda: _queue(env)["items"] == 0, what="the queue to drain")
    finally:
        stop(proc)
    assert _failed(env) == [] and int(conn.get(keys.items_queued("farm"))) == 0


def test_a_job_that_times_out_ends_in_farm_failed(env, conn):
    items = [{"key": f"slow{i}", "value": i, "seconds": 3} for i in range(2)]
    enqueue_many("farm", "tests.kinds.slow_record", items, connection=conn, job_timeout=1,
                 retries=0)
    proc = start_workers(env, 1)
    try:
        until(lambda: len(_failed(env)) == 2, what="two timed-out items")
    finally:
        stop(proc)
    failed = _failed(env)
    assert all("JobTimeoutException" in f["last_error"] for f in failed)
    assert sorted(f["args"]["key"] for f in failed) == ["slow0", "slow1"]
    assert int(conn.get(keys.items_queued("farm"))) == 0
    assert not conn.keys(keys.inflight("farm", None))  # they may be enqueued again
    again = enqueue_many("farm", "tests.kinds.slow_record", items, connection=conn)
    assert again.as_dict() == {"enqueued": 2, "duplicates": 0}


def test_a_worker_killed_mid_batch_loses_nothing_and_counts_exactly(env, conn):
    """The worker dies at item 70 of 100, after its checkpoint at 50; rq retries the job from
    the checkpoint: every item lands, and the counter ends at exactly 0."""
    items = [{"key": f"k{i}", "value": i, "die": i == 70} for i in range(100)]
    enqueue_many("farm", "tests.kinds.die_once", items, connection=conn, batch=100)
    assert int(conn.get(keys.items_queued("farm"))) == 100
    proc = start_workers(env, 1)
    try:
        until(lambda: conn.exists("test:died:k70"), what="the worker's death")
        until(lambda: conn.hlen("test:record") == 100, timeout=90, what="every item")
        until(lambda: _queue(env)["items"] == 0, what="the job to finish")
    finally:
        stop(proc)
    assert _failed(env) == [] and int(conn.get(keys.items_queued("farm"))) == 0
    assert not conn.keys(keys.inflight("farm", None))
