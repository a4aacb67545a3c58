"""``farm``: one command for the whole farm. Every error is one line and a non-zero exit:
2 for a usage mistake (a bad flag, option value, date, table, cron expression or ID),
1 for everything else."""

from __future__ import annotations

import os
import sys

import click
import redis

from shardfarm import log as farm_log
from shardfarm.errors import FarmError, InvalidIdError, UsageError

ORDER = ("demo", "shards", "legacy", "migrate", "verify", "quarantine", "reverse", "rebalance",
         "followers", "feeds", "export", "cron", "workers", "scale", "status", "resume", "pause",
         "unpause", "failed", "retry-failed", "enqueue", "id", "modshard", "dashboard")


class FarmGroup(click.Group):
    """A click group that turns ``FarmError`` into one line on stderr and an exit code."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        """Commands in the order an operator meets them, not alphabetical."""
        names = super().list_commands(ctx)
        return [n for n in ORDER if n in names] + [n for n in names if n not in ORDER]

    def invoke(self, ctx: click.Context):
        """Run the command; a ``FarmError`` or Redis error becomes one line and an exit code."""
        try:
            return super().invoke(ctx)
        except (UsageError, InvalidIdError) as exc:
            click.echo(f"farm: error: {exc}", err=True)
            sys.exit(2)
        except FarmError as exc:
            click.echo(f"farm: error: {exc}", err=True)
            sys.exit(1)
        except redis.RedisError as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            click.echo(f"farm: error: Redis: {first} (check FARM_REDIS_URL and that Redis "
                       "is running)", err=True)
            sys.exit(1)


@click.group(cls=FarmGroup, context_settings={"help_option_names": ["-h", "--help"],
                                             "max_content_width": 120, "terminal_width": 120})
@click.option("--log-level", default=None, metavar="LEVEL",
              help="Logging level (DEBUG, INFO, WARNING). [env: FARM_LOG_LEVEL]")
@click.option("--log-format", default=None, metavar="text|json",
              help="Log lines as text, or one JSON object per line (with run, chunk, shard, "
                   "host, worker) for log shippers; workers started here log the same way. "
                   "[env: FARM_LOG_FORMAT]")
@click.version_option(package_name="shardfarm")
def cli(log_level: str | None, log_format: str | None) -> None:
    """shardfarm: move data into, around and out of an ID-sharded MySQL fleet.

    Scripts enqueue chunks of work on Redis queues; workers on any number of
    machines run them against the shards; the control database keeps which
    chunks of which run are done.
    """
    farm_log.setup(log_level, log_format)


def _register() -> None:
    from scripts import (
        cmd_dashboard,
        cmd_demo,
        cmd_export,
        cmd_feeds,
        cmd_ids,
        cmd_legacy,
        cmd_migrate,
        cmd_queue,
        cmd_reverse,
        cmd_runs,
        cmd_shards,
        cmd_workers,
    )
    for module in (cmd_ids, cmd_shards, cmd_legacy, cmd_migrate, cmd_reverse, cmd_feeds,
                   cmd_queue, cmd_workers, cmd_runs, cmd_demo, cmd_export, cmd_dashboard):
        module.register(cli)


_register()


def main(argv: list[str] | None = None) -> None:
    """Console entry point: usage errors, like every other error, are one line."""
    if os.getcwd() not in sys.path:  # like rq's --path ., so operators' own modules import
        sys.path.insert(0, os.getcwd())
    try:
        cli.main(args=argv, prog_name="farm", standalone_mode=False)
    except click.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx else "farm"
        click.echo(f"farm: error: {exc.format_message()} (see '{where} --help')", err=True)
        sys.exit(2)
    except click.ClickException as exc:
        click.echo(f"farm: error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except click.Abort:
        click.echo("farm: aborted", err=True)
        sys.exit(130)
