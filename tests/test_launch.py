"""``workers.launch``: what starting a run tells the operator beside starting it."""

from farmcore.ledger import ChunkSpec
from workers import launch


def test_a_migration_started_beside_an_unfinished_one_names_it(rt):
    run_id = rt.ledger.create_run("migrate", "farm", {"open_shards": []},
                                  [ChunkSpec("users", {"table": "users", "lo": 0, "hi": 9})])
    try:
        note = launch.busy_migration_note(rt)
        assert note is not None and note.startswith(f"migrate run {run_id} is not finished: ")
        assert note.endswith(f"'farm cancel {run_id}' ends it")
    finally:
        rt.ledger.cancel(run_id)
    assert run_id not in (launch.busy_migration_note(rt) or "")  # cancelled: not running


def test_runs_of_other_kinds_are_not_named(rt):
    run_id = rt.ledger.create_run("reverse", "farm", {}, [ChunkSpec("k", {"i": 0})])
    try:
        assert run_id not in (launch.busy_migration_note(rt) or "")
    finally:
        rt.ledger.cancel(run_id)
