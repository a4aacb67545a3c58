"""``farm shards init|show|publish``: create every database and table of the shard map,
print it, publish a new version of it."""

from __future__ import annotations

import click

from farmcore.provision import provision
from scripts.app import App
from scripts.options import emit, farm_options
from scripts.render import database_bar, note
from shardfarm.errors import UsageError
from sharding.mappublish import publish as publish_map


@click.group("shards")
def shards_group() -> None:
    """Create and inspect the shard databases of the shard map."""


@shards_group.command("init")
@click.option("--tune", is_flag=True,
              help="Raise each server's table caches to fit its tables and its redo log to "
                   "1G (SET GLOBAL, until the server restarts).")
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
    """Print a summary of the map in force: shard and mod ranges, open ranges, hosts
    (``user@host:port``, never a password)."""
    m = app.source.current()
    emit({"version": m.version, "shards": m.shard_count(), "buckets": m.buckets,
          "ranges": [{"range": [r.lo, r.hi], "master": r.master, "slave": r.slave}
                     for r in m.shard_ranges],
          "mod_ranges": [{"range": [r.lo, r.hi], "master": r.master, "slave": r.slave}
                         for r in m.mod_ranges],
          "hosts": {n: f"{h.user}@{h.host}:{h.port}" for n, h in m.hosts.items()},
          "open": [[*r, w] for r, w in zip(m.open_ranges, m.open_weights, strict=True)]})


@shards_group.command("publish")
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True))
@farm_options
def publish(app: App, file: str) -> None:
    """Validate the map in FILE and write it as the next version where FARM_SHARDMAP points
    (its version must be the current one + 1); every process switches to it."""
    try:
        text = click.open_file(file, encoding="utf-8").read()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {file}: {getattr(exc, 'strerror', None) or exc}") from None
    new = publish_map(app.settings.shardmap_spec, text, app.settings.connect_timeout)
    emit({"published": new.version, "where": app.settings.shardmap_spec})


def register(cli: click.Group) -> None:
    """Attach this module's commands (and the capacity commands of the same group)."""
    from scripts import cmd_capacity  # noqa: F401 - adds open/move/promote/status to the group
    cli.add_command(shards_group)
