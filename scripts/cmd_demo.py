"""``farm demo``: the whole story end to end on the default setup."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

import click

from demo import pipeline
from demo.clean import clean_everything
from demo.cleanplan import clean_plan, plan_lines
from scripts.app import App
from scripts.bars import ProgressBars
from scripts.confirm import DRY_RUN, YES, go_ahead
from scripts.options import emit, farm_options
from scripts.render import database_bar, echo_lines, note
from shardfarm.errors import UsageError
from workers.supervisor import MAX_WORKERS


class TerminalObserver:
    """What the demo says on the way, on stderr: phase banners, notes, progress bars."""

    def phase(self, name: str) -> None:
        """``==> name``."""
        click.echo(f"==> {name}", err=True)

    def note(self, line: str) -> None:
        """``farm: note: line``."""
        note(line)

    def aside(self, text: str) -> None:
        """``    (text)``."""
        click.echo(f"    ({text})", err=True)

    def run_progress(self, run_id: str) -> ProgressBars:
        """Bars of the run's rows and chunks (only on a terminal)."""
        return ProgressBars(run_id)

    def db_progress(self, total: int) -> AbstractContextManager[Callable[[int], object]]:
        """A bar of databases created (only on a terminal)."""
        return database_bar(total)


@click.command("demo")
@click.option("--users", default=5000, show_default=True, type=click.IntRange(min=1),
              help="Legacy users (~40 rows each).")
@click.option("--workers", "n_workers", default=2, show_default=True,
              type=click.IntRange(1, MAX_WORKERS), help="Workers to start.")
@click.option("--clean", is_flag=True,
              help="Delete what the demo makes (the map's shard and mod databases, the legacy "
                   "and control databases, its exports, the farm's Redis keys), then exit.")
@click.option("--force", is_flag=True,
              help="Run even into shards or a legacy database holding data the demo did not "
                   "make (refused without it).")
@DRY_RUN
@YES
@farm_options
def demo(app: App, users: int, n_workers: int, clean: bool, force: bool, dry_run: bool,
         yes: bool) -> None:
    """Run the whole story on the default setup (localhost MariaDB and Redis).

    Generates a legacy database, creates the shards, starts its own workers,
    migrates with a progress bar, verifies, rebuilds the reverse mappings,
    rebalances hot boards, rebuilds home feeds, exports yesterday's partition
    to FARM_EXPORT_URL (./exports) and prints a report. Safe to run again on its
    own data; refuses data it did not make unless --force; exits 1 when any run
    failed or verify found a mismatch. --clean removes what it made (--dry-run: says
    exactly what, removes nothing; on a terminal it asks first unless --yes).
    """
    if dry_run and not clean:
        raise UsageError("--dry-run goes with --clean")
    if clean:
        def describe() -> tuple[list[str], dict]:
            plan = clean_plan(app.runtime)
            return plan_lines(plan), plan
        if go_ahead(describe, dry_run=dry_run, yes=yes):
            emit(clean_everything(app.runtime))
        return
    outcome = pipeline.run(app.runtime, users, n_workers, force, TerminalObserver())
    echo_lines(outcome.report)
    if failure := outcome.failure():
        raise failure


def register(cli: click.Group) -> None:
    """Attach this module's commands."""
    cli.add_command(demo)
