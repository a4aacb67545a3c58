"""Jobs whose data went from Redis while their items were counted as queued.

Whoever can write to Redis can delete an rq job's hash or overwrite it with
something that is not a hash, and Redis itself can lose it (eviction, a partial
restore). rq then takes the job for no job: a worker skips its ID, registries drop
it. Its items must not stay counted, nor block their IDs, nor be waited for for
ever: every job that counts items is in ``keys.job_items``, and housekeeping sweeps
it, a slice a round, for jobs that are no longer a hash. Each is reaped: its items
counted out and recorded in ``farm failed`` ("job data lost or overwritten in
Redis"), by ID when the dedup index still names them, else as one record of the job
saying how many.

Only the dedup index (item -> job, ``keys.inflight``) knows a lost job's item IDs, and
it may hold millions of items. It is never read whole at once: a job found lost is
marked (``keys.lost_jobs``), and each housekeeping round reads the next slice of the
index (``SCAN_BUCKETS`` buckets, fewer once ``SCAN_ITEMS`` entries were read; the
position in ``keys.lost_scan``), releasing and recording the items it finds of any
marked job. A job is counted out once a whole pass since it was marked is done, or as
soon as all its unfinished items were found; a wait for items (``jobs.itemwait``)
names the items it watches itself. Every step is one Lua script that checks again
that the job is not a hash, so a job that finishes, or comes back, while it is looked
at is never counted twice.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import redis
from redis.commands.core import Script

from farmcore import keys
from jobs.accounting import (
    COUNT_LUA,
    DEDUP_BUCKETS,
    JOB_PREFIX,
    LOST_JOB_PREFIX,
    LOST_MARK,
    buckets,
    failure,
    lost_item_text,
)

log = logging.getLogger(__name__)
SWEEP_SLICE = 1000     # jobs of keys.job_items looked at per housekeeping round and queue
SCAN_CALL = 512        # dedup buckets one scan script reads (a script blocks Redis)
SCAN_BUCKETS = 8192    # dedup buckets read per round at most: a pass is 8 rounds
SCAN_ITEMS = 20_000    # a round stops reading buckets once it read this many entries
LOST_TTL = 7 * 86400   # a job reaped that runs after all keeps its progress this long

# KEYS: jobs holding items, progress, counter, failed items, rq job, lost jobs, named so far,
# scan position. ARGV: job id, item record, job record (with LOST_MARK where the count goes),
# final ('1': count out now), dedup buckets, (dedup bucket, id) pairs of items it may carry.
# Nothing happens while the job is a hash (but its lost mark goes). Each pair whose entry
# still names it is released and recorded, unless it has a record already (its worker failed
# it, with its arguments, before the checkpoint that would have released it). When final, when
# all its unfinished items were named, or when it counts none: its counted items are counted
# out once (its entry in KEYS[1] goes; an entry that is not a count: the items named) and
# items counted but never named are one record of the job; else it is marked to be looked
# for in the next pass of the index. Returns {counted out, recorded now}.
_REAP = Script(None, COUNT_LUA + b"""
local jid = ARGV[1]
if redis.call('TYPE', KEYS[5]).ok == 'hash' then
  redis.call('ZREM', KEYS[6], jid)
  redis.call('HDEL', KEYS[7], jid)
  return {-1, 0}
end
local entry = redis.call('HGET', KEYS[1], jid)
local total, cur = nil, 0  -- read before any write: a read that fails leaves all as it was
if entry then total, cur = count(entry), count(redis.call('GET', KEYS[2])) or 0 end
local sofar = count(redis.pcall('HGET', KEYS[7], jid)) or 0
local named = 0
for i = 6, #ARGV, 2 do
  if redis.call('HGET', ARGV[i], ARGV[i + 1]) == jid then
    redis.call('HDEL', ARGV[i], ARGV[i + 1])
    redis.call('HSETNX', KEYS[4], ARGV[i + 1], ARGV[2])
    named = named + 1
  end
end
sofar = sofar + named
if ARGV[4] ~= '1' and entry and not (total and sofar >= total - cur) then
  redis.call('HSET', KEYS[7], jid, sofar)
  if not redis.call('ZSCORE', KEYS[6], jid) then
    local at = (count(redis.pcall('GET', KEYS[8])) or 0) + tonumber(ARGV[5])
    redis.call('ZADD', KEYS[6], at, jid)
  end
  return {0, named}
end
local lost = 0
if entry then
  lost = total and math.max(0, total - cur) or sofar
  redis.call('DECRBY', KEYS[3], lost)
  redis.call('HDEL', KEYS[1], jid)
  redis.call('DEL', KEYS[2])
end
if lost > sofar then
  local text = string.gsub(ARGV[3], '@LOST@', tostring(lost - sofar))
  redis.call('HSET', KEYS[4], 'job:' .. jid, text)
end
redis.call('ZREM', KEYS[6], jid)
redis.call('HDEL', KEYS[7], jid)
return {lost, named}
""")

# KEYS: lost jobs, then the dedup buckets to read. Returns {entries read, {item, job, ...}}:
# the entries that name a job of KEYS[1] (a bucket that is not a hash is skipped).
_SCAN = Script(None, b"""
local read, out = 0, {}
for i = 2, #KEYS do
  local entries = redis.pcall('HGETALL', KEYS[i])
  if type(entries) == 'table' and not entries.err then
    read = read + #entries / 2
    for j = 1, #entries, 2 do
      if redis.call('ZSCORE', KEYS[1], entries[j + 1]) then
        out[#out + 1] = entries[j]
        out[#out + 1] = entries[j + 1]
      end
    end
  end
end
return {read, out}
""")


@dataclass
class ScanRound:
    """What one round of the scan did: buckets and entries read, items counted out."""

    buckets: int = 0
    entries: int = 0
    counted_out: int = 0


def reap(conn: redis.Redis, queue: str, job_id: str, candidates: Sequence[str] = (), *,
         final: bool = True) -> tuple[int, int]:
    """Release and record those of ``candidates`` (item IDs the job may carry) whose dedup
    entry still names ``job_id``, a job whose rq hash is gone or is not a hash; with
    ``final`` (or once all its unfinished items were found) count its items out, those never
    found as one record of the job, else mark it for the scan. Returns (items counted out,
    items recorded now); ``(-1, 0)`` when the job is a hash after all (nothing is done)."""
    item = failure("?", None, lost_item_text(job_id), job_id=job_id)
    whole = failure("?", None, f"{LOST_JOB_PREFIX}{LOST_MARK} unfinished item(s) of job "
                    f"{job_id} went with it, their IDs unknown", job_id=job_id)
    lost, named = _REAP(
        keys=[keys.job_items(queue), keys.item_progress(job_id), keys.items_queued(queue),
              keys.failed_items(queue), JOB_PREFIX + job_id, keys.lost_jobs(queue),
              keys.lost_named(queue), keys.lost_scan(queue)],
        args=[job_id, item, whole, int(final), DEDUP_BUCKETS, *buckets(queue, candidates)],
        client=conn)
    return int(lost), int(named)


def not_hashes(conn: redis.Redis, job_ids: Iterable[str]) -> list[str]:
    """Those of ``job_ids`` whose rq job key is missing or not a hash (one round trip)."""
    job_ids = list(job_ids)
    with conn.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.type(JOB_PREFIX + job_id)
        kinds = pipe.execute()
    return [j for j, kind in zip(job_ids, kinds, strict=True) if kind != b"hash"]


def counting(conn: redis.Redis, queue: str, job_ids: list[str]) -> list[str]:
    """Those of ``job_ids`` that still count items on ``queue`` (one round trip)."""
    if not job_ids:
        return []
    entries = conn.hmget(keys.job_items(queue), job_ids)
    return [j for j, entry in zip(job_ids, entries, strict=True) if entry is not None]


def reap_jobs(conn: redis.Redis, queue: str, job_ids: list[str],
              candidates: dict[str, list[str]] | None = None, *, isolate: bool = False,
              final: bool = False) -> int:
    """``reap`` each of ``job_ids`` (``candidates``: item IDs each may carry; none given:
    each is only marked for the scan); returns how many items were counted out. A job one
    of whose keys holds what the reap cannot read is left as it was: with ``isolate``
    (housekeeping) it is logged and the others are reaped, else the error is raised (a wait
    then ends with it, instead of waiting for ever for items no reap can free)."""
    n = 0
    for job_id in job_ids:
        try:
            lost, _ = reap(conn, queue, job_id, (candidates or {}).get(job_id, []),
                           final=final)
        except redis.ResponseError as exc:  # a key of it holds what the script cannot read
            if not isolate:
                raise
            log.error("job %s of queue %s cannot be reaped: %s", job_id, queue, exc)
            continue
        if lost > 0:
            log.error("job %s of queue %s: its data was lost or overwritten in Redis; "
                      "%d item(s) counted out, recorded in 'farm failed'", job_id, queue, lost)
        n += max(lost, 0)
    return n


def sweep(conn: redis.Redis, queue: str, limit: int = SWEEP_SLICE) -> int:
    """Look at about ``limit`` more jobs of ``queue`` that count items, from where the last
    sweep stopped, mark those whose data is gone, and read the next slice of the dedup
    index for the marked jobs' items (``scan``); returns how many items were counted out."""
    cursor, entries = conn.hscan(keys.job_items(queue), _cursor(conn, queue), count=limit)
    conn.set(keys.lost_sweep(queue), cursor)
    n = reap_jobs(conn, queue, not_hashes(conn, (k.decode() for k in entries)), isolate=True)
    return n + scan(conn, queue).counted_out


def scan(conn: redis.Redis, queue: str) -> ScanRound:
    """While jobs are marked lost: read the next slice of the dedup index (at most
    ``SCAN_BUCKETS`` buckets, none more once ``SCAN_ITEMS`` entries were read), release and
    record the items it names of marked jobs, and count out every marked job whose pass of
    the index is done."""
    out, end = ScanRound(), 0
    while out.buckets < SCAN_BUCKETS and out.entries < SCAN_ITEMS and _marked(conn, queue):
        end = _claim(conn, queue, SCAN_CALL)
        names = [keys.inflight(queue, b % DEDUP_BUCKETS) for b in range(end - SCAN_CALL, end)]
        read, found = _SCAN(keys=[keys.lost_jobs(queue), *names], client=conn)
        out.buckets, out.entries = out.buckets + SCAN_CALL, out.entries + int(read)
        carried: dict[str, list[str]] = defaultdict(list)
        for i in range(0, len(found), 2):
            carried[found[i + 1].decode()].append(found[i].decode())
        out.counted_out += reap_jobs(conn, queue, sorted(carried), carried, isolate=True)
    if end:
        out.counted_out += reap_jobs(conn, queue, _due(conn, queue, end), isolate=True,
                                     final=True)
    return out


def _marked(conn: redis.Redis, queue: str) -> int:
    """How many jobs are marked lost; marks written over by anyone are dropped (the sweep
    marks their jobs again as it passes them in ``keys.job_items``)."""
    try:
        return int(conn.zcard(keys.lost_jobs(queue)))
    except redis.ResponseError:
        log.error("the lost jobs of queue %s were written over; marking them again", queue)
        conn.delete(keys.lost_jobs(queue), keys.lost_named(queue))
        return 0


def _claim(conn: redis.Redis, queue: str, n: int) -> int:
    """Claim the next ``n`` buckets of the scan; returns where they end (a position that is
    not a count, whoever wrote it, starts the scan again from 0)."""
    try:
        return int(conn.incrby(keys.lost_scan(queue), n))
    except redis.ResponseError:
        conn.set(keys.lost_scan(queue), n)
        return n


def _due(conn: redis.Redis, queue: str, end: int) -> list[str]:
    """Marked jobs whose pass of the index ended by ``end`` (or marked past where any pass
    could end: the position was written over), at most ``SWEEP_SLICE`` of each."""
    key = keys.lost_jobs(queue)
    due = conn.zrangebyscore(key, "-inf", end, start=0, num=SWEEP_SLICE)
    due += conn.zrangebyscore(key, f"({end + 2 * DEDUP_BUCKETS}", "+inf", start=0,
                              num=SWEEP_SLICE)
    return [j.decode() for j in due]


def _cursor(conn: redis.Redis, queue: str) -> int:
    """Where the sweep resumes; from the start when what is stored is not a cursor Redis
    would take (whoever can write to Redis must not stop the sweep for good)."""
    try:
        raw = conn.get(keys.lost_sweep(queue)) or b"0"
    except redis.ResponseError:  # not a string: the next SET replaces it
        return 0
    return int(raw) if raw.isdigit() and int(raw) < 1 << 64 else 0
