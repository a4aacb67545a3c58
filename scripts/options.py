"""The options every ``farm`` command shares, from one decorator: each flag, when given,
overrides its ``FARM_*`` environment variable."""

from __future__ import annotations

import functools
import json
import math
import sys
from collections.abc import Callable

import click

from jobs.policy import ForbiddenJobError, parse_modules
from scripts.app import App
from shardfarm.errors import UsageError
from shardfarm.lists import names, queues
from shardfarm.settings import FLAGS, Settings

SHARED = [(FLAGS[env], env, help_) for env, help_ in [
    ("FARM_REDIS_URL", "Redis for queues, worker registry and feeds."),
    ("FARM_CONTROL_DSN", "Control database: runs, chunk ledger, quarantine."),
    ("FARM_LEGACY_DSN", "Legacy source database."),
    ("FARM_SHARDMAP", "Shard map file or zk://host:port/path (default: demo map)."),
    ("FARM_EXPORT_URL", "Export destination: s3://bucket/prefix or file:///dir."),
]]


class RunId(click.ParamType):
    """A run ID given to ``--run``: an empty one (``--run "$RUN"`` with the variable unset) is
    refused in one line (exit 2), not taken for "every run" or "the latest"."""

    name = "run_id"

    def convert(self, value: object, param: click.Parameter | None,
                ctx: click.Context | None) -> str:
        """The run ID; ``UsageError`` naming the option when it is empty."""
        text = str(value)
        if not text.strip():
            what = param.opts[0] if param else "--run"
            raise UsageError(f"bad {what} {text!r}: the run ID is empty (give one: 'farm "
                             f"runs' lists them; or leave {what} out)")
        return text


def run_option(help_: str) -> Callable:
    """The ``--run RUN_ID`` option of a command (``RunId``: never empty)."""
    return click.option("--run", "run_id", default=None, type=RunId(), help=help_)


class CommaList(click.ParamType):
    """A comma-separated option value (``--tables a,b``) as a list of names: the one parser
    of such options, so an empty list (``''``, ``','``) or an empty item (``'a,,b'``) is
    refused in one line (exit 2) instead of meaning "everything" or "nothing"."""

    name = "list"

    def convert(self, value: object, param: click.Parameter | None,
                ctx: click.Context | None) -> list[str]:
        """The list of names; ``UsageError`` naming the option when one is missing."""
        if isinstance(value, list):
            return value
        return names(str(value), param.opts[0] if param else "list")


class QueueList(CommaList):
    """``--queues Q1,Q2``: a ``CommaList`` of queue names (one word each, ``lists.queue``)."""

    def convert(self, value: object, param: click.Parameter | None,
                ctx: click.Context | None) -> list[str]:
        """The queue names; ``UsageError`` naming the option for a bad one."""
        if isinstance(value, list):
            return value
        return queues(str(value), param.opts[0] if param else "--queues")


MAX_SECONDS = 7 * 86400.0  # a week: what any wait, grace or lag limit of a command may be


class Seconds(click.FloatRange):
    """A number of seconds from ``min`` to ``max`` (default a week): ``nan`` passes every
    comparison of a plain ``FloatRange`` (a grace skipped, a wait never ending), ``inf``
    overflows ``time.sleep`` and JSON: both are refused like any bad value (exit 2)."""

    name = "number of seconds"

    def __init__(self, min: float = 0, max: float = MAX_SECONDS,
                 min_open: bool = False) -> None:
        super().__init__(min=min, max=max, min_open=min_open)

    def convert(self, value: object, param: click.Parameter | None,
                ctx: click.Context | None) -> float:
        """The value as a float; a usage error for ``nan`` or one out of range."""
        seconds = float(super(click.FloatRange, self).convert(value, param, ctx))
        if math.isnan(seconds):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        return float(super().convert(seconds, param, ctx))


def _prefixes(_ctx: click.Context, _param: click.Parameter, groups: tuple) -> tuple[str, ...]:
    """``--allow-module`` values as one tuple of prefixes; a malformed one is a usage
    mistake (exit 2), as in ``FARM_JOB_MODULES`` it is a configuration one."""
    prefixes = tuple(prefix for group in groups for prefix in group)
    for prefix in prefixes:
        try:
            parse_modules([prefix])
        except ForbiddenJobError:
            raise UsageError(f"bad --allow-module {prefix[:80]!r} (expected dotted names such "
                             "as 'mycompany.jobs')") from None
    return prefixes


ALLOW_MODULE = click.option(
    "--allow-module", "allow_modules", multiple=True, metavar="PREFIX[,PREFIX]",
    type=CommaList(), callback=_prefixes,
    help="Module prefixes whose functions workers may run, besides the farm's own; "
         "replaces FARM_JOB_MODULES when given. [env: FARM_JOB_MODULES]")


MAX_LAG = click.option(
    "--max-lag", type=Seconds(min=0, min_open=True), default=None, metavar="SECONDS",
    help="The run's chunks wait while a slave of a shard it writes lags more than this "
         "(farm status says THROTTLED, with the host and its lag).")


AS_JSON = click.option(
    "--json", "as_json", is_flag=True,
    help="Print the JSON summary line even on a terminal (off a terminal it always is).")


def farm_options(fn: Callable) -> Callable:
    """Add the shared connection options and pass a ready ``App`` as the first argument."""
    @functools.wraps(fn)
    def wrapper(*args: object, **kwargs: object) -> object:
        """Build the ``App`` from the shared options, run the command, release the ``App``."""
        overrides = {env: kwargs.pop(flag[2:].replace("-", "_")) for flag, env, _ in SHARED}
        app = App(Settings.from_env(**overrides))
        try:
            return fn(app, *args, **kwargs)
        finally:
            app.close()
    return shared_flags(wrapper)


def shared_flags(fn: Callable) -> Callable:
    """Only the shared connection flags (``--redis-url`` …), passed on as keyword arguments
    (``farm_options`` turns them into an ``App``; a command group passes them down)."""
    for flag, env, help_ in reversed(SHARED):
        fn = click.option(flag, default=None, metavar="URL" if "url" in flag else "DSN"
                          if "dsn" in flag else "PATH", help=f"{help_} [env: {env}]")(fn)
    return fn


def emit(obj: object) -> None:
    """Print one JSON line on stdout."""
    click.echo(json.dumps(obj, ensure_ascii=False, sort_keys=False))
    sys.stdout.flush()
