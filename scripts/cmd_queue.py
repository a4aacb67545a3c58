"""``farm enqueue``: stream a JSON-lines file of keyword arguments onto a queue."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import IO

import click
import orjson
import redis
from tqdm import tqdm

from jobs import enqueue_many
from jobs.itemwait import ItemsProgress, ItemWatch
from jobs.policy import JobPolicy
from jobs.queue import JOB_RETRIES, JOB_TIMEOUT, check_function
from scripts.app import App
from scripts.bars import LiveLines, bar
from scripts.follow import Unserved
from scripts.options import ALLOW_MODULE, AS_JSON, emit, farm_options
from scripts.summaries import for_people
from shardfarm import lists
from shardfarm.errors import FatalError, UsageError


def _lines(stream: IO[bytes], name: str) -> Iterator[dict]:
    """Parse one JSON object per line, lazily; a bad line is one clear error."""
    for n, line in enumerate(stream, 1):
        if not line.strip():
            continue
        try:
            yield orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise FatalError(f"{name} line {n}: not valid JSON ({exc})") from None


@click.command("enqueue")
@click.argument("queue")
@click.argument("function", metavar="DOTTED.FUNCTION")
@click.option("--file", "file_", required=True, type=click.File("rb"),
              help="JSON lines, one object of keyword arguments per line ('-' for stdin).")
@click.option("--batch", default=100, show_default=True, type=click.IntRange(1, 10_000),
              help="Items per rq job (use 1 when each item is seconds of work).")
@click.option("--dedup/--no-dedup", default=True, show_default=True,
              help="Skip items whose job ID is queued or running on this queue.")
@click.option("--id-key", default=None, metavar="ARG",
              help="Use this argument's value as the job ID (default: hash of the arguments).")
@click.option("--timeout", "job_timeout", default=JOB_TIMEOUT, show_default=True,
              type=click.IntRange(1, 7 * 86400), metavar="SECONDS",
              help="Longest an rq job (a batch of items) may run.")
@click.option("--retries", default=JOB_RETRIES, show_default=True,
              type=click.IntRange(0, JOB_RETRIES),
              help="Times a batch is tried again after a crash or timeout (after 5, 30, 120 s);"
                   " then its unfinished items go to 'farm failed'.")
@click.option("--wait", is_flag=True,
              help="Wait until every item finished (workers ran it or it failed); exit 1 if "
                   "any failed ('farm failed' lists them).")
@ALLOW_MODULE
@AS_JSON
@farm_options
def enqueue(app: App, queue: str, function: str, file_, batch: int, dedup: bool,
            id_key: str | None, job_timeout: int, retries: int, wait: bool,
            allow_modules: tuple[str, ...], as_json: bool) -> None:
    """Enqueue FUNCTION(**kwargs) on QUEUE for every line of --file.

    FUNCTION must be in a module allowed by FARM_JOB_MODULES (or --allow-module),
    as it must be for the workers. Streams the file (it is never read whole),
    writes in pipelined batches, and prints {"enqueued": n, "duplicates": m}
    (a line for a person on a terminal); an item already queued or running on
    QUEUE is a duplicate. With --wait it then shows the items finishing and adds
    "done" and "failed".
    """
    lists.queue(queue)
    if wait and not dedup:
        raise UsageError("--wait follows items by their dedup entries: drop --no-dedup")
    policy = JobPolicy.from_env(flags=allow_modules)
    check_function(function, policy)
    conn = app.settings.redis()
    watch = ItemWatch(conn, queue)
    name = getattr(file_, "name", "input")
    with tqdm(unit=" items", desc=f"enqueue {queue}", disable=not sys.stderr.isatty(),
              mininterval=0.5) as progress:
        res = enqueue_many(queue, function, _lines(file_, name), connection=conn, batch=batch,
                           dedup=dedup, id_key=id_key, progress=progress.update, policy=policy,
                           job_timeout=job_timeout, retries=retries,
                           on_ids=watch.add if wait else None)
    doc = res.as_dict()
    if wait:
        try:
            done = _wait_items(watch, queue, conn)
        except KeyboardInterrupt:  # the items stay queued: say so, with what was enqueued
            _report(doc, queue, as_json)
            click.echo(f"farm: stopped waiting; the items stay queued on {queue} ('farm "
                       "status' shows the queue, 'farm failed' any that fail)", err=True)
            sys.exit(130)
        doc.update(done=done.done, failed=done.failed)
    _report(doc, queue, as_json)
    if doc.get("failed"):
        click.echo(f"farm: error: {doc['failed']:,} item(s) failed: 'farm failed' lists them "
                   "with their arguments and reasons", err=True)
        sys.exit(1)


def _wait_items(watch: ItemWatch, queue: str, conn: redis.Redis, every: float = 0.5
                ) -> ItemsProgress:
    """Poll the items until all finished, drawing a line of them on a terminal (and saying
    so if no worker serves the queue: ``Unserved``)."""
    live, t0 = LiveLines(), time.monotonic()
    unserved = Unserved(conn, queue, live)
    while True:
        p = watch.poll()
        finished = p.done + p.failed
        rate = finished / max(time.monotonic() - t0, 1e-3)
        live.draw([f"{queue}: {bar(finished / p.total if p.total else 1.0)} {finished:,}/"
                   f"{p.total:,} items finished" + (f" · {p.failed:,} failed" if p.failed
                                                    else "") + f" · {rate:,.0f} items/s"])
        if p.finished:
            live.close()
            return p
        unserved()
        time.sleep(every)


def _report(doc: dict, queue: str, as_json: bool) -> None:
    """The JSON line, or a line for a person at a terminal."""
    if not for_people(as_json):
        emit(doc)
        return
    line = f"enqueued {doc['enqueued']:,} item(s) on {queue} ({doc['duplicates']:,} duplicate(s))"
    if "done" in doc:
        line += f"; {doc['done']:,} done, {doc['failed']:,} failed"
    click.echo(line)


def register(cli: click.Group) -> None:
    """Attach this module's commands."""
    cli.add_command(enqueue)
