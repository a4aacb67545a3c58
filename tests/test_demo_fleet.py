"""The demo's own workers (``demo.fleet``): a supervisor that exits before the demo is
done is reported in one line with its own reason, where the demo waited for ever."""

from __future__ import annotations

import time

from demo.fleet import own_workers
from shardfarm.errors import FarmError
from tests.conftest import run_farm


def _raised_within(check, seconds: float) -> FarmError | None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            check()
        except FarmError as exc:
            return exc
        time.sleep(0.2)
    return None


def test_workers_that_exit_stop_the_demo_with_their_reason(settings, monkeypatch):
    monkeypatch.setenv("FARM_CHUNK_ATTEMPTS", "0")  # the supervisor refuses to start
    with own_workers(settings, 1) as alive:
        exc = _raised_within(alive, 30)
    assert exc is not None, "the exit of the demo's workers went unnoticed"
    line = str(exc)
    assert line.startswith("the demo's workers ('farm workers --count 1') exited with code 1")
    assert "bad FARM_CHUNK_ATTEMPTS: '0'" in line and "\n" not in line


def test_running_workers_pass_the_check(settings):
    with own_workers(settings, 1) as alive:
        time.sleep(2)
        alive()  # nothing raised while the supervisor runs


def test_the_demo_refuses_more_workers_than_a_supervisor_runs(farm_env):
    out = run_farm(farm_env, "demo", "--workers", "1001")
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "--workers" in out.stderr and "1<=x<=1000" in out.stderr


