"""The desired worker count in Redis (``farm scale``), whatever is written there: a value
that is not a worker count is ignored with one warning, and no source of the count goes past
``MAX_WORKERS`` (the bound ``farm workers``, ``farm scale`` and the dashboard share)."""

from __future__ import annotations

import logging
import time

import pytest
from rq import Worker

from dashboard import actions
from dashboard.app import create_app
from farmcore import keys
from tests.conftest import run_farm
from tests.farmkit import children, output, start_workers, stop, until
from workers.supervisor import MAX_WORKERS, Supervisor, read_desired


@pytest.fixture
def env(plain_env):
    """The farm's environment as operators set it (``plain_env``)."""
    return plain_env


@pytest.fixture
def conn(plain_conn):
    """Its Redis (``plain_conn``)."""
    return plain_conn


@pytest.mark.parametrize("value", ["abc", "2.5", "-1", str(MAX_WORKERS + 1), "9" * 5000, "\xff"])
def test_a_scale_value_that_is_not_a_worker_count_keeps_the_count_with_one_warning(
        settings, conn, caplog, value):
    conn.set(keys.desired_workers(None), 3)
    sup = Supervisor(settings, 2, ["farm"])
    try:
        assert sup.desired == 3
        conn.set(keys.desired_workers(None), value)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="workers.supervisor"):
            for _ in range(5):  # five supervisor ticks
                sup.poll_remote()
        assert sup.desired == 3  # the count it had
        said = [r.getMessage() for r in caplog.records]
        assert len(said) == 1 and "ignoring farm:scale:*" in said[0] and "\n" not in said[0]
        conn.set(keys.desired_workers(None), 4)
        sup.poll_remote()
        assert sup.desired == 4
    finally:
        sup.rt.close()


def test_a_host_target_that_is_not_a_count_is_not_overridden_by_the_farm_wide_one(conn):
    conn.set(keys.desired_workers("h1"), "lots")
    conn.set(keys.desired_workers(None), 7)
    assert read_desired(conn, "h1") is None and read_desired(conn, "h2") == 7
    conn.set(keys.desired_workers("h1"), MAX_WORKERS)
    assert read_desired(conn, "h1") == MAX_WORKERS


def test_signals_never_take_the_count_past_the_bound(settings, conn):
    sup = Supervisor(settings, MAX_WORKERS, ["farm"])
    try:
        sup._adjust(+1)
        assert sup.desired == MAX_WORKERS
    finally:
        sup.rt.close()


def test_farm_scale_refuses_a_count_past_the_bound_in_one_line(env):
    out = run_farm(env, "scale", str(MAX_WORKERS + 1))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert run_farm(env, "scale", str(MAX_WORKERS)).returncode == 0


def test_a_target_no_running_supervisor_takes_is_said_in_one_note(settings, env, conn):
    """A mistyped --host (or no supervisor yet) stored a target nothing served, with exit 0
    and no word; the target is still stored (a supervisor started there later takes it)."""
    out = run_farm(env, "scale", "3")
    assert out.returncode == 0
    assert out.stderr.splitlines() == [
        "farm: note: no supervisor is running (running: none); the target waits for one to "
        "start there ('farm scale --clear' removes it)"]
    sup = Supervisor(settings, 1, ["farm"], host="worker-7")
    try:
        sup.report()  # its heartbeat, as its loop writes it
        out = run_farm(env, "scale", "2", "--host", "worker-7")
        assert out.returncode == 0 and out.stderr == ""
        assert run_farm(env, "scale", "4").stderr == ""
        out = run_farm(env, "scale", "2", "--host", "worker 8")
        assert out.returncode == 0 and read_desired(conn, "worker 8") == 2
        assert out.stderr.splitlines() == [
            "farm: note: no supervisor is running on 'worker 8' (running: worker-7); the "
            "target waits for one to start there ('farm scale --clear --host 'worker 8'' "
            "removes it)"]
        assert run_farm(env, "scale", "--clear", "--host", "worker 8").stderr == ""
    finally:
        sup.rt.close()


@pytest.mark.slow
def test_workers_started_on_a_garbage_scale_value_run_their_count_and_say_so_once(env, conn):
    conn.set(keys.desired_workers(None), "abc")
    proc = start_workers(env, 1)
    try:
        until(lambda: Worker.count(connection=conn) == 1, timeout=30, what="the --count worker")
        conn.set(keys.desired_workers(None), "1000000")
        until(lambda: "1000000" in output(proc), timeout=30, what="the second warning")
        time.sleep(1.5)  # three more ticks: nothing is spawned
        assert proc.poll() is None and len(children(proc.pid)) == 1
    finally:
        out = stop(proc)
    said = [line for line in out.splitlines() if "ignoring farm:scale:*" in line]
    assert len(said) == 2 and "Traceback" not in out, out


def test_the_dashboard_scale_form_offers_the_shared_bound(rt, monkeypatch):
    monkeypatch.setattr(actions, "MAX_WORKERS", 7)  # the bound is read from one place
    app = create_app(rt, actions.Guard(allow=True, token="t" * 32))
    page = app.test_client().get("/").get_data(as_text=True)
    assert 'name="count" min="0" max="7"' in page
