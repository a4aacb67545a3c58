"""``farm status`` lines (scripts.render): rows of those expected per kind, and the whole
run's rates and ETA."""

from farmcore.progress import KindProgress, RunProgress
from scripts.render import runs_lines, status_lines


def _view(paused: bool) -> dict:
    kinds = [KindProgress("users", 3000, 3000, 0, 2990, 10, 1, 0, 0, 1),
             KindProgress("pins", 12345, None, None, 12000, 345, 3, 1, 2, 7)]
    p = RunProgress(15345, None, 4, 1, 2, 8, 10.0, 1534.5, 2300.0, 21.0, paused, False, kinds)
    run = {"run_id": "migrate-x", "kind": "migrate", "status": "running", "paused": paused,
           "queue": "farm", "throttled": None, "created_at": "2026-11-24T17:00:00",
           "progress": p.as_dict()}
    return {"runs": [run], "workers": {}, "queues": {}}


def test_status_shows_rows_per_kind_and_one_run_line():
    lines = status_lines(_view(paused=True))
    assert lines[0].startswith("run migrate-x  migrate  running PAUSED")
    assert lines[2].split() == ["users", "1/1", "0", "0", "3,000/3,000", "2,990", "10"]
    assert lines[3].split() == ["pins", "3/7", "2", "1", "12,345/?", "12,000", "345"]
    assert lines[4] == ("  run: 15,345/? rows, 4/8 chunks, 2,300 rows/s over the last minute, "
                        "1,534 since start (paused time left out), ETA 0:00:21")
    assert lines[-2:] == ["workers: none", "queues: none"]


def test_a_run_that_ended_with_failed_chunks_does_not_say_done():
    """Before, a failed run's line ended in 'done' (0/6 chunks, 6 failed: '…, done')."""
    kinds = [KindProgress("users", 0, 3000, 0, 0, 0, 0, 1, 0, 1)]
    p = RunProgress(0, 3000, 0, 1, 0, 1, 5.0, 0.0, 0.0, None, False, True, kinds)
    run = {"run_id": "migrate-x", "kind": "migrate", "status": "failed", "paused": False,
           "queue": "farm", "throttled": None, "created_at": "2026-11-24T17:00:00",
           "progress": p.as_dict()}
    line = status_lines({"runs": [run], "workers": {}, "queues": {}})[3]
    assert line.endswith("since start (paused time left out), ended with 1 failed chunk(s): "
                         "'farm failed --run migrate-x' says why, 'farm retry-failed --run "
                         "migrate-x' tries them again"), line


def test_a_cancelled_run_says_when_and_how_to_take_it_up_again():
    """Before, a cancelled run was 'failed' and its line the failed run's advice."""
    kinds = [KindProgress("users", 1000, 3000, 2000, 1000, 0, 1, 2, 0, 3)]
    p = RunProgress(1000, 3000, 1, 2, 0, 3, 5.0, 200.0, 0.0, None, False, True, kinds,
                    status="cancelled", cancelled_at="2026-11-24 17:05:00")
    run = {"run_id": "migrate-x", "kind": "migrate", "status": "cancelled", "paused": False,
           "queue": "farm", "throttled": None, "created_at": "2026-11-24T17:00:00",
           "progress": p.as_dict()}
    lines = status_lines({"runs": [run], "workers": {}, "queues": {}})
    assert lines[0].startswith("run migrate-x  migrate  cancelled  queue farm")
    assert lines[3].endswith("since start (paused time left out), cancelled by the operator "
                             "at 2026-11-24 17:05:00 UTC; 2 chunk(s) not done; 'farm "
                             "retry-failed --run migrate-x' takes it up again"), lines[3]
    assert "farm failed" not in lines[3]


def test_the_runs_table_keeps_its_columns_for_a_cancelled_paused_run():
    row = {"run_id": "migrate-x", "kind": "migrate", "status": "cancelled", "paused": True,
           "total_chunks": 3, "chunks_done": 1, "chunks_failed": 2, "rows_written": 7,
           "created_at": "2026-11-24 17:00:00", "finished_at": "2026-11-24 17:05:00"}
    head, line = runs_lines([row])[:2]
    assert line.split()[2:5] == ["cancelled*", "1/3", "(2"]
    assert line.index(" 7  ") + 2 == head.index("rows written") + len("rows written")
    assert line.index("2026-11-24 17:00:00") == head.index("started (UTC)")
