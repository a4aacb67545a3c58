"""``farm legacy generate``: fill the legacy source database with a synthetic data set."""

from __future__ import annotations

import sys
import time

import click
from tqdm import tqdm

from demo.legacygen.generate import generate
from demo.legacygen.origin import (
    describe_rows,
    legacy_rows,
    refuse_farm_database,
    refuse_to_replace,
    where,
)
from scripts.app import App
from scripts.confirm import DRY_RUN, YES, go_ahead
from scripts.options import emit, farm_options
from shardfarm.errors import UsageError


@click.group("legacy")
def legacy_group() -> None:
    """Create and fill the legacy source database (FARM_LEGACY_DSN)."""


@legacy_group.command("generate")
@click.option("--users", type=click.IntRange(min=1), required=True, metavar="N",
              help="Number of users; about 40 legacy rows are written per user.")
@click.option("--seed", type=int, default=1, show_default=True, metavar="S",
              help="Random seed: the same seed always gives the same data.")
@click.option("--replace", is_flag=True,
              help="Drop the legacy tables even when they hold rows (refused without it).")
@DRY_RUN
@YES
@farm_options
def generate_cmd(app: App, users: int, seed: int, replace: bool, dry_run: bool,
                 yes: bool) -> None:
    """Create and fill the legacy tables with a realistic synthetic data set.

    Power-law boards, pins and follows (a few very hot boards), group boards, unicode,
    sparse and large IDs, and a small share of bad rows (NULL or zero dates, NULL
    usernames, orphans). Prints one JSON line with the counts and the seconds taken.
    A legacy database whose tables hold rows is refused unless --replace is given
    (--dry-run: say exactly what it would drop; on a terminal it asks first unless --yes).
    """
    dsn = app.settings.legacy_dsn
    if dry_run and not replace:
        raise UsageError("--dry-run goes with --replace")
    refuse_farm_database(dsn)
    if not replace:
        refuse_to_replace(dsn)

    def describe() -> tuple[list[str], dict]:
        rows = legacy_rows(dsn)
        lines = ([f"drop the legacy tables of {where(dsn)}: {describe_rows(rows)}, then "
                  f"generate {users:,} users (seed {seed}) anew"] if sum(rows.values()) else [])
        return lines, {"database": dsn.database, "server": f"{dsn.host}:{dsn.port}",
                       "tables": rows}
    if not go_ahead(describe, dry_run=dry_run, yes=yes):
        return
    start = time.monotonic()
    with tqdm(unit="row", unit_scale=True, desc="legacy generate", leave=False,
              disable=not sys.stderr.isatty()) as bar:
        report = generate(app.settings.legacy_dsn, users, seed, progress=bar.update)
    emit({**report, "seconds": round(time.monotonic() - start, 2)})


def register(cli: click.Group) -> None:
    """Attach this module's commands."""
    cli.add_command(legacy_group)
