"""``farm enqueue``: stream a JSON-lines file of keyword arguments onto a queue."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import IO

import click
import orjson
from tqdm import tqdm

from jobs import enqueue_many
from jobs.policy import JobPolicy
from jobs.queue import JOB_RETRIES, JOB_TIMEOUT, check_function
from scripts.app import App
from scripts.options import ALLOW_MODULE, emit, farm_options
from shardfarm.errors import FatalError


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
@ALLOW_MODULE
@farm_options
def enqueue(app: App, queue: str, function: str, file_, batch: int, dedup: bool,
            id_key: str | None, job_timeout: int, retries: int,
            allow_modules: tuple[str, ...]) -> None:
    """Enqueue FUNCTION(**kwargs) on QUEUE for every line of --file.

    FUNCTION must be in a module allowed by FARM_JOB_MODULES (or --allow-module),
    as it must be for the workers. Streams the file (it is never read whole),
    writes in pipelined batches, and prints {"enqueued": n, "duplicates": m};
    an item already queued or running on QUEUE is a duplicate.
    """
    policy = JobPolicy.from_env(flags=allow_modules)
    check_function(function, policy)
    conn = app.settings.redis()
    name = getattr(file_, "name", "input")
    with tqdm(unit=" jobs", desc=f"enqueue {queue}", disable=not sys.stderr.isatty(),
              mininterval=0.5) as bar:
        res = enqueue_many(queue, function, _lines(file_, name), connection=conn, batch=batch,
                           dedup=dedup, id_key=id_key, progress=bar.update, policy=policy,
                           job_timeout=job_timeout, retries=retries)
    emit(res.as_dict())


def register(cli: click.Group) -> None:
    """Attach this module's commands."""
    cli.add_command(enqueue)
