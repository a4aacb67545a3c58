"""Progress by rows and chunks, rates without paused time, whole-run ETA (farmcore.progress).

The arithmetic is checked on hand-made ledger figures with known timestamps; the reader is
checked against a real control database whose chunk and pause times are set by SQL.
"""

from datetime import datetime, timedelta

import pytest

from farmcore import progress as p
from farmcore.ledger import ChunkSpec, Outcome

T0 = datetime(2026, 11, 24, 12, 0, 0)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_active_seconds_leaves_out_pauses_closed_and_open():
    pauses = [p.Pause(at(10), at(40)), p.Pause(at(100))]
    assert p.active_seconds(at(0), at(50), pauses) == 20
    assert p.active_seconds(at(0), at(130), pauses) == 70          # open pause since 100
    assert p.active_seconds(at(20), at(30), pauses) == 0
    assert p.active_seconds(at(0), at(5), []) == 5


def test_window_reaches_back_over_pauses():
    assert p.window_start(at(100), []) == at(40)
    # paused 70..90: the last 60 s of work are 90..100 and 20..70
    assert p.window_start(at(100), [p.Pause(at(70), at(90))]) == at(20)
    # still paused since 80: the window is frozen at 20..80 however long the pause lasts
    open_pause = [p.Pause(at(80))]
    assert p.window_start(at(100), open_pause) == at(20)
    assert p.window_start(at(5000), open_pause) == at(20)
    # two pauses inside the window
    two = [p.Pause(at(50), at(60)), p.Pause(at(80), at(90))]
    assert p.window_start(at(100), two) == at(20)


def test_rows_expected_from_plans_then_averages():
    planned = p.KindCounts("pins", total=4, done=1, rows_done=900, planned_open=3000,
                           planned_left=3000)
    k = p.kind_progress(planned)
    assert (k.rows_expected, k.rows_left, k.estimated) == (3900, 3000, False)
    unknown = p.KindCounts("users", total=3, done=0, unplanned_open=3, unplanned_left=3)
    assert p.kind_progress(unknown).rows_expected is None
    guessed = p.KindCounts("users", total=3, done=2, rows_done=100, unplanned_open=1,
                           unplanned_left=1)
    g = p.kind_progress(guessed)
    assert (g.rows_expected, g.rows_left, g.estimated) == (150, 50, True)


def test_failed_chunks_count_in_expected_but_not_in_rows_left():
    k = p.kind_progress(p.KindCounts("pins", total=3, done=1, failed=1, rows_done=10,
                                     planned_open=30, planned_left=20))
    assert (k.rows_expected, k.rows_left) == (40, 20)


def _kinds(done_rows: int, start: datetime, finish: datetime | None) -> list[p.KindCounts]:
    return [p.KindCounts("users", total=2, done=1, rows_done=done_rows, planned_open=1000,
                         planned_left=1000, first_start=start, last_finish=finish),
            p.KindCounts("pins", total=4, done=0, running=1, planned_open=4000,
                         planned_left=4000, first_start=start)]


def test_run_totals_rates_and_eta_for_the_whole_run():
    r = p.run_progress(_kinds(1000, at(0), at(50)), [], recent_rows=1000, now=at(100),
                       paused=False, finished=False)
    assert (r.rows_done, r.rows_expected, r.chunks_done, r.chunks_total) == (1000, 6000, 1, 6)
    assert r.rate_since_start == 10.0          # 1000 rows in 100 s
    assert r.rate_last_minute == pytest.approx(1000 / 60, abs=0.1)
    assert r.eta_s == pytest.approx(5000 / (1000 / 60), abs=0.5)   # rows left at recent rate


def test_a_paused_run_keeps_its_rates_and_eta():
    kinds = _kinds(1000, at(0), at(50))
    pause = [p.Pause(at(100))]
    before = p.run_progress(kinds, pause, recent_rows=1000, now=at(100), paused=True,
                            finished=False)
    later = p.run_progress(kinds, pause, recent_rows=1000, now=at(3700), paused=True,
                           finished=False)
    assert later.active_s == before.active_s == 100
    assert later.rate_since_start == before.rate_since_start == 10.0
    assert later.rate_last_minute == before.rate_last_minute
    assert later.eta_s == before.eta_s
    # without the pause the same hour would have dragged the rate down
    naive = p.run_progress(kinds, [], recent_rows=0, now=at(3700), paused=False,
                           finished=False)
    assert naive.rate_since_start < 1


def test_eta_by_chunks_when_rows_are_unknown_and_none_before_anything_is_done():
    kinds = [p.KindCounts("parts", total=4, done=1, rows_done=0, unplanned_open=3,
                          unplanned_left=3, first_start=at(0), last_finish=at(10))]
    r = p.run_progress(kinds, [], recent_rows=0, now=at(20), paused=False, finished=False)
    assert r.eta_s == 60.0                       # 3 chunks at 20 s each
    fresh = [p.KindCounts("parts", total=4, unplanned_open=4, unplanned_left=4)]
    r = p.run_progress(fresh, [], recent_rows=0, now=at(20), paused=False, finished=False)
    assert (r.eta_s, r.rows_expected, r.rate_since_start) == (None, None, 0.0)


def test_a_finished_run_is_timed_to_its_last_chunk():
    kinds = [p.KindCounts("users", total=1, done=1, rows_done=500, first_start=at(0),
                          last_finish=at(50))]
    r = p.run_progress(kinds, [], recent_rows=500, now=at(9999), paused=False, finished=True)
    assert (r.rate_since_start, r.eta_s, r.active_s) == (10.0, 0.0, 50)


# -- against the control database ---------------------------------------------------------------
def _set_times(ledger, run, chunk, start_ago, finish_ago):
    ledger.pool.execute("UPDATE chunks SET started_at = NOW(3) - INTERVAL %s SECOND, "
                        "finished_at = NOW(3) - INTERVAL %s SECOND WHERE run_id = %s "
                        "AND chunk_id = %s", (start_ago, finish_ago, run, chunk))


def test_read_progress_from_the_ledger(ledger):
    run = ledger.create_run("ptest", "q-progress", {}, [
        ChunkSpec("users", {"i": 0}, rows=100), ChunkSpec("users", {"i": 1}, rows=100),
        ChunkSpec("pins", {"i": 2}, rows=300), ChunkSpec("pins", {"i": 3})])
    for chunk, rows in ((0, 90), (2, 310)):
        ledger.finish(ledger.claim(run, chunk, "w"), Outcome(rows_read=rows, rows_written=rows))
    _set_times(ledger, run, 0, 200, 150)     # outside the last minute
    _set_times(ledger, run, 2, 100, 30)      # inside it
    got = p.read_progress(ledger, run)
    assert (got.rows_done, got.chunks_done, got.chunks_total) == (400, 2, 4)
    # users: 90 done + 100 planned; pins: 310 done + one unplanned chunk at pins' average
    assert got.rows_expected == 90 + 100 + 310 + 310
    assert [k.kind for k in got.kinds] == ["users", "pins"]
    assert got.rate_last_minute == pytest.approx(310 / 60, abs=0.2)
    assert got.rate_since_start == pytest.approx(400 / 200, abs=0.1)


def test_pause_and_unpause_are_recorded_once_each(ledger):
    run = ledger.create_run("ptest", "q-progress", {}, [ChunkSpec("k", {}, rows=1)])
    ledger.set_paused(run, True)
    ledger.set_paused(run, True)             # already paused: no second pause
    (open_pause,) = p.read_pauses(ledger, run)
    assert open_pause.end is None
    ledger.set_paused(run, False)
    ledger.set_paused(run, False)
    (closed,) = p.read_pauses(ledger, run)
    assert closed.end is not None and closed.end >= closed.start
    assert p.read_progress(ledger, run).paused is False
