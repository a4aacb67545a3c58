"""The fenced swap of home feeds: a stale actor's late swap is refused by Redis itself.

A feeds chunk reads follows and pins from the shards, then swaps the users' feeds in.
A worker that stalls between its last lease check and its swap (a GC pause, a frozen
VM, a partition) while its lease expires must not put its older feeds over newer ones.
Two values decide, judged by a Lua script at the end of the ``MULTI/EXEC`` that wrote the
new feeds to temporary keys; it renames each over its feed or drops it, so nothing can come
between the judgement and the write (the pins themselves never pass through Lua: cheaper):

- the chunk's fence (``keys.feeds_fence``: chunk -> the ledger fence of its newest
  owner). Every owner advances it (``begin``) before it reads anything; a swap under a
  lower fence is refused whole: that attempt's chunk was claimed again, and it ends with
  ``FencedError`` as every zombie of the farm does. The ledger is the authority: a fence in
  Redis above the attempt's, or that is no fence (another type, not a number), is first
  put to it (``confirm``: a renewal of the lease); if the attempt still owns its chunk, no
  owner can have written it and it is replaced by the attempt's.
- each user's generation (``keys.feed_generations``): ``begin`` draws the attempt's
  (``keys.feeds_generation``: Redis's clock in microseconds, or one more than the last one
  drawn if that is higher) before any follow or pin is read, and a swap stores it beside
  each feed it writes. A feed is written only under a generation at least the one that
  wrote it last; a user whose feed a later reader wrote (another run's chunk, or this
  chunk's next owner) is left as it is and counted as ``superseded``. This holds for a
  stale actor whose chunk was not (yet) claimed again, of an older run, or whose chunk
  fence expired (``FENCE_SECONDS`` after its last advance).

Whoever can write to Redis cannot stop a swap for good: a stored generation above the last
one drawn was never drawn and is overwritten; a last-drawn value that is not a number, or
more than ``CLOCK_SLACK`` ahead of the clock, is ignored by the next draw; one deleted or
set back cannot send generations below those stored (they were drawn earlier, by the
clock), and until the next draw every stored generation above a swap's counts as drawn.

A reader (``LRANGE home:<id> 0 49``) sees a user's old feed or the new one, never a
half-built one: the transaction is atomic. No temporary key outlives a failed swap.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from redis.commands.core import Script
from redis.exceptions import RedisError

from farmcore import keys
from shardfarm.errors import RetryableError
from sharding.fencing import FenceToken

if TYPE_CHECKING:
    from redis import Redis

BATCH = 200  # users per MULTI/EXEC
FENCE_SECONDS = 7 * 86400  # a chunk fence outlives its last advance by this much
CLOCK_SLACK = 365 * 86400 * 10**6  # a last-drawn generation further ahead of TIME: not drawn
REPAIRS = 3  # fences in Redis replaced (each confirmed by the ledger) before giving up

# Whether the chunk's fence (KEYS hash ``key``, field ``chunk``) lets fence ``mine`` write:
# nil if it is at most ``mine`` (or none is held); else what is there (a higher fence, or
# anything that is no fence), for the ledger to judge.
_HELD = b"""
local function higher(key, chunk, mine)
  local v = redis.pcall('HGET', key, chunk)
  if type(v) == 'table' then return 'a key of another type' end
  if v and not (tonumber(v) and tonumber(v) <= mine) then return v end
  return nil
end
"""

# KEYS: chunk fences, generation counter. ARGV: chunk ID, fence, seconds to keep the fence,
# clock slack. Refused ({0, held}) if a higher fence (or no fence) is held; else advances it
# and draws a generation: the clock, or one more than the last drawn if that is higher.
_BEGIN = Script(None, _HELD + b"""
local held = higher(KEYS[1], ARGV[1], tonumber(ARGV[2]))
if held then return {0, held} end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[3])
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local last = tonumber(redis.pcall('GET', KEYS[2]))
if not last or not (last <= now + tonumber(ARGV[4])) then last = 0 end
local gen = math.max(math.floor(last) + 1, now)
redis.call('SET', KEYS[2], string.format('%d', gen))
return {1, gen}
""")

# Run last in the MULTI/EXEC that wrote each non-empty feed to its temporary key, so nothing
# comes between it and them. KEYS: chunk fences, generation counter, then per user:
# temporary key, feed, generations hash. ARGV: chunk ID, fence, generation, then per user:
# field in the generations hash, pins. Refused whole ({0, held}) as ``begin`` is; else
# {1, pins, feeds, superseded}: each feed last written under a higher generation that was
# drawn (at most the last drawn) is left, every other replaced by its temporary key (an
# empty one deleted). No temporary key is left.
_SWAP = Script(None, _HELD + b"""
local held = higher(KEYS[1], ARGV[1], tonumber(ARGV[2]))
local gen = tonumber(ARGV[3])
local last = tonumber(redis.pcall('GET', KEYS[2]))
if not (last and last >= gen) then last = math.huge end
local a, pins, feeds, superseded = 4, 0, 0, 0
for k = 3, #KEYS, 3 do
  local field, n = ARGV[a], tonumber(ARGV[a + 1])
  a = a + 2
  local s = nil
  if not held then
    s = redis.pcall('HGET', KEYS[k + 2], field)
    if type(s) == 'table' then redis.call('DEL', KEYS[k + 2]) end
    s = tonumber(s)
  end
  if held then
    redis.call('DEL', KEYS[k])
  elseif s and s > gen and s <= last then
    redis.call('DEL', KEYS[k])
    superseded = superseded + 1
  else
    redis.call('HSET', KEYS[k + 2], field, ARGV[3])
    if n > 0 then
      redis.call('RENAME', KEYS[k], KEYS[k + 1])
      feeds, pins = feeds + 1, pins + n
    else
      redis.call('DEL', KEYS[k + 1])
    end
  end
end
if held then return {0, held} end
return {1, pins, feeds, superseded}
""")

# KEYS: chunk fences. ARGV: chunk ID, fence, what was found held, seconds to keep the fence.
# Puts the fence in place of what was found (unless it changed since): 1 if it did.
_REPAIR = Script(None, b"""
local t = redis.call('TYPE', KEYS[1])['ok']
if t ~= 'hash' and t ~= 'none' then
  redis.call('DEL', KEYS[1])
elseif redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[3] then
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[4])
return 1
""")


class FenceContendedError(RetryableError):
    """The chunk's fence in Redis kept being replaced under an owner the ledger confirms:
    something else writes it. The attempt ends; the chunk is tried again later."""


@dataclass(frozen=True)
class FeedFence:
    """What an attempt's swaps are judged by: its chunk's lease token, its generation, and
    ``confirm``, which raises ``FencedError`` unless the ledger still has the token's owner
    hold the chunk (``ChunkContext.fence``)."""

    token: FenceToken
    generation: int
    confirm: Callable[[], None]


class Swapped(NamedTuple):
    """What a swap did: pins written, non-empty feeds written, feeds left as newer."""

    pins: int = 0
    feeds: int = 0
    superseded: int = 0


def _repair(redis: Redis, token: FenceToken, confirm: Callable[[], None], held: bytes) -> None:
    """Redis holds ``held`` as the chunk's fence, above ``token``'s or no fence: unless the
    ledger says the token's attempt lost its chunk (``confirm`` raises ``FencedError``), no
    owner wrote it; put ``token``'s fence in its place."""
    confirm()
    _REPAIR(keys=[keys.feeds_fence(token.run_id)],
            args=[token.chunk_id, token.fence, held, FENCE_SECONDS], client=redis)


def _contended(token: FenceToken) -> FenceContendedError:
    return FenceContendedError(f"chunk {token.chunk_id} of run {token.run_id}: its fence in "
                               f"Redis ({keys.feeds_fence(token.run_id)}) kept changing "
                               "though the ledger has this attempt own it; try again later")


def begin(redis: Redis, token: FenceToken, confirm: Callable[[], None]) -> FeedFence:
    """Before an attempt reads anything: advance the chunk's fence to ``token``'s and draw
    the attempt's generation. ``FencedError`` (from ``confirm``) if a newer owner of the
    chunk advanced it further; a fence no owner wrote is replaced."""
    for _ in range(REPAIRS + 1):
        ok, got = _BEGIN(keys=[keys.feeds_fence(token.run_id), keys.feeds_generation()],
                         args=[token.chunk_id, token.fence, FENCE_SECONDS, CLOCK_SLACK],
                         client=redis)
        if ok:
            return FeedFence(token, int(got), confirm)
        _repair(redis, token, confirm, got)
    raise _contended(token)


def _batches(items: Sequence, size: int) -> Iterator[Sequence]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def _send(redis: Redis, group: Sequence[tuple[int, list[int]]], fence: FeedFence) -> list:
    """One ``MULTI/EXEC``: the new feeds of ``group`` to temporary keys, then ``_SWAP``; its
    reply. On an error the temporary keys are deleted (a script that failed half way keeps
    what it did, and the ``RPUSH``es ran)."""
    token, pipe, tmps = fence.token, redis.pipeline(transaction=True), []
    names = [keys.feeds_fence(token.run_id), keys.feeds_generation()]
    args = [token.chunk_id, token.fence, fence.generation]
    for user, feed in group:
        tmp = keys.home_feed_tmp(user)
        if feed:
            pipe.delete(tmp)
            pipe.rpush(tmp, *[b"%d" % p for p in feed])  # bytes: cheapest to pack
            tmps.append(tmp)
        names += (tmp, keys.home_feed(user), keys.feed_generations(user))
        args += (keys.feed_generation_field(user), len(feed))
    _SWAP(keys=names, args=args, client=pipe)
    try:
        return pipe.execute()[-1]
    except RedisError:
        with suppress(RedisError):
            if tmps:
                redis.delete(*tmps)
        raise


def swap_feeds(redis: Redis, feeds: dict[int, list[int]], fence: FeedFence,
               batch: int = BATCH) -> Swapped:
    """Replace each user's feed with its new pins (an empty feed deletes the key), judged by
    ``fence`` (see the module's text): per ``batch`` users one ``MULTI/EXEC`` that writes
    each new feed to a temporary key and ends with the script that judges and renames them.
    ``FencedError`` if the chunk was taken over: that batch replaces nothing."""
    done = Swapped()
    for group in _batches(list(feeds.items()), batch):
        for _ in range(REPAIRS + 1):
            got = _send(redis, group, fence)
            if got[0]:
                break
            _repair(redis, fence.token, fence.confirm, got[1])
        else:
            raise _contended(fence.token)
        done = Swapped(*(a + b for a, b in zip(done, got[1:], strict=True)))
    return done
