"""``workers.launch``: what starting a run tells the operator beside starting it."""

import pytest

from farmcore.ledger import ChunkSpec
from loaders.migration import migrate as migration
from workers import launch


@pytest.fixture
def made_runs(rt):
    """Runs a test makes, cancelled and deleted after it: a migrate run left behind would be
    the latest one, whose open shards every later migration of the suite reuses."""
    made: list[str] = []
    yield made
    for run_id in made:
        rt.ledger.cancel(run_id)
        for table in ("quarantine", "chunks", "runs"):
            rt.ledger.pool.execute(f"DELETE FROM {table} WHERE run_id = %s", (run_id,))


def test_a_migration_started_beside_an_unfinished_one_names_it(rt, made_runs):
    params = {"open_shards": migration.open_shards(rt.router, rt.ledger)}
    run_id = rt.ledger.create_run("migrate", "farm", params,
                                  [ChunkSpec("users", {"table": "users", "lo": 0, "hi": 9})])
    made_runs.append(run_id)
    note = launch.busy_migration_note(rt)
    assert note is not None and note.startswith(f"migrate run {run_id} is not finished: ")
    assert note.endswith(f"'farm cancel {run_id}' ends it")
    rt.ledger.cancel(run_id)
    assert run_id not in (launch.busy_migration_note(rt) or "")  # cancelled: not running


def test_runs_of_other_kinds_are_not_named(rt, made_runs):
    run_id = rt.ledger.create_run("reverse", "farm", {}, [ChunkSpec("k", {"i": 0})])
    made_runs.append(run_id)
    assert run_id not in (launch.busy_migration_note(rt) or "")


def test_a_migration_behind_many_newer_runs_of_other_kinds_is_named(rt, made_runs):
    """The active runs were read 20 at a time, newest first, and only those checked for a
    migration: one started before 20 others was not named."""
    params = {"open_shards": migration.open_shards(rt.router, rt.ledger)}
    first = rt.ledger.create_run("migrate", "farm", params,
                                 [ChunkSpec("users", {"table": "users", "lo": 0, "hi": 9})])
    made_runs.append(first)
    for i in range(21):
        made_runs.append(rt.ledger.create_run("reverse", "farm", {}, [ChunkSpec("k", {"i": i})],
                                              run_id=f"reverse-launch-test-{i}"))
    rt.ledger.pool.execute("UPDATE runs SET created_at = created_at - INTERVAL 1 MINUTE "
                           "WHERE run_id = %s", (first,))  # older than all of them
    assert (launch.busy_migration_note(rt) or "").startswith(f"migrate run {first} is not")
