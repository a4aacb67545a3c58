"""``farm reverse``, ``farm rebalance`` and ``farm followers``."""

from __future__ import annotations

import click

from loaders.mappings import reverse as reverser
from scripts.app import App
from scripts.follow import finish
from scripts.options import AS_JSON, MAX_LAG, emit, farm_options
from scripts.render import note
from shardfarm.errors import InvalidIdError
from sharding import hotspot, ids
from workers import launch


@click.command("reverse")
@click.argument("tables", nargs=-1, metavar="[TABLE ...]")
@click.option("--chunk-size", default=reverser.DEFAULT_CHUNK_ROWS, show_default=True,
              type=click.IntRange(min=1), help="Forward rows per chunk.")
@click.option("--wait", is_flag=True, help="Show progress until the run ends; exit 0 if done.")
@MAX_LAG
@AS_JSON
@farm_options
def reverse(app: App, tables: tuple[str, ...], chunk_size: int, wait: bool,
            max_lag: float | None, as_json: bool) -> None:
    """Rebuild reverse mapping tables (default: all of them) from their forward tables.

    pin_owned_by_board <- board_has_pins, board_followedby_users <-
    user_follows_boards, pin_liked_by_users <- user_likes_pins. Hot boards'
    followers go where the hotspot directory says.
    """
    run_id = launch.reverse(app.runtime, list(tables), chunk_size, notice=note, max_lag=max_lag)
    finish(app, run_id, wait, as_json)


@click.command("rebalance")
@click.argument("table", metavar="TABLE")
@click.option("--threshold", required=True, type=click.IntRange(min=1),
              help="Spread boards with more than this many rows.")
@click.option("--spread", default=4, show_default=True, type=click.IntRange(min=2),
              help="Shards to spread each hot board over (spread across servers).")
@click.option("--wait", is_flag=True, help="Show progress until the run ends; exit 0 if done.")
@MAX_LAG
@AS_JSON
@farm_options
def rebalance(app: App, table: str, threshold: int, spread: int, wait: bool,
              max_lag: float | None, as_json: bool) -> None:
    """Spread hot mappings over several shards through the hotspot directory, online.

    Each hot board goes planned -> copying -> active -> cleaned; a run that dies
    at any step is completed by running the command again.
    """
    run_id = launch.rebalance(app.runtime, table, threshold, spread, notice=note,
                              max_lag=max_lag)
    finish(app, run_id, wait, as_json)


@click.command("followers")
@click.argument("board_id", type=int)
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 10_000),
              help="Followers per page.")
@click.option("--cursor", default=None, help="The next_cursor of the previous page.")
@farm_options
def followers(app: App, board_id: int, limit: int, cursor: str | None) -> None:
    """Print a page of a board's followers, newest first, through the hotspot directory."""
    kind = ids.decode(board_id).type_name
    if kind != "board":  # a pin's or user's ID found no followers: an all-clear by mistake
        raise InvalidIdError(f"{board_id} is not a board ID (it is a {kind})")
    page = hotspot.followers(app.router, board_id, limit, cursor)
    entry = hotspot.Directory(app.router).get(board_id)
    emit({"board_id": board_id, "followers": page.ids, "next_cursor": page.next_cursor,
          "directory": None if entry is None else {"state": entry.state,
                                                   "shards": list(entry.shards)}})


def register(cli: click.Group) -> None:
    """Attach this module's commands."""
    for cmd in (reverse, rebalance, followers):
        cli.add_command(cmd)
