"""``farm shards init|show``: create every database and table of the shard map."""

from __future__ import annotations

import click

from farmcore.provision import provision
from scripts.app import App
from scripts.options import emit, farm_options
from scripts.render import database_bar, note


@click.group("shards")
def shards_group() -> None:
    """Create and inspect the shard databases of the shard map."""


@shards_group.command("init")
@click.option("--tune", is_flag=True,
              help="Raise each server's table caches to fit its tables (SET GLOBAL).")
@farm_options
def init(app: App, tune: bool) -> None:
    """Create every database and table of the map, the mod buckets and the control database.

    Safe to run again: existing databases and tables are left as they are.
    """
    done = provision(app.settings, app.router, tune=tune, progress=database_bar)
    for line in done.advice:
        note(line)
    emit(done.as_dict())


@shards_group.command("show")
@farm_options
def show(app: App) -> None:
    """Print the shard map's ranges and hosts (without passwords)."""
    m = app.source.current()
    emit({"version": m.version, "shards": m.shard_count(), "buckets": m.buckets,
          "ranges": [{"range": [r.lo, r.hi], "master": r.master, "slave": r.slave}
                     for r in m.shard_ranges],
          "hosts": {n: f"{h.user}@{h.host}:{h.port}" for n, h in m.hosts.items()},
          "open": [list(r) for r in m.open_ranges]})


def register(cli: click.Group) -> None:
    """Attach this module's commands."""
    cli.add_command(shards_group)
