"""``farm retry-failed``: give what failed another go, chunks and enqueued items alike."""

from __future__ import annotations

from dataclasses import dataclass, field

from jobs import runs, settle, status
from jobs.runtime import Runtime


@dataclass
class Retried:
    """What ``retry_failed`` dispatched, and why each item left alone was not retried."""

    chunks: int = 0
    items: int = 0
    not_retried: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        """``{"chunks", "items", "not_retried"}`` (the last as a count)."""
        return {"chunks": self.chunks, "items": self.items,
                "not_retried": len(self.not_retried)}


def retry_failed(rt: Runtime, run_id: str | None = None) -> Retried:
    """Re-enqueue failed chunks with a fresh attempt budget, and every unfinished chunk that
    has no job (of ``run_id``, or of every run); without ``run_id`` also the failed enqueued
    items of every queue."""
    out = Retried(chunks=runs.retry_failed(rt, run_id))
    if not run_id:
        for queue in status.queue_names(rt.redis):
            n, why = settle.retry_failed(rt.redis, queue, rt.policy)
            out.items += n
            out.not_retried += why
    return out
