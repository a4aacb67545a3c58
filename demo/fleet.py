"""The demo's own workers: ``farm workers --count N`` as a child process for one demo,
watched: a supervisor that exits before the demo is done stops the demo in one line
(it waited for ever for runs nobody worked on)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from shardfarm.errors import FarmError
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
def own_workers(settings: Settings, count: int) -> Iterator[Callable[[], None]]:
    """Run ``farm workers --count N`` for the demo and stop it (warm) at the end. Yields a
    check that raises ``FarmError`` (with the supervisor's last line) once it has exited."""
    with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as err:
        proc = subprocess.Popen([sys.executable, "-m", "scripts", "workers", "--count",
                                 str(count)], env=_env(settings), stdout=subprocess.DEVNULL,
                                stderr=err, start_new_session=True)

        def check() -> None:
            code = proc.poll()
            if code is None:
                return
            err.seek(0)
            last = next((ln.strip() for ln in reversed(err.read().splitlines()) if ln.strip()),
                        "")
            raise FarmError(f"the demo's workers ('farm workers --count {count}') exited with "
                            f"code {code} before the demo was done"
                            + (f": {last[:300]}" if last else ""))
        try:
            yield check
        finally:
            _stop(proc)


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM the supervisor (its workers finish their jobs), SIGKILL its group after 60 s."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:  # the supervisor and every worker it started
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
