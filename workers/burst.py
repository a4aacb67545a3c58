"""What the workers of one ``farm workers --burst`` ran that did not succeed.

The supervisor hands each of its workers a Redis hash of its own (``FARM_BURST_KEY``,
``keys.burst_outcomes``). After each job a worker writes there what of it did not succeed,
from the job's notes (``jobs.tally``): a chunk or item that failed for good, a whole rq job
that failed, or one of them that failed an attempt and waits to be tried again; and it
removes what succeeded (a retry within the burst). When the burst ends the supervisor counts
the hash: the burst exits 0 only when it is empty. Only this burst's workers write to it, so
what other workers or earlier bursts failed is not counted.
"""

from __future__ import annotations

import logging
import os
import secrets
from collections import Counter

import redis

from farmcore import keys
from jobs.tally import DONE, FAILED, RETRYING
from shardfarm.bounds import wrong_type

log = logging.getLogger(__name__)
ENV_KEY = "FARM_BURST_KEY"
KEY_TTL = 86400  # seconds after a burst's last write (the supervisor deletes it at its end)
PLURAL = {"chunk": "chunks", "item": "items", "job": "jobs", "entry": "entries"}


def new_key(supervisor: str) -> str:
    """A fresh hash name for a burst of ``supervisor`` (``host:pid``)."""
    return keys.burst_outcomes(f"{supervisor}:{secrets.token_hex(4)}")


def record(conn: redis.Redis, ended: dict[str, tuple[str, str]]) -> None:
    """From a worker: write how a job's chunks, items and the job itself ended (``jobs.tally``)
    into its burst's hash, if its supervisor runs a burst."""
    key = os.environ.get(ENV_KEY)
    if not key or not ended:
        return
    bad = {k: f"{kind}:{outcome}" for k, (kind, outcome) in ended.items() if outcome != DONE}
    good = [k for k, (_, outcome) in ended.items() if outcome == DONE]
    pipe = conn.pipeline(transaction=False)
    if bad:
        pipe.hset(key, mapping=bad)
    if good:
        pipe.hdel(key, *good)
    pipe.expire(key, KEY_TTL)
    try:
        pipe.execute()
    except redis.ResponseError as exc:  # not a hash (written into Redis): the supervisor
        if not wrong_type(exc):  # says so. Any other refusal (READONLY, OOM) ends
            raise  # the worker: its burst then exits 1 (an outcome not noted is not a success)
        log.warning("could not note this job's end for the burst: %s is not a hash", key)


def count(conn: redis.Redis, key: str) -> Counter[tuple[str, str]] | None:
    """``(kind, outcome)`` -> how many of the burst's chunks, items and jobs ended so;
    ``None`` when the hash is not one (written into Redis by something else)."""
    found: Counter[tuple[str, str]] = Counter()
    try:
        for _, value in conn.hscan_iter(key, count=1000):
            kind, _, outcome = value.decode(errors="replace").partition(":")
            ok = kind in PLURAL and outcome in (FAILED, RETRYING)
            found[(kind, outcome) if ok else ("entry", FAILED)] += 1
    except redis.ResponseError as exc:  # not a hash; any other refusal (MASTERDOWN) is
        if not wrong_type(exc):  # an outage the supervisor waits out
            raise
        return None
    return found


def summary_line(counts: Counter[tuple[str, str]] | None, key: str) -> str | None:
    """One line of what did not succeed (``None``: everything the burst ran succeeded)."""
    if counts is None:
        return (f"cannot tell whether what this burst ran succeeded: {key} is not a hash "
                "(something else wrote it)")
    failed, waiting = _named(counts, FAILED), _named(counts, RETRYING)
    parts = [f"{failed} failed ('farm failed' lists them)"] if failed else []
    if waiting:
        verb = "waits" if sum(n for (_, o), n in counts.items() if o == RETRYING) == 1 else "wait"
        parts.append(f"{waiting} failed an attempt and {verb} to be tried again after this "
                     "burst ('farm status' shows what is pending)")
    return "of what this burst ran, " + "; ".join(parts) if parts else None


def _named(counts: Counter[tuple[str, str]], outcome: str) -> str:
    """``1 chunk and 2 items`` (empty: none)."""
    named = [f"{n:,} {kind if n == 1 else PLURAL[kind]}" for kind in PLURAL
             if (n := counts[(kind, outcome)])]
    return ", ".join(named[:-1]) + " and " + named[-1] if len(named) > 1 else "".join(named)
