"""``farm``: one command for the whole farm. Every error is one line and a non-zero exit:
2 for a usage mistake (a bad flag, option value, date, table, cron expression or ID),
1 for everything else."""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click
import redis

from jobs.policy import add_operator_path
from shardfarm import log as farm_log
from shardfarm import tuning
from shardfarm.errors import FarmError, InvalidIdError, UsageError

# command -> the ``scripts`` module registering it, in the order an operator meets them
COMMANDS: dict[str, str] = {
    "demo": "cmd_demo", "shards": "cmd_shards", "legacy": "cmd_legacy", "migrate": "cmd_migrate",
    "verify": "cmd_migrate", "quarantine": "cmd_migrate", "reverse": "cmd_reverse",
    "rebalance": "cmd_reverse", "followers": "cmd_reverse", "feeds": "cmd_feeds",
    "export": "cmd_export", "cron": "cmd_export", "workers": "cmd_workers",
    "scale": "cmd_workers", "status": "cmd_runs", "resume": "cmd_runs", "pause": "cmd_runs",
    "unpause": "cmd_runs", "cancel": "cmd_runs", "sync": "cmd_sync", "cutover": "cmd_sync",
    "failed": "cmd_runs", "retry-failed": "cmd_runs", "enqueue": "cmd_queue",
    "dashboard": "cmd_dashboard", "id": "cmd_ids", "modshard": "cmd_ids",
    "mismatches": "cmd_migrate", "runs": "cmd_runs", "summary": "cmd_runs"}


class FarmGroup(click.Group):
    """A click group that turns ``FarmError`` into one line on stderr and an exit code, and
    imports a command's module only when that command runs (``farm sync`` does not load
    the demo, the dashboard or the worker supervisor)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        """Commands in the order an operator meets them, not alphabetical."""
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """The command, its module imported and registered on first use."""
        module = COMMANDS.get(cmd_name)
        if module is not None and cmd_name not in self.commands:
            importlib.import_module(f"scripts.{module}").register(self)
        return self.commands.get(cmd_name)

    def invoke(self, ctx: click.Context) -> Any:
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
            from shardfarm.bounds import redis_error_line  # pymysql only when needed
            click.echo(f"farm: error: {redis_error_line(exc)}", err=True)
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
    tuning.check_environment()  # a bad FARM_* value stops every command before it starts


def main(argv: list[str] | None = None) -> None:
    """Console entry point: usage errors, like every other error, are one line."""
    add_operator_path()  # commands load late: the farm's packages are found first
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
