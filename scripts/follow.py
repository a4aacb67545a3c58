"""Following a run from the terminal: progress bars until it ends, then its summary (a few
lines for a person at a terminal, the JSON line for scripts)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

import click

from farmcore.progress import read_progress
from jobs import runs
from jobs.runtime import Runtime
from scripts.app import App
from scripts.bars import ProgressBars
from scripts.options import emit
from scripts.render import echo_lines
from scripts.summaries import for_people, summary_lines


@contextmanager
def goes_on(run_id: str, bars: ProgressBars | None = None) -> Iterator[None]:
    """Ctrl-C inside stops the command, not the run: one line says so and what to do next,
    exit 130."""
    try:
        yield
    except KeyboardInterrupt:
        if bars is not None:
            bars.close()
        click.echo(f"farm: stopped waiting; {run_id} goes on on the workers ('farm status "
                   f"--run {run_id}' shows it, 'farm pause {run_id}' stops it)", err=True)
        sys.exit(130)


def wait_with_progress(rt: Runtime, run_id: str) -> str:
    """Show the run's progress until it ends; returns its final status. Ctrl-C stops the
    waiting, not the run (``goes_on``)."""
    bars = ProgressBars(run_id)
    try:
        with goes_on(run_id, bars):
            return runs.wait(rt, run_id, on_tick=bars)
    finally:
        bars.close()


def show_summary(rt: Runtime, run_id: str, as_json: bool) -> dict:
    """Print the run's summary: lines for a person on a terminal, else (or with ``as_json``)
    the JSON line; returns the JSON document."""
    doc = runs.summary(rt, run_id)
    if for_people(as_json):
        kind = rt.ledger.run(run_id)["kind"]
        echo_lines(summary_lines(doc, kind, read_progress(rt.ledger, run_id)))
    else:
        emit(doc)
    return doc


def finish(app: App, run_id: str, wait: bool, as_json: bool = False) -> None:
    """Print the run's summary (after showing progress until it ends, with ``wait``).

    With ``wait`` the exit code is 0 only if every chunk finished (and a verify run found
    no mismatch).
    """
    rt = app.runtime
    if wait:
        wait_with_progress(rt, run_id)
    doc = show_summary(rt, run_id, as_json)
    if wait and not runs.ended_well(doc):
        sys.exit(1)
