"""``farm shards init|show``: create every database and table of the shard map."""

from __future__ import annotations

import sys

import click
from tqdm import tqdm

from scripts.app import App
from scripts.options import emit, farm_options
from shardfarm.mysql.db import ensure_database
from sharding.provision import cache_advice, init_databases


@click.group("shards")
def shards_group() -> None:
    """Create and inspect the shard databases of the shard map."""


def init_all(app: App, quiet: bool = False, tune: bool = False) -> dict:
    """Create the control database and every shard and mod bucket database; return a report."""
    ensure_database(app.settings.control_dsn)
    from farmcore import control_schema
    control_schema.ensure(app.settings.control_dsn)
    m = app.source.current()
    total = m.shard_count() + m.buckets
    with tqdm(total=total, unit="db", desc="shards init", disable=quiet or not sys.stderr.isatty(),
              leave=False) as bar:
        rep = init_databases(app.router, progress=bar.update)
    for line in cache_advice(app.router, tune):
        click.echo(f"farm: note: {line}", err=True)
    return {"shards": rep.shards, "mod_buckets": rep.buckets, "servers": rep.servers,
            "seconds": round(rep.seconds, 2)}


@shards_group.command("init")
@click.option("--tune", is_flag=True,
              help="Raise each server's table caches to fit its tables (SET GLOBAL).")
@farm_options
def init(app: App, tune: bool) -> None:
    """Create every database and table of the map, the mod buckets and the control database.

    Safe to run again: existing databases and tables are left as they are.
    """
    emit(init_all(app, tune=tune))


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
