"""Items in flight, counted exactly: every change is one Lua script, so a crash at any
point leaves the item either queued or enqueueable, and no counter drifts.

Three moments of an item's life change the books:

- **commit** (enqueue, deferral, retry): the rq job's own writes — recorded from
  rq's ``enqueue_many`` / ``enqueue_at`` into a pipeline, never hand-built —
  run in the same script that checks and records the items' dedup entries
  (``keys.inflight``: item ID -> carrying job, a duplicate only while that job
  exists; spread over 65,536 small hashes) and adds to the queued-items
  counter. Nothing is written when an item is already in flight; the caller
  drops it and commits the rest.
- **advance** (a batch's checkpoint): the job's resume point moves forward; the
  counter falls by exactly the distance moved, and the finished items' dedup
  entries go. At the end the job is marked done in rq's own hash of it
  (``farm_done``) and its resume point dropped: a zombie running the same job
  again moves nothing twice, and nothing is left behind.
- **settle** (an rq job that failed for good): removed from rq's failed
  registry once, its unfinished items recorded in ``farm failed`` with the
  reason, counted out and released.
- **reap** (``jobs.lost``: a job whose rq hash is gone or is not a hash: deleted,
  evicted, overwritten, a partial restore): its unfinished items are counted out, those
  whose dedup entry still names it are recorded in ``farm failed`` ("job data lost or
  overwritten in Redis") and released, and the rest, whose IDs went with the job, are
  one record of the job saying how many were lost. A job reaped that runs after all counts nothing
  again and takes back the reap's records of what it ran (``advance``).

Which jobs hold counted items, and how many, is ``keys.job_items`` (job ID -> items),
written by commit and removed by whichever of advance (at the end), settle or reap
comes first: that entry is what makes each job count out once, whatever races.
"""

from __future__ import annotations

import json
import time
import zlib
from collections.abc import Iterable, Sequence
from typing import Any

import redis
from redis.client import Pipeline
from redis.commands.core import Script

from farmcore import keys
from jobs.farmjob import FarmJob

DEDUP_BUCKETS = 1 << 16
MAX_RECORD_ARGS = 4000  # bytes of arguments kept in a failure record
JOB_PREFIX = FarmJob.redis_job_namespace_prefix

# Keys read back as what the farm writes there; whatever else anyone wrote is read as nothing,
# and dropped before the first write (never a script that fails half way: Redis keeps the
# writes before an error, so an item would be queued uncounted, or settled unrecorded).
# holder: the job an item's dedup entry names (nil: none, or the bucket is not a hash);
# hashes: each key that is not a hash (it holds no entry) is deleted; counter: the
# items-queued counter as INCRBY/DECRBY take it, else deleted (it starts again from 0).
_SAFE = b"""
local function holder(bucket, id)
  if redis.call('TYPE', bucket).ok ~= 'hash' then return nil end
  return redis.call('HGET', bucket, id)
end
local function hashes(...)
  for _, key in ipairs({...}) do
    local t = redis.call('TYPE', key).ok
    if t ~= 'none' and t ~= 'hash' then redis.call('DEL', key) end
  end
end
local function counter(key)
  local t = redis.call('TYPE', key).ok
  if t == 'none' then return end
  local v = t == 'string' and redis.call('GET', key) or ''
  if #v > 15 or not string.match(v, '^%-?%d+$') then redis.call('DEL', key) end
end
"""

# Lua, shared with ``jobs.lost``: a job's entry in keys.job_items and its progress as
# numbers; nil when what is stored is not a count (whoever can write to Redis must not make
# a script fail on it for good). A resume point that is not a string, not a count, or past
# the job's items is 0: the items run again (they are idempotent), never skipped unrecorded.
COUNT_LUA = b"""
local function count(v)
  local x = tonumber(v)
  if x and x >= 0 and x < 2 ^ 53 and x == math.floor(x) then return x end
  return nil
end
local function resume_point(key, limit)
  if redis.call('TYPE', key).ok ~= 'string' then return 0 end
  local x = count(redis.call('GET', key))
  if x and x <= limit then return x end
  return 0
end
""" + _SAFE

# KEYS: counter, failed items, jobs holding items. ARGV: job id, rq job key prefix, items to
# count, holder (the job the items come from, or ''), n ids, (dedup bucket, id) per id, n
# commands, then per command: argc, args... An item is a duplicate while a live job (a hash)
# other than the holder carries it; otherwise its entry (re)points to the new job. Nothing is
# written if any is a duplicate.
_COMMIT = Script(None, _SAFE + b"""
local jid, prefix, from = ARGV[1], ARGV[2], ARGV[4]
local n = tonumber(ARGV[5])
local dups = {}
for i = 1, n do
  hashes(ARGV[4 + 2 * i])
  local h = redis.call('HGET', ARGV[4 + 2 * i], ARGV[5 + 2 * i])
  if h and h ~= from and redis.call('TYPE', prefix .. h).ok == 'hash' then
    dups[#dups + 1] = ARGV[5 + 2 * i]
  end
end
if #dups > 0 then return dups end
counter(KEYS[1])
hashes(KEYS[2], KEYS[3])
for i = 1, n do
  redis.call('HSET', ARGV[4 + 2 * i], ARGV[5 + 2 * i], jid)
  if from == '' then redis.call('HDEL', KEYS[2], ARGV[5 + 2 * i]) end
end
local p = 6 + 2 * n
for c = 1, tonumber(ARGV[p]) do
  local argc = tonumber(ARGV[p + 1])
  redis.call(unpack(ARGV, p + 2, p + 1 + argc))
  p = p + 1 + argc
end
redis.call('INCRBY', KEYS[1], ARGV[3])
redis.call('HSET', KEYS[3], jid, ARGV[3])
return {}
""")

# Removes the record ``failed[field]`` if it is the reap's record of job ``jid`` (its error
# text is ``text``, or starts with it when ``prefix``): the job ran after all. Records that
# are not the reap's JSON, or a key that is not a hash, are left as they are.
_UNLOST = b"""
local function unlost(failed, field, jid, text, prefix)
  if redis.call('TYPE', failed).ok ~= 'hash' then return end
  local rec = redis.call('HGET', failed, field)
  if not rec then return end
  local ok, doc = pcall(cjson.decode, rec)
  if ok and type(doc) == 'table' and doc.job == jid and type(doc.error) == 'string' and
      (doc.error == text or (prefix and string.sub(doc.error, 1, #text) == text)) then
    redis.call('HDEL', failed, field)
  end
end
"""

# KEYS: progress, counter, rq job, jobs holding items, failed items. ARGV: job id, new
# progress, items in the job, the reap's item text, the reap's job text, (dedup bucket, id)
# pairs to release... Only a job that still holds counted items (its entry in KEYS[4]) and is
# a hash not marked done moves the counter: a zombie, or a job whose items were settled or
# reaped meanwhile, cannot count twice. The progress has no expiry while the job counts items:
# it lives exactly as long as the job's entry (whatever removes the entry, the end of advance,
# settle or reap, deletes it), however long the job waits half done. A job reaped (its hash
# looked gone) that runs after all (its hash back, or its worker still at it) counts nothing
# but is followed as any other: its progress kept (a week at most: no entry governs it), done
# at the end, and the reap's 'lost' records of the items it released (and at the end its
# 'IDs unknown' record) removed: those items ran. Whatever else was written into these keys
# is read as nothing (``COUNT_LUA``, ``_SAFE``) before the first write.
_ADVANCE = Script(None, COUNT_LUA + _UNLOST + b"""
local jid, new, total = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local job = redis.call('TYPE', KEYS[3]).ok == 'hash'
if job and redis.call('HEXISTS', KEYS[3], 'farm_done') == 1 then return 0 end
local counted, moved = false, 0
if redis.call('TYPE', KEYS[4]).ok == 'hash' then
  counted = redis.call('HEXISTS', KEYS[4], jid) == 1
end
local cur = resume_point(KEYS[1], total)
if counted then
  if not job then return 0 end
  if new <= cur then return 0 end
  counter(KEYS[2])
  redis.call('DECRBY', KEYS[2], new - cur)
  moved = new - cur
  if new >= total then redis.call('HDEL', KEYS[4], jid) end
end
if job and (counted or new > cur) then
  if new >= total then
    redis.call('DEL', KEYS[1])
    redis.call('HSET', KEYS[3], 'farm_done', 1)
  elseif counted then
    redis.call('SET', KEYS[1], new)
  else
    redis.call('SET', KEYS[1], new, 'EX', 604800)
  end
end
for i = 6, #ARGV, 2 do
  if holder(ARGV[i], ARGV[i + 1]) == jid then redis.call('HDEL', ARGV[i], ARGV[i + 1]) end
  if not counted then unlost(KEYS[5], ARGV[i + 1], jid, ARGV[4], false) end
end
if not counted and new >= total then unlost(KEYS[5], 'job:' .. jid, jid, ARGV[5], true) end
return moved
""")


# KEYS: rq failed registry, progress, counter, failed items, rq job, jobs holding items.
# ARGV: job id, n item records, (dedup bucket, id, record) per item in order, then (id,
# record) pairs always written. What the job still counts is its entry in KEYS[6] (the job's
# own items if that is not a count) less its progress. No entry: its items were counted out
# already (done, or reaped: none is recorded), or never counted (a job written into Redis by
# hand, not by commit: its items past its progress are recorded, nothing is counted out).
# The job is marked done only if its hash exists (a job gone, or a key that is not a hash, is
# left as it is). The last ARGV is the reap's job text: a job reaped and back (no entry, a
# hash) whose items are recorded here by ID no longer has the reap's 'IDs unknown' record.
_SETTLE = Script(None, COUNT_LUA + _UNLOST + b"""
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then return 0 end
hashes(KEYS[4], KEYS[6])
counter(KEYS[3])
local n = tonumber(ARGV[2])
local entry = redis.call('HGET', KEYS[6], ARGV[1])
local total = entry and (count(entry) or n) or -1
local cur = resume_point(KEYS[2], n)
local job = redis.call('TYPE', KEYS[5]).ok == 'hash'
if total >= 0 then
  if total > cur then redis.call('DECRBY', KEYS[3], total - cur) end
  redis.call('HDEL', KEYS[6], ARGV[1])
elseif not job or redis.call('HEXISTS', KEYS[5], 'farm_done') == 1 then
  cur = n
end
redis.call('DEL', KEYS[2])
if job then redis.call('HSET', KEYS[5], 'farm_done', 1) end
if total < 0 and cur < n then unlost(KEYS[4], 'job:' .. ARGV[1], ARGV[1], ARGV[#ARGV], true) end
for i = cur + 1, n do
  local bucket, id = ARGV[3 * i], ARGV[1 + 3 * i]
  redis.call('HSET', KEYS[4], id, ARGV[2 + 3 * i])
  if holder(bucket, id) == ARGV[1] then redis.call('HDEL', bucket, id) end
end
for i = 3 + 3 * n, #ARGV - 1, 2 do redis.call('HSET', KEYS[4], ARGV[i], ARGV[i + 1]) end
return 1
""")

# ARGV: rq job key prefix, (dedup bucket, id) pairs. Per item: '' no job carries it, '+' a
# live job (a hash) carries it, else the ID of the job its entry names, which is not a hash.
_HOLDS = Script(None, _SAFE + b"""
local out = {}
for i = 2, #ARGV, 2 do
  local h = holder(ARGV[i], ARGV[i + 1])
  if not h then out[#out + 1] = ''
  elseif redis.call('TYPE', ARGV[1] .. h).ok == 'hash' then out[#out + 1] = '+'
  else out[#out + 1] = h end
end
return out
""")
LOST_MARK = "@LOST@"
HOLDS_ROUND = 10_000  # items one _HOLDS call looks at (a script blocks Redis while it runs)
LOST_REASON = "job data lost or overwritten in Redis"
LOST_JOB_PREFIX = f"{LOST_REASON}: "  # how the reap's record of a job's unnamed items begins


def lost_item_text(job_id: str) -> str:
    """The error of the reap's record of an item of ``job_id`` (what ``advance`` looks for
    to remove it when the job runs after all)."""
    return f"{LOST_REASON} (job {job_id}): its function and arguments went with it"


def buckets(queue: str, ids: Iterable[str]) -> list[str]:
    """``[dedup bucket, id, …]``: each ID with the small hash of ``keys.inflight`` it lives in
    (many small hashes stay in Redis's compact encoding: ~45 bytes an item, not ~110)."""
    out: list[str] = []
    for item in ids:
        out += [keys.inflight(queue, zlib.crc32(item.encode()) % DEDUP_BUCKETS), item]
    return out


def in_flight(conn: redis.Redis, queue: str) -> dict[str, str]:
    """Every item in flight on ``queue`` and the job carrying it (for tests and tools: scans)."""
    out: dict[str, str] = {}
    for key in conn.scan_iter(match=keys.inflight(queue, None), count=10_000):
        out.update({k.decode(): v.decode() for k, v in conn.hgetall(key).items()})
    return out


def flatten(commands: Sequence[tuple]) -> list:
    """Recorded pipeline commands as ``[count, argc, args..., argc, args...]``."""
    out: list = [len(commands)]
    for args in commands:
        out.append(len(args))
        out.extend(args)
    return out


def commit(conn: redis.Redis, queue: str, job_id: str, commands: Sequence[tuple],
           ids: Sequence[str], count: int, *, holder: str = "",
           pipe: Pipeline | None = None) -> Any:
    """Run a job's recorded writes unless one of ``ids`` is in flight; returns the duplicates.

    ``holder``: the job the items come from (a deferral or a re-dispatch from inside the
    running job): its entries move to ``job_id``. With ``pipe`` the call is queued on it.
    """
    args = [job_id, JOB_PREFIX, count, holder, len(ids), *buckets(queue, ids),
            *flatten(commands)]
    return _COMMIT(keys=[keys.items_queued(queue), keys.failed_items(queue),
                         keys.job_items(queue)], args=args,
                   client=conn if pipe is None else pipe)


def unheld(conn: redis.Redis, queue: str, ids: Sequence[str]) -> list[str]:
    """Those of ``ids`` no live job carries (``holds``, ``HOLDS_ROUND`` items a script call,
    nothing written)."""
    out: list[str] = []
    for i in range(0, len(ids), HOLDS_ROUND):
        part = ids[i:i + HOLDS_ROUND]
        out += [item for item, held in zip(part, holds(conn, queue, part), strict=True)
                if held != "+"]
    return out


def holds(conn: redis.Redis, queue: str, ids: Sequence[str]) -> list[str]:
    """Per item of ``ids``, read at one instant: ``''`` no job carries it, ``'+'`` a live
    job does, else the ID of the job its entry names, whose data is gone (to ``reap``)."""
    if not ids:
        return []
    return [h.decode() for h in _HOLDS(args=[JOB_PREFIX, *buckets(queue, ids)], client=conn)]


def advance(conn: redis.Redis, queue: str, job_id: str, progress: int, total: int,
            released: Iterable[str]) -> int:
    """Move a job's resume point to ``progress`` of ``total`` items (at ``total`` the job is
    marked done and its resume point dropped); returns how far it actually moved."""
    return int(_ADVANCE(
        keys=[keys.item_progress(job_id), keys.items_queued(queue), JOB_PREFIX + job_id,
              keys.job_items(queue), keys.failed_items(queue)],
        args=[job_id, progress, total, lost_item_text(job_id), LOST_JOB_PREFIX,
              *buckets(queue, released)], client=conn))


def progress(conn: redis.Redis, job_id: str, total: int) -> int:
    """How many of a job's ``total`` items are behind its resume point: 0 when what is stored
    is not a count of at most ``total`` (whatever was written into Redis: the items run
    again, they are idempotent; a resume point past them would skip them unrecorded)."""
    try:
        raw = conn.get(keys.item_progress(job_id))
    except redis.ResponseError:  # not a string: the job's next checkpoint replaces it
        return 0
    text = (raw or b"0").strip()
    return int(text) if text.isdigit() and len(text) < 16 and int(text) <= total else 0


def settle(conn: redis.Redis, queue: str, failed_registry: str, job_id: str,
           item_records: Sequence[tuple[str, str]],
           extra_records: Sequence[tuple[str, str]] = ()) -> bool:
    """Take a failed rq job out of ``failed_registry`` and into ``farm failed`` (once): the
    items it still counts are counted out and recorded (``item_records``: one per item of
    the job, in order), ``extra_records`` always."""
    args: list = [job_id, len(item_records)]
    for item, record in item_records:
        args += [*buckets(queue, [item]), record]
    for pair in extra_records:
        args.extend(pair)
    args.append(LOST_JOB_PREFIX)
    return bool(_SETTLE(
        keys=[failed_registry, keys.item_progress(job_id), keys.items_queued(queue),
              keys.failed_items(queue), JOB_PREFIX + job_id, keys.job_items(queue)],
        args=args, client=conn))


def failure(function: object, kwargs: object, error: str, *, attempts: int = 0,
            job_id: str = "") -> str:
    """One ``farm failed`` record (JSON): what was called, with what, and why it stopped.

    Arguments larger than ``MAX_RECORD_ARGS`` bytes are kept as a truncated text; ``None``:
    not known (they were lost)."""
    args = kwargs
    try:
        text = json.dumps(kwargs)
    except (TypeError, ValueError):
        text, args = repr(kwargs), None
    if kwargs is not None and (args is None or len(text) > MAX_RECORD_ARGS):
        args = {"_truncated": text[:MAX_RECORD_ARGS]}
    return json.dumps({"function": str(function)[:200], "kwargs": args, "attempts": attempts,
                       "error": error[:1000], "job": job_id, "at": time.time()})
