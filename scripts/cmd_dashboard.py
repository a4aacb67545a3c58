"""``farm dashboard``: the live web page and ``/metrics``."""

from __future__ import annotations

import click

from dashboard import DEFAULT_BIND
from scripts.app import App
from scripts.options import farm_options


@click.command("dashboard")
@click.option("--bind", default=DEFAULT_BIND, show_default=True, metavar="HOST:PORT",
              help="Where to listen.")
@click.option("--allow-actions", is_flag=True,
              help="Offer pause, unpause, retry failed and scale (each confirmed, each "
                   "needing the token). Read-only without it.")
@click.option("--token", default=None, metavar="TOKEN",
              help="The token actions need (prefer the environment: it stays out of 'ps'). "
                   "[env: FARM_DASHBOARD_TOKEN]")
@farm_options
def dashboard(app: App, bind: str, allow_actions: bool, token: str | None) -> None:
    """Serve the live dashboard (runs, workers, queues, exports) and Prometheus /metrics."""
    from dashboard.serve import guard_from, serve  # Flask and waitress: only for this command
    guard = guard_from(allow_actions, token)
    serve(app.viewer, bind, guard, actor=app.runtime if guard.allow else None,
          ready=lambda url: click.echo(f"dashboard on {url} (Ctrl-C stops it)", err=True))


def register(cli: click.Group) -> None:
    """Attach this module's commands."""
    cli.add_command(dashboard)
