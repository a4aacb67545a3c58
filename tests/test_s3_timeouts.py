"""S3 that does not answer: an endpoint that accepts connections and never replies (a
test-side socket server, ``AWS_ENDPOINT_URL`` pointed at it). Every call ends within the
client's bounds as a retryable ``DestinationError`` naming the endpoint and the time (not an
``AttributeError`` from botocore's ``response=None``); the dashboard's export calendar
waits for it once per page, within FARM_STATUS_TIMEOUT."""

from __future__ import annotations

import os
import time

import pytest
from botocore.exceptions import ConnectTimeoutError, ReadTimeoutError

from dashboard.actions import Guard
from dashboard.app import create_app
from dashboard.exports import Calendar
from exporters import s3 as s3mod
from exporters.destinations import DestinationError, S3Destination
from shardfarm import bounds
from shardfarm.errors import RetryableError
from tests.conftest import run_farm
from tests.farmkit import within
from tests.proxy import TcpProxy

pytestmark = pytest.mark.usefixtures("park_leftover_runs")
SECONDS = 2


@pytest.fixture
def silent_s3(monkeypatch):
    """``AWS_ENDPOINT_URL`` at a port that accepts and never answers; the status bound 2 s."""
    proxy = TcpProxy.silent()
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1",
                       "AWS_ENDPOINT_URL": f"http://127.0.0.1:{proxy.port}",
                       "FARM_STATUS_TIMEOUT": str(SECONDS)}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_MAX_ATTEMPTS", raising=False)
    yield proxy
    proxy.stop()  # frees any call still waiting on it


def test_a_quick_look_times_out_as_a_retryable_error_naming_the_endpoint(silent_s3):
    dest = S3Destination("bucket", "nightly", quick=True)
    exc, took = within(SECONDS + 8, lambda: dest.exists("pins/dt=2024-01-01/_SUCCESS"))
    assert isinstance(exc, DestinationError) and isinstance(exc, RetryableError), repr(exc)
    assert SECONDS <= took < SECONDS + 2, took
    assert str(exc) == (f"S3 head_object bucket/nightly/pins/dt=2024-01-01/_SUCCESS: no answer "
                        f"from http://127.0.0.1:{silent_s3.port} within 2 s (check "
                        "AWS_ENDPOINT_URL and the network)")
    assert silent_s3.accepted == 1  # not retried


def test_a_workers_call_is_tried_a_bounded_number_of_times(silent_s3, monkeypatch):
    """A worker's client: FARM_CONNECT_TIMEOUT to connect, ``S3_READ_SECONDS`` for a reply
    (1 s here), ``S3_ATTEMPTS`` tries, then a retryable error (its chunk is tried later)."""
    monkeypatch.setattr(bounds, "S3_READ_SECONDS", 1.0)
    monkeypatch.setenv("FARM_CONNECT_TIMEOUT", "4")
    dest = S3Destination("bucket")
    exc, took = within(30, lambda: dest.read("some/key"))
    assert isinstance(exc, DestinationError), repr(exc)
    assert "S3 get_object bucket/some/key: no answer from http://127.0.0.1:" in str(exc)
    assert "within 1 s" in str(exc)
    config = dest.client.meta.config
    assert (config.connect_timeout, config.read_timeout) == (4, 1.0)
    assert silent_s3.accepted == bounds.S3_ATTEMPTS == 3 and took < 15


def test_every_translation_survives_an_error_without_a_response(silent_s3):
    """botocore's timeouts carry ``response=None``: each path that looks for an error code
    (a missing object, a bucket check, a part upload) translates instead of raising
    ``AttributeError``."""
    dest = S3Destination("bucket", quick=True)
    for call in (lambda: dest.size("k"), lambda: dest.read("k"), dest.check,
                 lambda: dest.open_part("k").commit()):
        exc, _ = within(SECONDS + 8, call)
        assert isinstance(exc, DestinationError), repr(exc)
        assert "no answer from http://127.0.0.1:" in str(exc)
    assert s3mod._code(RuntimeError("no response at all")) == ""
    for exc in (ReadTimeoutError(endpoint_url="http://s3.example:9000/b/k"),
                ConnectTimeoutError(endpoint_url="http://s3.example:9000/b/k")):
        assert getattr(exc, "response", None) is None
        err = s3mod._s3_error(exc, "head_object b/k")  # before: AttributeError
        assert isinstance(err, DestinationError), repr(err)
        assert str(err).startswith("S3 head_object b/k: no ")
        assert "from http://s3.example:9000" in str(err)


def _export_runs(ledger, dest: str, n: int = 3) -> None:
    """``n`` export runs of three tables each (nine calendar cells), no chunks."""
    for i in range(n):
        ledger.create_run("export", "farm", {"kinds": ["pins", "boards", "users"],
                                             "date": f"2024-01-0{i + 1}", "dest": dest}, [])


def test_the_calendar_waits_for_silent_destinations_once_per_reading(silent_s3, ledger):
    """Four destinations of nine cells each on the silent endpoint: before, every cell waited
    (a page took minutes); now one wait per reading (the cells left are unknown until a
    later reading), and a destination that did not answer is not asked again at once."""
    dests = [f"s3://silent-bucket-{i}/nightly" for i in range(4)]
    for dest in dests:
        _export_runs(ledger, dest)
    calendar = Calendar(ledger)
    for reading in range(1, 4):
        exc, took = within(60, calendar.cells)
        assert exc is None and took < SECONDS + 2, (reading, exc, took)
        assert silent_s3.accepted == reading  # one destination asked per reading, none twice
    cells = [c for c in calendar.cells() if c.dest in dests]
    assert len(cells) == 36 and all(c.success is None for c in cells)


def test_the_dashboard_page_answers_while_s3_is_silent(silent_s3, rt):
    _export_runs(rt.ledger, "s3://silent-bucket/page")
    client = create_app(rt, Guard(allow=False, token=None)).test_client()
    exc, took = within(60, lambda: client.get("/"))
    assert exc is None and took < SECONDS + 3, (exc, took)
    resp = client.get("/")
    assert resp.status_code == 200 and "destination did not answer" in resp.get_data(
        as_text=True)
    metrics = client.get("/metrics")
    assert metrics.status_code == 200 and b"shardfarm_run_chunks" in metrics.data


def test_farm_export_fails_within_the_status_bound_when_s3_is_silent(silent_s3, env):
    """The planner checks the bucket once, within FARM_STATUS_TIMEOUT (before, with a worker's
    client, ``farm export`` sat for minutes saying nothing), and exits 1 with one line."""
    run_env = {**env, **{k: os.environ[k] for k in ("FARM_STATUS_TIMEOUT", "AWS_ENDPOINT_URL",
                                                    "AWS_ACCESS_KEY_ID", "AWS_DEFAULT_REGION",
                                                    "AWS_SECRET_ACCESS_KEY")},
               "FARM_LOG_LEVEL": "WARNING"}  # an operator's default
    start = time.monotonic()
    out = run_farm(run_env, "export", "--date", "2026-11-20", "--dest",
                   "s3://silent-bucket/nightly", timeout=100)
    took = time.monotonic() - start
    assert out.returncode == 1 and took < SECONDS + 15, (out, took)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "S3 bucket silent-bucket: no answer from http://127.0.0.1:" in \
        lines[0] and f"within {SECONDS} s" in lines[0], out.stderr
    assert silent_s3.accepted == 1  # not retried
