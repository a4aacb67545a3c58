"""Helpers for tests that run real worker processes against real Redis and MariaDB."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable

from tests.conftest import ROOT


def until(cond: Callable[[], object], timeout: float = 60, every: float = 0.2,
          what: str = "condition") -> object:
    """Poll ``cond`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def within(seconds: float, fn: Callable[[], object]) -> tuple[BaseException | None, float]:
    """Run ``fn`` in a thread: the error it raised (``None``: none) and how long it took; a
    failure, not a hang, if it is still running after ``seconds`` (the caller then frees
    it: a lock released, a proxy thawed or stopped)."""
    out: list = []

    def call() -> None:
        t0 = time.monotonic()
        try:
            fn()
            out.append((None, time.monotonic() - t0))
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out.append((exc, time.monotonic() - t0))
    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(seconds)
    if not out:
        raise AssertionError(f"still waiting after {seconds:g} s")
    return out[0]


def spawn(argv: list[str], env: dict, **kwargs: object) -> subprocess.Popen:
    """``argv`` as a real subprocess in its own process group, its output (stdout and stderr)
    kept in an unnamed temp file (``output``). Never a pipe read only at the end: a worker
    logging more than a pipe holds (64 KiB) would block on its next line until then."""
    log = tempfile.TemporaryFile(mode="w+", prefix="farm-proc-")  # noqa: SIM115 - see output
    proc = subprocess.Popen(argv, env=env, cwd=ROOT, start_new_session=True, stdout=log,
                            stderr=subprocess.STDOUT, text=True, **kwargs)
    proc.log = log
    return proc


def output(proc: subprocess.Popen) -> str:
    """What a ``spawn``ed process wrote so far (a process started otherwise: what its stdout
    pipe holds, if it has one)."""
    log = getattr(proc, "log", None)
    if log is None:
        return proc.stdout.read() if proc.stdout else ""
    log.seek(0)
    return log.read()


def start_workers(env: dict, count: int, *extra: str) -> subprocess.Popen:
    """``farm workers --count N`` as a real subprocess (its own process group)."""
    return spawn([sys.executable, "-m", "scripts", "workers", "--count", str(count), *extra],
                 env)


def children(pid: int) -> list[int]:
    """PIDs of the direct children of ``pid``."""
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True,
                         text=True)
    return [int(p) for p in out.stdout.split()]


def stop(proc: subprocess.Popen, timeout: float = 30) -> str:
    """SIGTERM a supervisor, wait, and return its output (SIGKILL the group if it hangs)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    out = output(proc)
    if getattr(proc, "log", None) is not None:
        proc.log.close()
    return out
