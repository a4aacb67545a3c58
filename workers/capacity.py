"""``farm shards move`` end to end: the copy run, then catch-up, freeze, verify and flip.

See ``loaders.capacity.move`` for the steps. A move that stops half way is run again
with the same command: the copy run of the same move (same range, target and map
version) is resumed instead of started again, and the catch-up fixes whatever
changed since; killed after the flip, running it again has the source copies record the
flipped version and thaws them.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from farmcore.runstate import CANCELLED
from jobs import runs
from jobs.runtime import Runtime
from loaders.capacity import copy as capcopy
from loaders.capacity import move as capmove
from loaders.capacity.movelock import MoveLock, moving
from shardfarm.errors import FatalError, first_line
from sharding.schema import shard_db
from workers.launch import Notice, _silent, warn_without_workers

Follow = Callable[[str], str]
KIND = "shardmove"


def _copy_run(rt: Runtime, p: capmove.MovePlan, max_lag: float | None) -> str:
    """The copy run of this move: an earlier one with the same params, or a new one."""
    for run_id in rt.ledger.runs(limit=50, kind=KIND):
        run = rt.ledger.run(run_id)
        if all(run["params"].get(k) == v for k, v in p.params.items()):
            if run["status"] != "done":
                runs.retry_failed(rt, run_id)
            return run_id
    extra = {"max_lag": max_lag, "lag_hosts": [p.slave]} if max_lag else {}  # it writes there
    return runs.start(rt, KIND, capcopy.HANDLER, p.chunks(), {**p.params, **extra})


def _flipped_plan(rt: Runtime, lo: int, hi: int, master: str, slave: str
                  ) -> tuple[str, capmove.MovePlan] | None:
    """The copy run and plan of this move, already flipped; ``None`` if no copy run of this
    move is known (the shards were on ``master`` all along)."""
    for run_id in rt.ledger.runs(limit=50, kind=KIND):
        run = rt.ledger.run(run_id)
        prm = run["params"]
        if (prm.get("range") == [lo, hi] and prm.get("sources")
                and prm.get("to") == f"{master}/{slave}" and run["status"] == "done"):
            p = capmove.MovePlan.of_params(prm)
            return None if rt.router.shardmap.version <= p.version else (run_id, p)
    return None


def _finish_flipped(rt: Runtime, lo: int, hi: int, master: str, slave: str
                    ) -> tuple[dict, capmove.MovePlan] | None:
    """The same move run again after its flip (killed before the sources recorded it): the
    source copies record the flipped version and are thawed. ``None`` if no copy run of
    this move is known."""
    found = _flipped_plan(rt, lo, hi, master, slave)
    if found is None:
        return None
    run_id, p = found
    recorded = capmove.record_flip(rt.router, p)
    return {"moved": [lo, hi], "to": f"{master}/{slave}", "version": p.version + 1,
            "run_id": run_id, "already_flipped": True, "sources_recorded": recorded}, p


def preview(rt: Runtime, lo: int, hi: int, master: str, slave: str, *,
            rows_per_range: int = capmove.ROWS_PER_RANGE, drop_source: bool = False) -> dict:
    """What ``move`` would do, changing nothing (``--dry-run``): its checks, where the shards
    are, the copy's chunks, the map version it would make, and with ``drop_source`` the
    source copies it would drop."""
    capmove.check_target(rt.router.shardmap, lo, hi, master, slave)
    doc: dict = {"dry_run": True, "would_move": [lo, hi], "to": f"{master}/{slave}"}
    found = (_flipped_plan(rt, lo, hi, master, slave)
             if capmove.flipped(rt.router, lo, hi, master) else None)
    if found is not None:
        p, doc = found[1], {**doc, "already_flipped": True, "run_id": found[0]}
    else:  # shards already on master with no move of ours to finish: plan refuses, as move does
        p = capmove.plan(rt.router, lo, hi, master, slave, rows_per_range)
        doc.update({"from": sorted(set(p.sources.values())), "chunks": len(p.chunks()),
                    "version": p.version + 1})
    if drop_source:
        doc["would_drop"] = [f"{p.sources[s]}:{shard_db(s)}" for s in range(p.lo, p.hi + 1)]
    return doc


def move(rt: Runtime, lo: int, hi: int, master: str, slave: str, *,
         rows_per_range: int = capmove.ROWS_PER_RANGE, follow: Follow | None = None,
         max_lag: float | None = None, notice: Notice = _silent) -> tuple[dict, capmove.MovePlan]:
    """Move shards ``lo..hi`` to ``master``/``slave``; returns the JSON summary and the plan.
    Refused at once (``MoveInProgressError``) while another move holds one of the shards.

    ``max_lag``: the copy's chunks wait while a slave lags more than that many seconds."""
    capmove.check_target(rt.router.shardmap, lo, hi, master, slave)
    with moving(rt.ledger.pool, lo, hi) as lock:
        return _move(rt, lo, hi, master, slave, rows_per_range, follow, max_lag, notice, lock)


def _move(rt: Runtime, lo: int, hi: int, master: str, slave: str, rows_per_range: int,
          follow: Follow | None, max_lag: float | None, notice: Notice, lock: MoveLock
          ) -> tuple[dict, capmove.MovePlan]:
    clock = [time.monotonic()]
    phases: dict[str, float] = {}

    def lap(name: str) -> None:
        now = time.monotonic()
        phases[name], clock[0] = round(now - clock[0], 3), now
    if capmove.flipped(rt.router, lo, hi, master):
        done = _finish_flipped(rt, lo, hi, master, slave)
        if done is not None:
            notice(f"shards {lo}-{hi} were already flipped to {master} by run {done[0]['run_id']}"
                   "; their source copies now record it")
            return done
    p = capmove.plan(rt.router, lo, hi, master, slave, rows_per_range)
    warn_without_workers(rt, notice)
    capmove.prepare(rt.router, p)
    lap("plan")
    run_id = _copy_run(rt, p, max_lag)
    status = follow(run_id) if follow else runs.wait(rt, run_id)
    lap("copy")
    if status != "done":
        why = ("was cancelled ('farm cancel')" if status == CANCELLED else
               f"ended {status}: see 'farm failed {run_id}'")
        raise FatalError(f"copy run {run_id} {why}; run the same move again to resume it")
    notice(f"copied by run {run_id}; catching up with the writes made meanwhile")
    lock.check("the catch-up, with nothing frozen or flipped")
    before, _ = capmove.catch_up(rt.router, p, check=lambda s, table: lock.check(
        f"the catch-up of {shard_db(s)}.{table}, with nothing frozen or flipped", s))
    lap("catch_up")
    lock.check("the freeze, with nothing frozen or flipped")
    capmove.freeze(rt.router, p, True)
    try:
        during, rows = capmove.catch_up(rt.router, p, strict=True, check=lambda s, table: (
            lock.check(f"the frozen catch-up of {shard_db(s)}.{table}, with the map not "
                       "flipped (the shards were thawed)", s)))
        lock.check("the flip, with the map not flipped (the shards were thawed)")
    except BaseException:
        capmove.freeze(rt.router, p, False)
        raise
    flipped = _flip(rt, p, notice)
    capmove.freeze(rt.router, p, False, flipped)
    lap("frozen")
    rt.router.source.refresh()
    return {"moved": [lo, hi], "to": f"{master}/{slave}", "version": flipped, "run_id": run_id,
            "rows": rows, "recopied_ranges": before + during,
            "frozen_seconds": phases["frozen"], "seconds": phases}, p


def _flip(rt: Runtime, p: capmove.MovePlan, notice: Notice) -> int:
    """Flip the map; the version the sources are to record. A flip that raised may have
    landed (its answer lost): the map in force says; while it cannot be read, the sources
    stay frozen, since thawing them without the flip's version would let writers that
    still route with the old map write where the shards no longer live."""
    spec, timeout = rt.settings.shardmap_spec, rt.settings.connect_timeout
    try:
        return capmove.flip(spec, p, timeout)
    except BaseException as exc:
        landed = capmove.flip_landed(spec, p, timeout)
        if landed is None:
            raise FatalError(f"the map flip of shards {p.lo}-{p.hi} may or may not have "
                             f"landed ({first_line(exc, 200)}) and the map cannot be read now: "
                             "their source copies stay frozen; run the same move again") from None
        if not landed:
            capmove.freeze(rt.router, p, False)
            raise
        notice(f"the map flip's answer was lost ({first_line(exc, 200)}), but it landed")
        return p.version + 1


def drop_sources(rt: Runtime, p: capmove.MovePlan, grace: float,
                 notice: Notice = _silent) -> list[str]:
    """After ``grace`` seconds (readers of the old map finish), drop the source copies
    (holding the shards' move locks, as ``move`` does, and checking the shard's before each
    DROP)."""
    if grace > 0:
        notice(f"dropping the source copies in {grace:g} s")
        time.sleep(grace)
    with moving(rt.ledger.pool, p.lo, p.hi) as lock:
        return capmove.drop_sources(rt.router, p, check=lambda s: lock.check(
            f"dropping {p.sources[s]}:{shard_db(s)} (the source copies dropped before it stay "
            "dropped; with --drop-source it drops the rest)", s))
