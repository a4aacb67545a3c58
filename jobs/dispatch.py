"""Putting chunk jobs of a run on its queue, now or later (duplicates are harmless)."""

from __future__ import annotations

from collections.abc import Iterable

import redis

from jobs.queue import enqueue_later, enqueue_many

CHUNK_FUNCTION = "jobs.chunk.run_chunk"


def dispatch(conn: redis.Redis, queue: str, run_id: str, chunk_ids: Iterable[int]) -> int:
    """Enqueue one job per chunk (no dedup: a chunk may be re-dispatched after Redis loss)."""
    items = ({"run_id": run_id, "chunk_id": c} for c in chunk_ids)
    return enqueue_many(queue, CHUNK_FUNCTION, items, connection=conn, batch=1,
                        dedup=False).enqueued


def dispatch_later(conn: redis.Redis, queue: str, run_id: str, chunk_id: int,
                   delay: float) -> None:
    """Schedule one chunk job ``delay`` seconds from now."""
    item = [f"{run_id}/{chunk_id}", {"run_id": run_id, "chunk_id": chunk_id}]
    enqueue_later(conn, queue, CHUNK_FUNCTION, [item], delay)
