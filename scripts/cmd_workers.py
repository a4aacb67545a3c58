"""``farm workers`` and ``farm scale``: run and size the worker fleet."""

from __future__ import annotations

import socket

import click
import redis

from scripts.app import App
from scripts.options import emit, farm_options
from shardfarm import keys
from workers.supervisor import Supervisor


@click.command("workers")
@click.option("--count", default=2, show_default=True, help="Worker processes on this machine.")
@click.option("--burst", is_flag=True, help="Exit once the queues are empty.")
@click.option("--queues", default="farm", show_default=True, help="Comma-separated queues.")
@farm_options
def workers(app: App, count: int, burst: bool, queues: str) -> None:
    """Run COUNT worker processes here, supervised.

    SIGTERM: finish the jobs in hand and exit (twice: stop at once).
    SIGUSR1 / SIGUSR2: one worker more / fewer. 'farm scale N' from any machine
    sets the count every supervisor converges to.
    """
    sup = Supervisor(app.settings, count, [q for q in queues.split(",") if q], burst=burst)
    raise SystemExit(sup.run())


@click.command("scale")
@click.argument("count", type=click.IntRange(0, 1000))
@click.option("--host", default=None, help="Only the supervisor on this host (default: all).")
@farm_options
def scale(app: App, count: int, host: str | None) -> None:
    """Set the desired worker count per supervisor; they converge within seconds."""
    conn = redis.Redis.from_url(app.settings.redis_url)
    conn.set(keys.desired_workers(host), count)
    emit({"desired": count, "host": host or "*", "from": socket.gethostname()})


def register(cli: click.Group) -> None:
    """Attach this module's commands."""
    cli.add_command(workers)
    cli.add_command(scale)
