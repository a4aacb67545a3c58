"""``farm demo``: the whole story end to end on the default setup."""

from __future__ import annotations

import random
import time

import click

from scripts.app import App
from scripts.cmd_shards import init_all
from scripts.options import farm_options
from sharding import ids
from sharding.mappings import Edge, MappingStore
from sharding.objects import ObjectStore


def _write_profile(app: App, rng: random.Random) -> tuple[int, int, list[int]]:
    """A user, one board and 120 pins on the user's shard, linked by mappings."""
    objects = ObjectStore(app.router)
    shard = rng.choice(app.source.current().open_shards())
    now = int(time.time())
    user = objects.create(shard, "user", {"username": "demo", "full_name": "Demo Pinner ✨",
                                          "created_at": "2013-04-05T06:07:08Z"})
    board = objects.create(shard, "board", {"user_id": user, "name": "Recipes 🍜",
                                            "created_at": "2013-04-05T06:07:09Z"})
    pins = [objects.create(shard, "pin", {"user_id": user, "board_id": board,
                                          "details": f"pin #{i}", "link": None})
            for i in range(120)]
    # Many pins share one sequence (same second): the page order must still be stable.
    edges = [Edge(board, p, now - i // 10) for i, p in enumerate(pins)]
    MappingStore(app.router, "board_has_pins").add_many(edges)
    MappingStore(app.router, "user_has_boards").add(user, board, now)
    return user, board, pins


def _render_page(app: App, board: int) -> list[str]:
    """Board page: the next 50 pin IDs in sequence order, then a multi-get (app-level join)."""
    page = MappingStore(app.router, "board_has_pins").page(board, limit=50)
    pins = ObjectStore(app.router).get_many(page.ids)
    lines = [f"  {o.id}  {o.data['details']}" for o in pins.found[:5]]
    lines.append(f"  ... {len(pins.found)} pins on page 1, next cursor {page.next_cursor}")
    return lines


@click.command("demo")
@click.option("--seed", default=None, type=int, help="Seed for the random placement.")
@farm_options
def demo(app: App, seed: int | None) -> None:
    """Run the whole story end to end on the default setup (localhost MariaDB and Redis)."""
    rng = random.Random(seed)
    t0 = time.monotonic()
    rep = init_all(app)
    click.echo(f"shards ready: {rep['shards']} shards, {rep['mod_buckets']} mod buckets "
               f"on {rep['servers']} server(s) in {rep['seconds']}s")
    user, board, _pins = _write_profile(app, rng)
    click.echo(f"wrote user {user}, board {board} and 120 pins on shard {ids.shard_of(user)}")
    click.echo("board page (newest first):")
    for line in _render_page(app, board):
        click.echo(line)
    click.echo(f"decoded board id: {ids.decode(board).as_dict()}")
    click.echo(f"done in {time.monotonic() - t0:.1f}s")


def register(cli: click.Group) -> None:
    """Attach this module's commands."""
    cli.add_command(demo)
