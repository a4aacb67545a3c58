"""The rq entry point of every run's chunks: claim, run the run's handler, finish or fail."""

from __future__ import annotations

from jobs import lifecycle, runtime


def run_chunk(run_id: str, chunk_id: int, timeouts: int = 0) -> None:
    """Run chunk ``chunk_id`` of ``run_id``; safe to deliver twice or to a zombie.
    ``timeouts``: how many earlier attempts ran out of time."""
    lifecycle.execute(runtime.get(), run_id, chunk_id, timeouts)
