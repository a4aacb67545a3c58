"""``farm demo``: the whole story end to end on the default setup.

Refuse data the demo did not make (unless forced), create the shards, generate a legacy
database, start the demo's own workers, migrate, verify, rebuild the reverse mappings,
rebalance hot boards, rebuild home feeds, export yesterday's partition, and build the
report. What the terminal shows on the way (phase banners, notes, progress bars) is the
caller's ``Observer``'s business.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

from demo import report
from demo.clean import clean_everything
from demo.fleet import own_workers
from demo.guard import MADE_BY, foreign, previous_data_set, refusal, survey
from demo.legacygen.generate import generate
from demo.phases import Phases, RunResult, run_result, verify_result
from exporters import export as exporter
from farmcore.preflight import preflight
from farmcore.progress import RunProgress
from farmcore.provision import provision
from jobs import runs
from jobs.runtime import Runtime
from loaders import feeds as feeder
from loaders.mappings import rebalance as rebalancer
from loaders.mappings import reverse as reverser
from loaders.migration import migrate as migration
from shardfarm.errors import FatalError
from sharding.hotspot import FOLLOWERS
from workers.launch import start_verify

DEMO_SEED = 42
HOT_THRESHOLD = 1000
HOT_SPREAD = 4


class RunWatch(Protocol):
    """Shown a run's progress on each poll, then closed."""

    def __call__(self, progress: RunProgress) -> None:
        """Show the run's progress now."""

    def close(self) -> None:
        """The run ended."""


class Observer(Protocol):
    """What the demo tells the person watching it."""

    def phase(self, name: str) -> None:
        """Phase ``name`` starts."""

    def note(self, line: str) -> None:
        """Advice worth a line (a server's table caches)."""

    def aside(self, text: str) -> None:
        """What the demo decided about the data it found."""

    def run_progress(self, run_id: str) -> RunWatch:
        """Progress of run ``run_id``, until it ends."""

    def db_progress(self, total: int) -> AbstractContextManager[Callable[[int], object]]:
        """Progress of creating ``total`` databases: called once per database created."""


@dataclass
class Outcome:
    """The demo's report, and how each of its runs ended."""

    report: list[str]
    results: list[RunResult]

    def failure(self) -> FatalError | None:
        """The one-line error when any run did not end well (``None``: all did)."""
        bad = [r for r in self.results if not r.ok]
        if not bad:
            return None
        return FatalError(f"demo: {len(bad)} of {len(self.results)} runs did not end well ("
                          + ", ".join(f"{r.phase} {r.run_id}" for r in bad)
                          + "); the report above says why and what to run next")


def run(rt: Runtime, users: int, n_workers: int, force: bool, observer: Observer) -> Outcome:
    """Run the whole demo with ``users`` legacy users and ``n_workers`` workers of its own.

    ``force``: run even into shards or a legacy database holding data the demo did not
    make (refused without it).
    """
    tag = prepare(rt, {"users": users, "seed": DEMO_SEED}, force, observer)
    demo = _Demo(rt, Phases(observer.phase), tag, observer)
    demo.create(users)
    preflight(rt.settings, rt.router)
    with own_workers(rt.settings, n_workers) as demo.workers_alive:
        mig = demo.migrate_and_verify()
        date = demo.later_phases()
    return Outcome(report.build(rt, demo.p, mig, date), list(demo.p.results.values()))


def prepare(rt: Runtime, data_set: dict, force: bool, observer: Observer) -> dict:
    """Refuse data the demo did not make (unless ``force``); clean another demo data set.

    Returns the ``demo`` tag every run of this demo carries in its params.
    """
    found = survey(rt)
    foreign_data = foreign(rt, found)
    if foreign_data and not force:
        raise refusal(foreign_data)
    if foreign_data:
        observer.aside(f"--force: running into {'; '.join(foreign_data.values())}")
        return {**data_set, "forced": True} if "shards" in foreign_data else data_set
    previous = previous_data_set(found)
    if previous is not None and previous != data_set:
        observer.aside("the last demo used another data set: starting from clean")
        clean_everything(rt)
    return data_set


class _Demo:
    """The phases of one demo: each starts its run, shows its progress, keeps its result."""

    def __init__(self, rt: Runtime, p: Phases, tag: dict, observer: Observer) -> None:
        self.rt, self.p, self.tag, self.observer = rt, p, tag, observer
        self.workers_alive: Callable[[], None] = lambda: None  # the demo's own workers

    def create(self, users: int) -> None:
        """Create the shards and the control database, then generate a legacy one of
        ``users`` users."""
        p = self.p
        with p.phase("shards init"):
            # a demo's few thousand rows need no large redo log: left as the server has it
            done = provision(self.rt.settings, self.rt.router, tune=True, redo=False,
                             progress=self.observer.db_progress)
            for line in done.advice:
                self.observer.note(line)
        with p.phase("legacy generate"):
            gen = generate(self.rt.settings.legacy_dsn, users, DEMO_SEED, made_by=MADE_BY)
        p.set_rows("legacy generate", sum(gen["rows"].values()))

    def _wait(self, run_id: str) -> str:
        """Show the run's progress until it ends; its final status."""
        bar = self.observer.run_progress(run_id)

        def tick(progress: RunProgress) -> None:
            self.workers_alive()  # nobody would work on the run: one line, not a hang
            bar(progress)
        try:
            return runs.wait(self.rt, run_id, on_tick=tick)
        finally:
            bar.close()

    def migrate_and_verify(self) -> RunResult:
        """Migrate the whole legacy database, then verify it; how the migration ended."""
        rt, p = self.rt, self.p
        with p.phase("migrate"):
            params, chunks = migration.plan(rt.settings, rt.router, rt.ledger)
            run_id = runs.start(rt, "migrate", migration.HANDLER, chunks,
                                {**params, "demo": self.tag})
            mig = run_result(rt, "migrate", run_id, self._wait(run_id))
        p.set_rows("migrate", sum(mig.summary["loaded"].values())
                   + sum(mig.summary["quarantined"].values()))
        p.record(mig)
        with p.phase("verify"):
            vid = start_verify(rt, rt.ledger.run(run_id), {"demo": self.tag})
            p.record(verify_result(rt, vid, self._wait(vid)))
        return mig

    def later_phases(self) -> str:
        """Reverse, rebalance, feeds and the export of yesterday; returns the export date."""
        router = self.rt.router
        rev = self._run("reverse mappings", "reverse", reverser.HANDLER,
                        *reverser.plan(router, []))
        self.p.set_rows("reverse mappings", sum(rev.summary["loaded"].values()))
        spread = min(HOT_SPREAD, len(list(router.shardmap.shards())) - 1)
        reb = self._run("rebalance hot boards", "rebalance", rebalancer.HANDLER,
                        *rebalancer.plan(router, FOLLOWERS, HOT_THRESHOLD, spread))
        self.p.set_rows("rebalance hot boards", sum(reb.summary["loaded"].values()))
        fed = self._run("home feeds", "feeds", feeder.HANDLER, *feeder.plan(router))
        self.p.set_rows("home feeds", fed.summary["loaded"].get("feeds", 0))
        date = (dt.datetime.now(dt.UTC).date() - dt.timedelta(days=1)).isoformat()
        params, chunks = exporter.plan(router, date, self.rt.settings.export_url, force=True)
        exp = self._run("export", "export", exporter.HANDLER, params, chunks)
        self.p.set_rows("export", sum(exp.summary["loaded"].values()))
        return date

    def _run(self, phase: str, kind: str, handler: str, params: dict,
             chunks: list) -> RunResult:
        """Start a run as ``phase``, show its progress, record and return how it ended."""
        with self.p.phase(phase):
            run_id = runs.start(self.rt, kind, handler, chunks, {**params, "demo": self.tag})
            return self.p.record(run_result(self.rt, phase, run_id, self._wait(run_id)))
