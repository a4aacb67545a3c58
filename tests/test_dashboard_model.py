"""What the dashboard reads: finished runs' figures kept only while unchanged, charts summing
to the rows done, and the export calendar asking the destination for ``_SUCCESS``."""

from __future__ import annotations

import pytest

from dashboard import chart, exports
from dashboard.exports import Calendar
from dashboard.model import Reader
from exporters import export as exporter
from farmcore.ledger import Outcome
from tests.dashkit import make_run

pytestmark = pytest.mark.usefixtures("park_leftover_runs")


def card_of(reader: Reader, run_id: str):
    return next(c for c in reader.board(limit=200).runs if c.row["run_id"] == run_id)


def test_a_finished_run_is_kept_until_retry_failed_reopens_it(rt):
    run_id = make_run(rt.ledger, done=1, failed=1, pending=0)
    reader = Reader(rt)
    first = card_of(reader, run_id)
    assert (first.row["status"], first.progress.chunks_failed) == ("failed", 1)
    assert "bad chunk on purpose" in first.failures[0]["last_error"]
    assert card_of(reader, run_id).progress is first.progress  # kept, not read again
    rt.ledger.reset_failed(run_id)  # what retry-failed does first: the run is open again
    again = card_of(reader, run_id)
    assert again.row["status"] == "running" and again.progress.chunks_failed == 0
    assert again.failures == [] and again.state == "running"


def test_an_active_run_is_read_again(rt):
    run_id = make_run(rt.ledger, done=0, failed=0, pending=2)
    reader = Reader(rt)
    assert card_of(reader, run_id).progress.chunks_done == 0
    lease = rt.ledger.claim(run_id, 0, "testhost:2:abc")
    rt.ledger.finish(lease, Outcome(rows_read=100))
    reader._fresh.clear()  # past FRESH_SECONDS
    assert card_of(reader, run_id).progress.chunks_done == 1


def test_the_chart_adds_up_to_the_rows_done(rt):
    run_id = make_run(rt.ledger, done=3, failed=0, pending=1, rows=120)
    for i in range(3):  # finishes 10 s apart, each chunk 10 s long
        rt.ledger.pool.execute(
            "UPDATE chunks SET started_at = NOW(3) - INTERVAL %s SECOND, finished_at = NOW(3) - "
            "INTERVAL %s SECOND, seconds = 10 WHERE run_id = %s AND chunk_id = %s",
            (40 - 10 * i, 30 - 10 * i, run_id, i))
    points = chart.series(rt.ledger, run_id)
    width = points[0][0]
    assert 2 <= len(points) <= chart.BUCKETS
    assert sum(rate * width for _, rate in points) == pytest.approx(360, rel=0.01)
    svg = str(chart.svg(points))
    assert svg.startswith("<svg") and "rows/s" in svg and "<polyline" in svg


def test_the_calendar_asks_the_destination_for_success(rt, tmp_path, monkeypatch):
    monkeypatch.setattr(exports, "MISSING_TTL", 0.0)
    dest = f"file://{tmp_path}"
    for date in ("2026-11-18", "2026-11-19"):
        rt.ledger.create_run("export", "farm", {"kinds": ["pins", "boards"], "date": date,
                                                "dest": dest}, [])
    folder = tmp_path / "pins" / "dt=2026-11-19"
    folder.mkdir(parents=True)
    (folder / "_SUCCESS").write_bytes(b"")
    dates, tables, cells = Calendar(rt.ledger).grid()
    assert dates.index("2026-11-19") < dates.index("2026-11-18")  # newest first
    assert {"pins", "boards"} <= set(tables)
    assert cells[("pins", "2026-11-19")].success is True
    assert cells[("boards", "2026-11-19")].success is False
    assert cells[("pins", "2026-11-18")].success is False
    calendar = Calendar(rt.ledger)
    calendar.cells()
    (tmp_path / "boards" / "dt=2026-11-19").mkdir(parents=True)
    (tmp_path / "boards" / "dt=2026-11-19" / "_SUCCESS").write_bytes(b"")
    assert {(c.table, c.date): c.success for c in calendar.cells()}[
        ("boards", "2026-11-19")] is True  # a missing marker is asked again


FORGED_EXPORT_PARAMS = ['[]', '"users"', '{"kinds": [["a"]], "dest": "file:///tmp", "date": "d"}',
                        '{"kinds": ["users"], "dest": 5, "date": "2026-11-19"}',
                        '{"kinds": ["users"], "dest": "file:///etc/passwd", "date": "d"}',
                        '{"kinds": ["users"], "dest": "file:///tmp", "date": 7}',
                        '{"kinds": [5], "dest": "file:///tmp", "date": "e"}']


def test_forged_export_runs_do_not_break_the_calendar(rt, tmp_path):
    """Export runs of any shape written into the ledger (params a list, numbers where names
    belong, a destination through a file) are left out; the real ones still show."""
    rt.ledger.create_run("export", "farm", {"kinds": ["pins"], "date": "2026-11-19",
                                            "dest": f"file://{tmp_path}"}, [])
    for i, params in enumerate(FORGED_EXPORT_PARAMS):
        rt.ledger.pool.execute("INSERT INTO runs (run_id, kind, status, queue, params) VALUES "
                               "(%s, 'export', 'running', 'q', %s)", (f"export-forged-{i}",
                                                                     params))
    try:
        dates, tables, cells = Calendar(rt.ledger).grid()
        assert cells[("pins", "2026-11-19")].success is False
        assert cells[("users", "d")].success is None  # /etc/passwd/users/…: unknown, no crash
        assert all(isinstance(d, str) for d in dates + tables)
        params = {"kinds": ["users"], "date": "2026-11-19", "dest": "file:///tmp"}
        exporter.refuse_overlap(rt.ledger, params)  # the forged runs name no folder of it
    finally:
        rt.ledger.pool.execute("DELETE FROM runs WHERE run_id LIKE %s", ("export-forged-%",))
