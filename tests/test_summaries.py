"""A run's summary for a person at a terminal (scripts.summaries)."""

from farmcore.progress import RunProgress
from scripts.summaries import BOARDS_SHOWN, summary_lines, verify_line


def _p(**over) -> RunProgress:
    base = {"rows_done": 5000, "rows_expected": 5000, "chunks_done": 8, "chunks_failed": 0,
            "chunks_running": 0, "chunks_total": 8, "active_s": 83.0, "rate_since_start": 60.2,
            "rate_last_minute": 0.0, "eta_s": 0.0, "paused": False, "finished": True}
    return RunProgress(**{**base, **over})


def test_migrate_summary_names_what_to_look_at():
    doc = {"run_id": "m-1", "status": "failed", "loaded": {"users": 4950, "pins": 30},
           "quarantined": {"users": 50, "pins": 0}, "failed_chunks": 2}
    lines = summary_lines(doc, "migrate", _p(chunks_done=6, chunks_failed=2))
    assert lines[0] == ("migrate run m-1 failed in 0:01:23 · 5,000 rows at 60 rows/s · "
                        "6/8 chunks")
    assert "users 4,950 · pins 30" in lines[1]
    assert "users 50 ('farm quarantine --run m-1')" in lines[2] and "pins" not in lines[2]
    assert "2 chunk(s): 'farm failed --run m-1'" in lines[3]


def test_a_cancelled_run_says_when_and_how_to_take_it_up_again():
    """Before, it said 'failed … chunk(s)' and named 'farm failed' as for a failed run."""
    doc = {"run_id": "m-1", "status": "cancelled", "loaded": {"users": 4950, "pins": 30},
           "quarantined": {"users": 0, "pins": 0}, "failed_chunks": 2}
    lines = summary_lines(doc, "migrate", _p(chunks_done=6, chunks_failed=2,
                                             status="cancelled",
                                             cancelled_at="2026-11-24 17:05:00"))
    assert lines[0].startswith("migrate run m-1 cancelled in 0:01:23 · ")
    assert lines[-1] == ("  cancelled by the operator at 2026-11-24 17:05:00 UTC; 2 chunk(s) "
                         "not done; 'farm retry-failed --run m-1' takes it up again")
    assert not any("farm failed" in line for line in lines)


def test_reexport_says_unchanged_skipped():
    doc = {"run_id": "e-1", "status": "done", "loaded": {"users": 0, "pins": 120},
           "quarantined": {"users": 0, "pins": 0}, "failed_chunks": 0,
           "skipped": {"users": 8, "pins": 3}}
    lines = summary_lines(doc, "export", _p())
    assert lines[1].split() == ["users", "8", "part(s)", "unchanged,", "skipped"]
    assert "pins" in lines[2] and "120 rows written, 3 part(s) unchanged, skipped" in lines[2]


def test_rebalance_lists_boards_bounded():
    boards = [{"board": 1000 + i, "shards": 3} for i in range(BOARDS_SHOWN + 3)]
    doc = {"run_id": "r-1", "status": "done", "loaded": {"board_followedby_users": 9},
           "quarantined": {}, "failed_chunks": 0, "boards": boards}
    lines = summary_lines(doc, "rebalance", _p())
    assert lines[1] == f"  moved {BOARDS_SHOWN + 3} board(s):"
    assert lines[2] == "    board 1000 now on 3 shards"
    assert len([line for line in lines if "now on" in line]) == BOARDS_SHOWN
    assert lines[-1] == "    … and 3 more: 'farm summary r-1 --json' lists them all"


def test_a_run_started_without_wait_says_how_to_follow_it():
    doc = {"run_id": "f-1", "status": "running", "loaded": {}, "quarantined": {},
           "failed_chunks": 0}
    lines = summary_lines(doc, "feeds", _p(finished=False, rows_expected=900, chunks_done=0))
    assert lines == ["feeds run f-1 started: 8 chunks, 900 rows",
                     "  follow it: 'farm status --run f-1', or 'farm resume f-1 --wait'"]


def test_verify_line():
    s = {"run_id": "v-1", "of_run": "m-1", "status": "done", "checked": {"users": 3, "pins": 4},
         "mismatches": 2, "failed_chunks": 0}
    assert verify_line(s) == "verify run v-1 of m-1 done: 7 rows checked, 2 mismatch(es)"
    assert verify_line({**s, "failed_chunks": 1}).endswith("1 chunk(s) failed: "
                                                           "'farm failed --run v-1'")
    assert verify_line({**s, "status": "cancelled", "failed_chunks": 1}) == (
        "verify run v-1 of m-1 cancelled: 7 rows checked, 2 mismatch(es), 1 chunk(s) not "
        "done: 'farm retry-failed --run v-1' takes it up again")
