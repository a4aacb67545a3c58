"""Following a run from the terminal: progress bars until it ends, then its summary (a few
lines for a person at a terminal, the JSON line for scripts)."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import click
import redis

from farmcore.progress import RunProgress, read_progress
from jobs import runs
from jobs.runtime import Runtime
from jobs.status import serving
from scripts.app import App
from scripts.bars import LiveLines, ProgressBars
from scripts.options import emit
from scripts.render import echo_lines, note
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


NO_WORKER_SECONDS = 10.0  # a wait says that no worker takes its jobs after this long
CHECK_EVERY = 2.0  # seconds between two looks at the queue's workers


def paused_line(run_id: str) -> str:
    """What a paused run waits for."""
    return f"{run_id} is paused: no chunk of it is dispatched until 'farm unpause {run_id}'"


def note_below(live: LiveLines, line: str) -> None:
    """``note(line)`` below the lines drawn in place, the next drawing starting under it."""
    live.close()
    note(line)


class Unserved:
    """Called on each step of a wait on ``queue``: once no live worker has taken jobs from it
    for ``after`` seconds (no ``farm workers`` running, or only with other ``--queues``),
    one note says so and what to start, so a wait that cannot end says why; ``live``: the
    lines drawn in place, which the note must not overwrite."""

    def __init__(self, conn: redis.Redis, queue: str, live: LiveLines,
                 after: float = NO_WORKER_SECONDS) -> None:
        self.conn, self.queue, self.live, self.after = conn, queue, live, after
        self.since = self.checked = time.monotonic()
        self.said = False

    def __call__(self, *_: object) -> None:
        """Look at the queue's workers (every ``CHECK_EVERY`` s), and say it once."""
        now = time.monotonic()
        if self.said or now - self.checked < CHECK_EVERY:
            return
        self.checked = now
        try:
            if serving(self.conn, self.queue):
                self.since = now
                return
        except redis.RedisError:
            return  # the wait's own reads say what is wrong with Redis
        if now - self.since >= self.after:
            note_below(self.live, f"no worker has taken jobs from queue {self.queue!r} for "
                       f"{self.after:g} s: start some with 'farm workers --queues "
                       f"{self.queue}'; still waiting")
            self.said = True


def wait_with_progress(rt: Runtime, run_id: str) -> str:
    """Show the run's progress until it ends; returns its final status. Ctrl-C stops the
    waiting, not the run (``goes_on``); a note says so when no worker serves its queue, and
    when the run is paused or unpaused meanwhile."""
    bars = ProgressBars(run_id)
    run = rt.ledger.run(run_id)
    unserved = Unserved(rt.redis, run["queue"], bars)
    paused = bool(run["paused"])  # as the wait last said it ('farm resume' says it first)

    def tick(p: RunProgress) -> None:
        nonlocal paused
        bars(p)
        if p.paused != paused and not p.finished:
            paused = p.paused
            note_below(bars, f"{paused_line(run_id)}; still waiting" if p.paused
                       else f"{run_id} is unpaused")
        if not p.paused:
            unserved()
    try:
        with goes_on(run_id, bars):
            return runs.wait(rt, run_id, on_tick=tick)
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
        if not for_people(as_json):  # a person read it in the summary's lines
            click.echo(f"farm: error: {ended_badly(doc, run_id)}", err=True)
        sys.exit(1)


def ended_badly(doc: dict, run_id: str) -> str:
    """One line for a run that did not end well: how, and what to run next."""
    if doc.get("mismatches"):
        return (f"{run_id} found {doc['mismatches']:,} mismatch(es): 'farm mismatches --run "
                f"{run_id}' lists them")
    failed = doc.get("failed_chunks") or 0
    return (f"{run_id} ended {doc['status']} with {failed:,} chunk(s) not done: 'farm failed "
            f"--run {run_id}' says why, 'farm retry-failed --run {run_id}' tries them again")
