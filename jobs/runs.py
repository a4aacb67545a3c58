"""Runs: create the chunks in the ledger and dispatch them; resume; wait with progress."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from farmcore.ledger import ChunkSpec
from farmcore.progress import RunProgress, read_progress
from farmcore.runstate import DONE, has_ended
from jobs.dispatch import dispatch, dispatch_lost
from jobs.policy import ForbiddenJobError
from jobs.runtime import Runtime

DEFAULT_QUEUE = "farm"


def start(rt: Runtime, kind: str, handler: str, chunks: Iterable[ChunkSpec],
          params: dict | None = None, queue: str = DEFAULT_QUEUE) -> str:
    """Record a run with all its chunks, then enqueue one job per chunk; returns the run ID."""
    refusal = rt.policy.handler_refusal(handler)
    if refusal:
        raise ForbiddenJobError(refusal)
    params = {**(params or {}), "handler": handler}
    run_id = rt.ledger.create_run(kind, queue, params, chunks)
    run = rt.ledger.run(run_id)
    dispatch(rt.redis, run, range(run["total_chunks"]))
    return run_id


def resume(rt: Runtime, run_id: str) -> int:
    """Enqueue every unfinished chunk of the run that has no live job (e.g. after Redis lost
    everything); returns how many. A paused run gets none: unpausing resumes it.

    Chunks still leased to a live worker keep their job; expired leases are taken over.
    """
    run = rt.ledger.run(run_id)
    rt.ledger.refresh_status(run_id)
    if run["paused"]:
        return 0
    return dispatch_lost(rt.redis, run, rt.ledger.unfinished(run_id))


def unpause(rt: Runtime, run_id: str) -> int:
    """Let workers take the run's chunks again; each unfinished chunk is dispatched once."""
    rt.ledger.set_paused(run_id, False)
    return resume(rt, run_id)


def retry_failed(rt: Runtime, run_id: str | None = None) -> int:
    """Failed chunks back to pending with a fresh attempt budget, then every unfinished chunk
    without a live job dispatched (of ``run_id``, or of every unfinished run); returns how
    many chunks were dispatched."""
    run_ids = [run_id] if run_id else rt.ledger.runs(limit=1000, unfinished=True)
    n = 0
    for rid in run_ids:
        rt.ledger.reset_failed(rid, cancelled=bool(run_id))  # all runs: not a cancelled one
        n += resume(rt, rid)
    return n


def summary(rt: Runtime, run_id: str) -> dict:
    """The run's end-of-run JSON summary."""
    run = rt.ledger.run(run_id)
    kinds = {k["kind"]: k for k in rt.ledger.progress(run_id)}
    names = run["params"].get("kinds") or list(kinds)
    if run["kind"] == "verify":
        return _verify_summary(rt, run, kinds, names)
    doc = {"run_id": run_id, "status": run["status"],
           "loaded": {n: kinds[n]["rows_written"] if n in kinds else 0 for n in names},
           "quarantined": {n: kinds[n]["rows_quarantined"] if n in kinds else 0 for n in names},
           "failed_chunks": sum(k["failed"] for k in kinds.values())}
    if run["kind"] == "export":
        doc["skipped"] = _unchanged_parts(rt, run_id, names)
    elif run["kind"] == "rebalance":
        doc["boards"] = _boards_moved(rt, run_id)
    return doc


def _verify_summary(rt: Runtime, run: dict, kinds: dict[str, dict], names: list[str]) -> dict:
    """A verify run's summary: rows checked per table and mismatches found (not "loaded")."""
    return {"run_id": run["run_id"], "of_run": run["params"].get("of_run"),
            "status": run["status"],
            "checked": {n: kinds[n]["rows_written"] if n in kinds else 0 for n in names},
            "mismatches": rt.ledger.mismatches.of_run(run["run_id"], limit=0)[0],
            "failed_chunks": sum(k["failed"] for k in kinds.values())}


def ended_well(doc: dict) -> bool:
    """Whether a run's summary says it ended well: every chunk done and, for a verify run,
    no mismatch (what a command that waited for it exits 0 on)."""
    return doc["status"] == DONE and not doc.get("mismatches")


def _unchanged_parts(rt: Runtime, run_id: str, tables: list[str]) -> dict[str, int]:
    """Per table, the parts an export found intact and left as they were."""
    out = dict.fromkeys(tables, 0)
    for c in rt.ledger.chunk_counts(run_id):
        if c.get("skipped") and c.get("table") in out:  # a chunk covers many parts
            out[c["table"]] += int(c["skipped"])
    return out


def _boards_moved(rt: Runtime, run_id: str) -> list[dict]:
    """Each board a rebalance took to ``cleaned``, with how many shards now hold it."""
    return sorted(({"board": c["board"], "shards": len(c["shards"])}
                   for c in rt.ledger.chunk_counts(run_id) if "board" in c),
                  key=lambda b: b["board"])


def wait(rt: Runtime, run_id: str, on_tick: Callable[[RunProgress], None] | None = None,
         interval: float = 0.2, timeout: float | None = None) -> str:
    """Poll until the run has ended (done, failed or cancelled) or ``timeout``, passing
    ``on_tick`` the run's progress each time; returns the final status. Polls every
    ``interval`` seconds, or three times as long as the last poll took (a run of a million
    chunks)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        began = time.monotonic()
        status = rt.ledger.refresh_status(run_id)
        if on_tick:
            on_tick(read_progress(rt.ledger, run_id))
        if has_ended(status):
            return status
        if deadline is not None and time.monotonic() > deadline:
            return status
        time.sleep(max(interval, 3 * (time.monotonic() - began)))
