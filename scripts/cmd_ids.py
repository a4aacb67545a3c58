"""``farm id decode|encode`` and ``farm modshard``."""

from __future__ import annotations

import click

from scripts.app import App
from scripts.options import emit, farm_options
from sharding import ids
from sharding.modshard import bucket_of


@click.group("id")
def id_group() -> None:
    """Decode or encode 64-bit IDs: (shard << 46) | (type << 36) | local."""


@id_group.command("decode", context_settings={"ignore_unknown_options": True})
@click.argument("id_text", metavar="ID")
def decode(id_text: str) -> None:
    """Print the shard, type and local ID of ID as one JSON object."""
    emit(ids.parse(id_text).as_dict())


@id_group.command("encode")
@click.argument("shard", type=int)
@click.argument("type_", metavar="TYPE")
@click.argument("local", type=int)
def encode(shard: int, type_: str, local: int) -> None:
    """Print the decimal ID of SHARD, TYPE (number or pin/board/user/comment) and LOCAL."""
    click.echo(ids.encode(shard, type_, local))


@click.command("modshard")
@click.argument("key")
@farm_options
def modshard(app: App, key: str) -> None:
    """Print the mod-shard bucket of KEY and the master that holds it."""
    m = app.source.current()
    b = bucket_of(key, m.buckets)
    emit({"key": key, "bucket": b, "master": m.mod_master(b).name})


def register(cli: click.Group) -> None:
    """Attach this module's commands."""
    cli.add_command(id_group)
    cli.add_command(modshard)
