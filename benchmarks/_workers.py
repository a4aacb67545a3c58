"""Workers for a benchmark's runs: ``farm workers`` started (and registered) before a timing
and stopped after it, a run timed from its planning to its end with the CPU seconds of the
servers and workers, and the run's summary.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from redis import Redis
from rq import Worker

from benchmarks._server import say, table_opens
from benchmarks._usage import Usage, cpu_seconds, workers_cpu, workers_peak
from farmcore.preflight import ensure_control
from jobs.runtime import Runtime
from shardfarm.mysql.dsn import DSN
from shardfarm.settings import Settings

if TYPE_CHECKING:
    from benchmarks._bench import Bench

ROOT = Path(__file__).resolve().parent.parent
WORKERS_TIMEOUT = 3600.0


def control_env(bench: Bench, control: str) -> dict[str, str]:
    """The bench environment on control database ``control``, made if missing (what
    ``farm shards init`` does for ``farm_control``: a run never makes one)."""
    ensure_control(DSN.parse(bench.dsn(control)), create=True)
    return {**bench.env, "FARM_CONTROL_DSN": bench.dsn(control)}


def run_workers(bench: Bench, count: int, control: str) -> float:
    """Seconds ``farm workers --count N --burst`` takes from start until it exits."""
    env = control_env(bench, control)
    log = bench.workdir / f"workers-{control}.log"
    with open(log, "wb") as out:
        start = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "scripts", "workers", "--count",
                                 str(count), "--burst"], env=env, cwd=ROOT, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=WORKERS_TIMEOUT)
        finally:
            stop_group(proc)
        seconds = time.perf_counter() - start
    if rc:
        tail = log.read_text(errors="replace").strip()[-800:]
        raise RuntimeError(f"farm workers exited {rc}: {tail}")
    return seconds


@contextmanager
def running_workers(bench: Bench, count: int, control: str) -> Iterator[None]:
    """``farm workers --count N`` started and registered (idle) before the block, stopped
    after it: what a timing inside the block measures excludes the workers' start-up."""
    env = control_env(bench, control)
    log = bench.workdir / f"workers-{control}-running.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "scripts", "workers", "--count",
                                 str(count)], env=env, cwd=ROOT, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        conn = Redis.from_url(bench.env["FARM_REDIS_URL"])
        deadline = time.monotonic() + 120
        while Worker.count(connection=conn) < count:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"workers did not start: {log.read_text()[-800:]}")
            time.sleep(0.1)
        yield proc
    finally:
        stop_group(proc)


def timed_run(bench: Bench, workers: int, control: str, start: Callable[[Runtime], str],
              usage: list[Usage] | None = None) -> tuple[str, float]:
    """With ``workers`` already running, the seconds from ``start(runtime)`` (plan, record,
    enqueue, in this process) to the run's end, and its run ID; ``usage`` gets the run's
    ``Usage`` appended."""
    rt = Runtime(Settings.from_env(control_env(bench, control)))
    try:
        with running_workers(bench, workers, control) as group:
            legacy_pid = bench.legacy.proc.pid if bench.legacy else None
            cpu = (cpu_seconds(bench.server.proc.pid), workers_cpu(group.pid),
                   cpu_seconds(legacy_pid) if legacy_pid else 0.0)
            opens = table_opens(bench.server)
            t = time.perf_counter()
            run_id = start(rt)
            wait_run(bench, run_id, control)
            seconds = time.perf_counter() - t
            if usage is not None:
                usage.append(Usage(cpu_seconds(bench.server.proc.pid) - cpu[0],
                                   workers_cpu(group.pid) - cpu[1], workers_peak(group.pid),
                                   table_opens(bench.server) - opens,
                                   cpu_seconds(legacy_pid) - cpu[2] if legacy_pid else None))
            return run_id, seconds
    finally:
        rt.close()


def wait_run(bench: Bench, run_id: str, control: str, every: float = 0.02) -> None:
    """Poll the ledger until run ``run_id`` is no longer running."""
    conn = bench.connect(database=control)
    try:
        with conn.cursor() as cur:
            deadline = time.monotonic() + WORKERS_TIMEOUT
            while time.monotonic() < deadline:
                cur.execute("SELECT status FROM runs WHERE run_id = %s", (run_id,))
                if cur.fetchone()[0] != "running":
                    return
                time.sleep(every)
    finally:
        conn.close()
    raise RuntimeError(f"run {run_id} did not end")


def stop_group(proc: subprocess.Popen) -> None:
    """End the process group started for ``proc``: SIGTERM, then SIGKILL after 20 s."""
    try:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=20)
        os.killpg(proc.pid, 0)  # raises ProcessLookupError when nothing of it is left
        os.killpg(proc.pid, signal.SIGKILL)
        say(f"note: stray processes of the worker supervisor {proc.pid} were killed")
    except (ProcessLookupError, subprocess.TimeoutExpired):
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def run_summary(bench: Bench, run_id: str, control: str) -> dict:
    """The run from ``farm status --json --run``; raises unless it is done without failures."""
    view = json.loads(bench.farm("status", "--json", "--run", run_id, control=control))
    run = view["runs"][0]
    failed = sum(k["failed"] for k in run["kinds"])
    if run["status"] != "done" or failed:
        why = bench.farm("failed", "--run", run_id, control=control).strip()[-1500:]
        raise RuntimeError(f"run {run_id} ended {run['status']} with {failed} failed "
                           f"chunk(s): {why}")
    return run
