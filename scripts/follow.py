"""Following a run from the terminal: a progress bar until it ends, then its JSON summary."""

from __future__ import annotations

import sys

from jobs import runs
from jobs.runtime import Runtime
from scripts.app import App
from scripts.options import emit
from scripts.render import RunProgress


def wait_with_progress(rt: Runtime, run_id: str) -> str:
    """Show the run's progress until it ends; returns its final status."""
    bar = RunProgress(run_id)
    try:
        return runs.wait(rt, run_id, on_tick=bar)
    finally:
        bar.close()


def finish(app: App, run_id: str, wait: bool) -> None:
    """Print the run's JSON summary (after showing progress until it ends, with ``wait``).

    With ``wait`` the exit code is 0 only if every chunk finished.
    """
    rt = app.runtime
    if wait:
        wait_with_progress(rt, run_id)
    doc = runs.summary(rt, run_id)
    emit(doc)
    if wait and doc["status"] != "done":
        sys.exit(1)
