"""``farm feeds rebuild``: rebuild Redis home feeds from the mappings as one resumable run."""

from __future__ import annotations

import click

from loaders import feeds as feeder
from scripts.app import App
from scripts.follow import finish
from scripts.options import AS_JSON, CommaList, farm_options
from scripts.render import note
from sharding import ids
from workers import launch


def parse_users(parts: list[str] | None) -> list[int] | None:
    """``--users ID,ID,...`` as user IDs (``None``: every user); a bad ID is an
    ``InvalidIdError``."""
    if parts is None:
        return None
    return feeder.check_user_ids(ids.parse(p).id for p in parts)


@click.group("feeds")
def feeds() -> None:
    """Home feeds in Redis (home:<user_id>, newest pin first)."""


@feeds.command("rebuild")
@click.option("--users", default=None, metavar="ID,ID,...", type=CommaList(),
              help="Only these users, as one chunk (default: every active user).")
@click.option("--length", default=feeder.DEFAULT_LENGTH, show_default=True,
              type=click.IntRange(1, feeder.MAX_LENGTH), help="Pins kept per feed.")
@click.option("--chunk-size", default=feeder.DEFAULT_CHUNK_USERS, show_default=True,
              type=click.IntRange(min=1), help="Users per chunk.")
@click.option("--wait", is_flag=True, help="Show progress until the run ends; exit 0 if done.")
@AS_JSON
@farm_options
def rebuild(app: App, users: list[str] | None, length: int, chunk_size: int, wait: bool,
            as_json: bool) -> None:
    """Rebuild home feeds from user_follows_boards and board_has_pins.

    Each feed is swapped in atomically. Prints {"run_id", "status", "loaded":
    {"feeds": users with a feed}, ...} as the last line (at once without --wait).
    """
    run_id = launch.feeds(app.runtime, parse_users(users), chunk_size, length, notice=note)
    finish(app, run_id, wait, as_json)


def register(cli: click.Group) -> None:
    """Attach the ``feeds`` group."""
    cli.add_command(feeds)
