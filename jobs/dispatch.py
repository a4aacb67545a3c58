"""Putting chunk jobs of a run on its queue, now or later: at most one job per chunk.

A chunk travels as a queue item whose ID is ``<run>/<chunk>``, so the queue's
dedup index (``jobs.accounting``) holds it while a job carrying it is queued,
scheduled or running: dispatching a chunk that already has a live job writes
nothing, and housekeeping can safely dispatch every pending chunk that has none.
A chunk's job timeout follows the chunk's expected duration and doubles with
each attempt that ran out of time.
"""

from __future__ import annotations

from collections.abc import Iterable

import redis
from rq import get_current_job

from jobs.accounting import unheld
from jobs.queue import JOB_TIMEOUT, enqueue_items, enqueue_later

CHUNK_FUNCTION = "jobs.chunk.run_chunk"
MAX_TIMEOUT = 7 * 86400
ROWS_PER_SECOND_FLOOR = 100  # the slowest rate a chunk is expected to move rows at


def chunk_item(run_id: str, chunk_id: int) -> str:
    """A chunk's item ID on its queue: one in flight at a time."""
    return f"{run_id}/{chunk_id}"


def chunk_timeout(params: dict) -> int:
    """A run's first-attempt job timeout: its ``chunk_timeout`` parameter, else long enough
    for ``chunk_rows`` rows at the slowest expected rate (never under rq's default hour)."""
    if params.get("chunk_timeout"):
        return min(MAX_TIMEOUT, max(1, int(params["chunk_timeout"])))
    rows = int(params.get("chunk_rows") or 0)
    return min(MAX_TIMEOUT, max(JOB_TIMEOUT, rows // ROWS_PER_SECOND_FLOOR))


def attempt_timeout(params: dict, timeouts: int) -> int:
    """The job timeout after ``timeouts`` attempts ran out of time: doubled each time."""
    return min(MAX_TIMEOUT, chunk_timeout(params) * 2 ** max(0, timeouts))


def dispatch(conn: redis.Redis, run: dict, chunk_ids: Iterable[int]) -> int:
    """Enqueue one job for each of ``chunk_ids`` that no live job carries; returns how many."""
    items = [[chunk_item(run["run_id"], c), {"run_id": run["run_id"], "chunk_id": c}]
             for c in chunk_ids]
    options = {"timeout": chunk_timeout(run["params"])}
    return enqueue_items(conn, run["queue"], CHUNK_FUNCTION, items, batch=1,
                         options=options).enqueued


def dispatch_lost(conn: redis.Redis, run: dict, chunk_ids: list[int]) -> int:
    """Dispatch those of ``chunk_ids`` that have no live job (cheap to call on every chunk
    a run has pending: nothing is written for chunks already carried)."""
    ids = {chunk_item(run["run_id"], c): c for c in chunk_ids}
    return dispatch(conn, run, [ids[i] for i in unheld(conn, run["queue"], list(ids))])


def dispatch_later(conn: redis.Redis, run: dict, chunk_id: int, delay: float,
                   timeouts: int = 0) -> bool:
    """Schedule the chunk's next job ``delay`` seconds from now; called from inside the job
    that carries the chunk, the chunk moves to the new job. Returns False when another live
    job carries it (then that job will run it)."""
    current = get_current_job()
    kwargs = {"run_id": run["run_id"], "chunk_id": chunk_id}
    if timeouts:
        kwargs["timeouts"] = timeouts
    item = [chunk_item(run["run_id"], chunk_id), kwargs]
    return enqueue_later(conn, run["queue"], CHUNK_FUNCTION, [item], delay,
                         holder=current.id if current else "",
                         timeout=attempt_timeout(run["params"], timeouts)) is not None
