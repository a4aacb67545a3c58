"""``farm workers`` and ``farm scale``: run and size the worker fleet."""

from __future__ import annotations

import shlex
import socket

import click
import redis

from jobs.policy import JobPolicy
from jobs.runs import DEFAULT_QUEUE
from jobs.status import queue_names, read_supervisors
from scripts.app import App
from scripts.options import ALLOW_MODULE, QueueList, emit, farm_options
from scripts.render import note
from shardfarm.errors import FarmError
from workers.supervisor import MAX_WORKERS, Supervisor, write_desired


@click.command("workers")
@click.option("--count", default=2, show_default=True, type=click.IntRange(0, MAX_WORKERS),
              help="Worker processes on this machine.")
@click.option("--burst", is_flag=True, help="Exit once the queues are empty.")
@click.option("--queues", default="farm", show_default=True, type=QueueList(),
              metavar="Q[,Q...]", help="Comma-separated queues.")
@click.option("--metrics-port", default=None, type=click.IntRange(1, 65535), metavar="PORT",
              help="Serve this supervisor's Prometheus metrics (job latency, workers by "
                   "state) on PORT.")
@click.option("--metrics-addr", default="127.0.0.1", show_default=True, metavar="ADDR",
              help="Address the metrics port listens on.")
@ALLOW_MODULE
@farm_options
def workers(app: App, count: int, burst: bool, queues: list[str], metrics_port: int | None,
            metrics_addr: str, allow_modules: tuple[str, ...]) -> None:
    """Run COUNT worker processes here, supervised.

    Workers run only the farm's own jobs and functions of the allowed module
    prefixes; any other job is failed unread and listed by 'farm failed'.
    SIGTERM: finish the jobs in hand and exit (twice: stop at once).
    SIGUSR1 / SIGUSR2: one worker more / fewer. 'farm scale N' from any machine
    sets the count every supervisor converges to (and overrides --count).
    """
    if burst and count == 0:
        raise click.UsageError("--burst with --count 0 would run nothing (give --count 1 or "
                               "more)")
    policy = JobPolicy.from_env(flags=allow_modules)
    _note_unused_queues(app, queues)
    sup = Supervisor(app.settings, count, queues, burst=burst,
                     policy=policy, metrics_port=metrics_port, metrics_addr=metrics_addr)
    if sup.run():
        raise FarmError("; ".join(_burst_problems(sup)))


def _note_unused_queues(app: App, queues: list[str]) -> None:
    """A ``note:`` naming the queues of ``--queues`` no job was ever queued on (a typo waits
    for ever); the farm's own queue is always a good one. Redis not answering is the
    supervisor's to report."""
    try:
        known = {*queue_names(app.settings.redis()), DEFAULT_QUEUE}
        unused = [q for q in queues if q not in known]
    except redis.RedisError:
        return
    if unused:
        note(f"no job was ever queued on {', '.join(map(repr, unused))} here: these workers "
             "wait until one is (check --queues; 'farm status' lists the queues in use)")


def _burst_problems(sup: Supervisor) -> list[str]:
    """What went wrong in a burst that exits 1: workers that ended badly, then what the
    workers ran that did not succeed."""
    out = []
    if sup.ended_badly:
        out.append(f"{len(sup.ended_badly)} worker(s) ended badly ("
                   f"{', '.join(sup.ended_badly[:5])}); a chunk one held is taken over when "
                   "its lease expires ('farm status', 'farm failed')")
    if sup.not_done:
        out.append(sup.not_done)
    return out


@click.command("scale")
@click.argument("count", type=click.IntRange(0, MAX_WORKERS), required=False)
@click.option("--host", default=None, help="Only the supervisor on this host (default: all).")
@click.option("--clear", is_flag=True, help="Remove the target: supervisors keep their count.")
@farm_options
def scale(app: App, count: int | None, host: str | None, clear: bool) -> None:
    """Set the desired worker count per supervisor; they converge within seconds."""
    if (count is None) == (not clear):
        raise click.UsageError("give either COUNT or --clear")
    conn = app.settings.redis()
    write_desired(conn, None if clear else count, host)
    emit({"desired": count, "host": host or "*", "from": socket.gethostname()})
    if not clear and (missing := _unserved(conn, host)):
        note(missing)


def _unserved(conn: redis.Redis, host: str | None) -> str | None:
    """What to tell an operator whose target no running supervisor takes (a host name
    mistyped, or no supervisor started yet); ``None`` when one does."""
    running = sorted({d["host"] for d in read_supervisors(conn)})
    if running and (host is None or host in running):
        return None
    where = f" on {host[:64]!r}" if host else ""
    clear = "farm scale --clear" + (f" --host {shlex.quote(host[:64])}" if host else "")
    return (f"no supervisor is running{where} (running: {', '.join(running[:10]) or 'none'}); "
            f"the target waits for one to start there ('{clear}' removes it)")


def register(cli: click.Group) -> None:
    """Attach this module's commands."""
    cli.add_command(workers)
    cli.add_command(scale)
