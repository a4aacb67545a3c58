"""Progress bars of a run by rows, chunks beside, and one whole-run line (scripts.bars)."""

import io

from farmcore.progress import KindProgress, RunProgress
from scripts.bars import ProgressBars, bar, progress_lines


def _progress(**over) -> RunProgress:
    kinds = [KindProgress("users", 3000, 3000, 0, 2990, 10, 1, 0, 0, 1),
             KindProgress("pins", 12345, 50000, 37655, 12345, 0, 3, 0, 2, 7)]
    base = {"rows_done": 15345, "rows_expected": 53000, "chunks_done": 4, "chunks_failed": 0,
            "chunks_running": 2, "chunks_total": 8, "active_s": 10.0, "rate_since_start": 1534.5,
            "rate_last_minute": 2300.0, "eta_s": 21.0, "paused": False, "finished": False,
            "kinds": kinds}
    return RunProgress(**{**base, **over})


def test_lines_count_rows_with_chunks_beside_and_one_run_eta():
    lines = progress_lines("migrate-x", _progress())
    assert lines[0] == "migrate-x"
    assert "pins  [####................] 12,345/50,000 rows · 3/7 chunks" in lines[2]
    assert lines[3].endswith("15,345/53,000 rows · 4/8 chunks · 2,300 rows/s "
                             "(1,534 since start) · ETA 0:00:21")
    assert sum("ETA" in line for line in lines) == 1
    assert not any("rows=" in line or "s/chunks" in line for line in lines)


def test_unknown_rows_fall_back_to_chunks_and_paused_says_so():
    kinds = [KindProgress("parts", 0, None, None, 0, 0, 2, 1, 0, 8)]
    lines = progress_lines("export-x", _progress(kinds=kinds, rows_expected=None, rows_done=0,
                                                 paused=True, eta_s=None))
    assert "[#######.............] 0 rows · 2/8 chunks · 1 failed" in lines[1]
    assert lines[2].endswith("ETA - · PAUSED")


def test_a_run_that_ended_with_failed_chunks_does_not_say_done():
    """Before, the last drawing of a run whose chunks all failed ended in '· done'."""
    ended = progress_lines("migrate-x", _progress(finished=True, chunks_failed=2, eta_s=None))
    assert ended[-1].endswith("(1,534 since start) · ended, 2 failed"), ended[-1]
    assert progress_lines("migrate-x", _progress(finished=True))[-1].endswith("· done")


def test_a_cancelled_run_says_so_and_what_is_not_done():
    """Before, a cancelled run's last drawing ended like a failed run's ('ended, 4 failed')."""
    ended = progress_lines("migrate-x", _progress(finished=True, chunks_failed=4, eta_s=None,
                                                  status="cancelled"))
    assert ended[-1].endswith("(1,534 since start) · cancelled, 4 not done"), ended[-1]


def test_bar_fraction_is_clamped():
    assert bar(0) == "[" + "." * 20 + "]" and bar(1.5) == "[" + "#" * 20 + "]"


class FakeTty(io.StringIO):
    def isatty(self):
        return True


def test_redraws_in_place_on_a_terminal_and_stays_silent_off_one():
    out = FakeTty()
    bars = ProgressBars("run-x", out)
    bars(_progress())
    first = out.getvalue()
    assert first.count("\n") == 4 and "\x1b[4F" not in first
    bars(_progress(rows_done=53000))
    assert out.getvalue()[len(first):].startswith("\x1b[4F")  # back up over the 4 lines
    silent = io.StringIO()
    ProgressBars("run-x", silent)(_progress())
    assert silent.getvalue() == ""
