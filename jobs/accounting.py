"""Items in flight, counted exactly: every change is one Lua script, so a crash at any
point leaves the item either queued or enqueueable, and no counter drifts.

Three moments of an item's life change the books:

- **commit** (enqueue, deferral, retry): the rq job's own writes — recorded from
  rq's ``enqueue_many`` / ``enqueue_at`` into a pipeline, never hand-built —
  run in the same script that checks and records the items' dedup entries
  (``keys.inflight``: item ID -> carrying job, a duplicate only while that job
  exists) and adds to the queued-items counter. Nothing is written when an item
  is already in flight; the caller drops it and commits the rest.
- **advance** (a batch's checkpoint): the job's resume point moves forward; the
  counter falls by exactly the distance moved, and the finished items' dedup
  entries go. A zombie running the same job again moves nothing twice.
- **settle** (an rq job that failed for good): removed from rq's failed
  registry once, its unfinished items recorded in ``farm failed`` with the
  reason, counted out and released.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from typing import Any

import redis
from redis.client import Pipeline
from redis.commands.core import Script

from jobs.farmjob import FarmJob
from shardfarm import keys

PROGRESS_TTL = 7 * 24 * 3600
MAX_RECORD_ARGS = 4000  # bytes of arguments kept in a failure record
JOB_PREFIX = FarmJob.redis_job_namespace_prefix

# KEYS: inflight, counter, failed items. ARGV: job id, rq job key prefix, items to count,
# mode ('add': refuse items in flight / 'move': re-point items held by ARGV[5]), holder,
# n ids, ids..., n commands, then per command: argc, args...
_COMMIT = Script(None, b"""
local jid, prefix, mode, holder = ARGV[1], ARGV[2], ARGV[4], ARGV[5]
local n = tonumber(ARGV[6])
if mode == 'add' then
  local dups = {}
  for i = 1, n do
    local h = redis.call('HGET', KEYS[1], ARGV[6 + i])
    if h and redis.call('EXISTS', prefix .. h) == 1 then dups[#dups + 1] = ARGV[6 + i] end
  end
  if #dups > 0 then return dups end
end
for i = 1, n do
  local id = ARGV[6 + i]
  if mode == 'add' or redis.call('HGET', KEYS[1], id) == holder then
    redis.call('HSET', KEYS[1], id, jid)
  end
  if mode == 'add' then redis.call('HDEL', KEYS[3], id) end
end
local p = 7 + n
for c = 1, tonumber(ARGV[p]) do
  local argc = tonumber(ARGV[p + 1])
  redis.call(unpack(ARGV, p + 2, p + 1 + argc))
  p = p + 1 + argc
end
redis.call('INCRBY', KEYS[2], ARGV[3])
return {}
""")

# KEYS: progress, counter, inflight. ARGV: job id, new progress, ttl, ids to release...
_ADVANCE = Script(None, b"""
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
local new = tonumber(ARGV[2])
if new <= cur then return 0 end
redis.call('DECRBY', KEYS[2], new - cur)
redis.call('SET', KEYS[1], new, 'EX', ARGV[3])
for i = 4, #ARGV do
  if redis.call('HGET', KEYS[3], ARGV[i]) == ARGV[1] then redis.call('HDEL', KEYS[3], ARGV[i]) end
end
return new - cur
""")

# KEYS: rq failed registry, progress, counter, inflight, failed items.
# ARGV: job id, items the job counts, ttl, n item records, (id, record) per item in order,
# then (id, record) pairs always written.
_SETTLE = Script(None, b"""
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then return 0 end
local cur = tonumber(redis.call('GET', KEYS[2]) or '0')
local total = tonumber(ARGV[2])
if total > cur then
  redis.call('DECRBY', KEYS[3], total - cur)
  redis.call('SET', KEYS[2], total, 'EX', ARGV[3])
end
local n = tonumber(ARGV[4])
for i = 1, n do
  local id = ARGV[3 + 2 * i]
  if i > cur then
    redis.call('HSET', KEYS[5], id, ARGV[4 + 2 * i])
    if redis.call('HGET', KEYS[4], id) == ARGV[1] then redis.call('HDEL', KEYS[4], id) end
  end
end
for i = 5 + 2 * n, #ARGV, 2 do redis.call('HSET', KEYS[5], ARGV[i], ARGV[i + 1]) end
return 1
""")


def flatten(commands: Sequence[tuple]) -> list:
    """Recorded pipeline commands as ``[count, argc, args..., argc, args...]``."""
    out: list = [len(commands)]
    for args in commands:
        out.append(len(args))
        out.extend(args)
    return out


def commit(conn: redis.Redis, queue: str, job_id: str, commands: Sequence[tuple],
           ids: Sequence[str], count: int, *, move_from: str | None = None,
           pipe: Pipeline | None = None) -> Any:
    """Run a job's recorded writes if none of ``ids`` is in flight; returns the duplicates.

    With ``move_from``, ids held by that job are re-pointed to ``job_id`` instead (a
    deferral keeps its items in flight). With ``pipe`` the call is queued on it.
    """
    mode, holder = ("move", move_from) if move_from else ("add", "")
    args = [job_id, JOB_PREFIX, count, mode, holder, len(ids), *ids, *flatten(commands)]
    return _COMMIT(keys=[keys.inflight(queue), keys.items_queued(queue), keys.failed_items(queue)],
                   args=args, client=conn if pipe is None else pipe)


def advance(conn: redis.Redis, queue: str, job_id: str, progress: int,
            released: Iterable[str]) -> int:
    """Move a job's resume point to ``progress``; returns how far it actually moved."""
    return int(_ADVANCE(
        keys=[keys.item_progress(job_id), keys.items_queued(queue), keys.inflight(queue)],
        args=[job_id, progress, PROGRESS_TTL, *released], client=conn))


def progress(conn: redis.Redis, job_id: str) -> int:
    """How many of a job's items are behind its resume point."""
    return int(conn.get(keys.item_progress(job_id)) or 0)


def settle(conn: redis.Redis, queue: str, failed_registry: str, job_id: str, total: int,
           item_records: Sequence[tuple[str, str]],
           extra_records: Sequence[tuple[str, str]] = ()) -> bool:
    """Take a failed rq job out of ``failed_registry`` and into ``farm failed`` (once)."""
    args: list = [job_id, total, PROGRESS_TTL, len(item_records)]
    for pair in (*item_records, *extra_records):
        args.extend(pair)
    return bool(_SETTLE(
        keys=[failed_registry, keys.item_progress(job_id), keys.items_queued(queue),
              keys.inflight(queue), keys.failed_items(queue)], args=args, client=conn))


def failure(function: object, kwargs: object, error: str, *, attempts: int = 0,
            job_id: str = "") -> str:
    """One ``farm failed`` record (JSON): what was called, with what, and why it stopped.

    Arguments larger than ``MAX_RECORD_ARGS`` bytes are kept as a truncated text."""
    args = kwargs
    try:
        text = json.dumps(kwargs)
    except (TypeError, ValueError):
        text, args = repr(kwargs), None
    if args is None or len(text) > MAX_RECORD_ARGS:
        args = {"_truncated": text[:MAX_RECORD_ARGS]}
    return json.dumps({"function": str(function)[:200], "kwargs": args, "attempts": attempts,
                       "error": error[:1000], "job": job_id, "at": time.time()})
