"""The demo's own workers: ``farm workers --count N`` as a child process for one demo."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from shardfarm.settings import Settings


def _env(settings: Settings) -> dict[str, str]:
    """This process's environment with the farm's settings spelled out."""
    env = dict(os.environ)
    env.update({"FARM_REDIS_URL": settings.redis_url,
                "FARM_CONTROL_DSN": settings.control_dsn.url(),
                "FARM_LEGACY_DSN": settings.legacy_dsn.url(),
                "FARM_SHARDMAP": settings.shardmap_spec,
                "FARM_EXPORT_URL": settings.export_url})
    return env


@contextmanager
def own_workers(settings: Settings, count: int) -> Iterator[subprocess.Popen]:
    """Run ``farm workers --count N`` for the demo and stop it (warm) at the end."""
    proc = subprocess.Popen([sys.executable, "-m", "scripts", "workers", "--count", str(count)],
                            env=_env(settings), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:  # the supervisor and every worker it started
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
