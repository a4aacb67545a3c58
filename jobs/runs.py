"""Runs: create the chunks in the ledger and dispatch them; resume; wait with progress."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from jobs.dispatch import dispatch
from jobs.policy import ForbiddenJobError
from jobs.runtime import Runtime
from shardfarm.ledger import ChunkSpec

DEFAULT_QUEUE = "farm"


def start(rt: Runtime, kind: str, handler: str, chunks: Iterable[ChunkSpec],
          params: dict | None = None, queue: str = DEFAULT_QUEUE) -> str:
    """Record a run with all its chunks, then enqueue one job per chunk; returns the run ID."""
    refusal = rt.policy.handler_refusal(handler)
    if refusal:
        raise ForbiddenJobError(refusal)
    params = {**(params or {}), "handler": handler}
    run_id = rt.ledger.create_run(kind, queue, params, chunks)
    dispatch(rt.redis, queue, run_id, range(rt.ledger.run(run_id)["total_chunks"]))
    return run_id


def resume(rt: Runtime, run_id: str) -> int:
    """Enqueue again every chunk of the run that is not done (e.g. after Redis lost everything).

    Chunks still leased to a live worker are skipped by the worker that receives
    the duplicate; expired leases are taken over.
    """
    run = rt.ledger.run(run_id)
    rt.ledger.refresh_status(run_id)
    return dispatch(rt.redis, run["queue"], run_id, rt.ledger.unfinished(run_id))


def summary(rt: Runtime, run_id: str) -> dict:
    """The run's end-of-run JSON summary."""
    run = rt.ledger.run(run_id)
    kinds = {k["kind"]: k for k in rt.ledger.progress(run_id)}
    names = run["params"].get("kinds") or list(kinds)
    return {"run_id": run_id, "status": run["status"],
            "loaded": {n: kinds[n]["rows_written"] if n in kinds else 0 for n in names},
            "quarantined": {n: kinds[n]["rows_quarantined"] if n in kinds else 0 for n in names},
            "failed_chunks": sum(k["failed"] for k in kinds.values())}


def wait(rt: Runtime, run_id: str, on_tick: Callable[[list[dict]], None] | None = None,
         interval: float = 0.5, timeout: float | None = None) -> str:
    """Poll until the run is done or failed (or ``timeout``); returns the final status."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        status = rt.ledger.refresh_status(run_id)
        if on_tick:
            on_tick(rt.ledger.progress(run_id))
        if status in ("done", "failed"):
            return status
        if deadline is not None and time.monotonic() > deadline:
            return status
        time.sleep(interval)
