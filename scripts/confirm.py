"""Destructive commands in one place: ``--dry-run`` says exactly what would be removed and
removes nothing; on a terminal the command asks first unless ``--yes``.

Off a terminal (scripts, CI, cron) nothing is asked: the flag that names the removal
(``--clean``, ``--replace``) is the consent, as with ``dropdb`` or ``rm -r``; ``--dry-run``
shows beforehand what it would do. A removal that follows a long operation and takes the
last copy of something (``shards move --drop-source``) is asked for before it starts and,
off a terminal, needs ``--yes`` too (``refuse_off_terminal``). Commands use ``DRY_RUN`` and
``YES`` as options and ``go_ahead`` before removing anything.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import click

from scripts.options import emit
from scripts.render import echo_lines
from shardfarm.errors import FatalError, UsageError

DRY_RUN = click.option("--dry-run", is_flag=True,
                       help="Say exactly what would be removed, remove nothing, exit 0.")
YES = click.option("--yes", "-y", is_flag=True,
                   help="Do not ask before removing (only a terminal is asked).")


class NotConfirmedError(FatalError):
    """The person at the terminal said no: nothing was removed (not retried)."""


def asks() -> bool:
    """Whether a person can answer: stdin and stderr are a terminal."""
    return sys.stdin.isatty() and sys.stderr.isatty()


def go_ahead(describe: Callable[[], tuple[list[str], dict]], *, dry_run: bool, yes: bool,
             question: str = "Remove all of this?", refuse_off_terminal: bool = False) -> bool:
    """Before a removal. ``describe()`` gives what would go, as lines and as JSON; it is only
    called when needed (it may count rows).

    With ``dry_run``: print the lines (off a terminal, the JSON as a last line too) and
    return False. On a terminal without ``yes``: show them and ask; ``NotConfirmedError``
    unless the answer is yes. Otherwise (or when nothing would go) return True at once;
    but with ``refuse_off_terminal``, off a terminal without ``yes``: ``UsageError``.
    """
    if not dry_run and not yes and not asks() and refuse_off_terminal:
        lines, _ = describe()
        raise UsageError(f"refusing to {'; '.join(lines)} without --yes (or see it first "
                         "with --dry-run)")
    if not dry_run and (yes or not asks()):
        return True
    lines, plan = describe()
    if dry_run:
        echo_lines(["dry run: nothing removed; without --dry-run this would:",
                    *(f"  {line}" for line in lines or ["remove nothing"])])
        if not sys.stdout.isatty():
            emit({"dry_run": True, "would_remove": plan})
        return False
    if not lines:
        return True
    click.echo("This will:", err=True)
    for line in lines:
        click.echo(f"  {line}", err=True)
    if not click.confirm(question, default=False, err=True):
        raise NotConfirmedError("not confirmed: nothing was removed")
    return True
