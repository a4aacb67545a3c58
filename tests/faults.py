"""Fault injection for tests: run a scenario of ``tests.faultchild`` in a real process and
kill it (SIGKILL) or freeze it (SIGSTOP) just before an exact MySQL statement or commit.

- ``steps(scenario, args)``: run it once untouched and return the steps it sent, so a
  test can kill it between every pair of consecutive statements (``for n in 1..len``);
- ``run_killed(scenario, args, n)``: run it and SIGKILL it just before step ``n``;
- ``frozen(scenario, args, n)``: a context manager; inside it the child is stopped just
  before step ``n`` (steps 1..n-1 done, their locks held); on exit it is continued and
  must finish cleanly.

Waiting here is always for a condition (the child stopped, exited, a lock wait seen),
bounded by a timeout that only turns a hang into a failure.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 60.0


def _start(scenario: str, args: dict, step: int, action: str, trace: Path | None
           ) -> subprocess.Popen:
    env = {**os.environ, "FARM_FAULT_STEP": str(step), "FARM_FAULT_ACTION": action}
    if trace is not None:
        env["FARM_FAULT_TRACE"] = str(trace)
    return subprocess.Popen([sys.executable, "-m", "tests.faultchild", scenario,
                             json.dumps(args)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen) -> tuple[int, str]:
    _, err = proc.communicate(timeout=TIMEOUT)
    return proc.returncode, err


def steps(scenario: str, args: dict) -> list[str]:
    """Run the scenario without a fault; the steps it sent, in order (it must succeed)."""
    with tempfile.TemporaryDirectory(prefix="farm-fault-") as tmp:
        trace = Path(tmp) / "trace"
        rc, err = _finish(_start(scenario, args, 0, "kill", trace))
        assert rc == 0, err
        return trace.read_text().splitlines() if trace.exists() else []


def run_killed(scenario: str, args: dict, step: int) -> int:
    """Run the scenario and SIGKILL it just before ``step``; returns its exit status
    (``-9`` when the step was reached, ``0`` if it finished first)."""
    rc, err = _finish(_start(scenario, args, step, "kill", None))
    assert rc in (0, -9), err
    return rc


def wait_until(cond: Callable[[], bool], what: str, timeout: float = TIMEOUT) -> None:
    """Poll ``cond`` until it holds; fail after ``timeout`` seconds naming ``what``."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _stopped(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
    except (OSError, IndexError):
        return False


@contextmanager
def frozen(scenario: str, args: dict, step: int, rc: int = 0) -> Iterator[subprocess.Popen]:
    """The scenario's process stopped just before ``step``; continued (and checked to
    finish with exit status ``rc``) when the block ends, its stderr then in ``.err``."""
    proc = _start(scenario, args, step, "freeze", None)
    try:
        wait_until(lambda: _stopped(proc.pid) or proc.poll() is not None,
                   f"{scenario} to reach step {step}")
        assert proc.poll() is None, f"{scenario} ended before step {step}: {proc.stderr.read()}"
        yield proc
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
    status, proc.err = _finish(proc)
    assert status == rc, proc.err


def kill(pool, conn_id: int) -> None:  # a shardfarm Pool
    """``KILL`` connection ``conn_id`` and wait until the server has ended its thread:
    ``KILL`` returns before the thread releases its named locks (a CI run's next
    ``GET_LOCK`` found the killed connection still holding one)."""
    pool.execute("KILL %s", (conn_id,))
    wait_until(lambda: not pool.query(
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = %s", (conn_id,))[0][0],
        f"connection {conn_id} to end after its KILL")


def blocked(router, shard: int, table: str, ms: float = 200) -> int:  # a sharding Router
    """Statements on ``table`` of ``shard``'s database running for over ``ms`` on its server
    (a lookup by key there takes well under a millisecond: such a statement waits for a
    lock). ``INNODB_TRX`` misses some waits that the process list shows."""
    rows = router.query(router.host_for(shard),
                        "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE %s "
                        "AND COMMAND = 'Query' AND TIME_MS > %s",
                        (f"%db{shard:05d}`.`{table}%", ms), shard)
    return rows[0][0]
