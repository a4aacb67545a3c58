"""The fenced swap of home feeds: a stale actor's late swap is refused by Redis itself.

A feeds chunk reads follows and pins from the shards, then swaps the users' feeds in.
A worker that stalls between its last lease check and its swap (a GC pause, a frozen
VM, a partition) while its lease expires must not put its older feeds over newer ones.
Two values decide, judged by a Lua script at the end of the ``MULTI/EXEC`` that wrote the
new feeds to temporary keys; it renames each over its feed or drops it, so nothing can come
between the judgement and the write (the pins themselves never pass through Lua: cheaper):

- the chunk's fence (``keys.feeds_fence``: chunk -> the ledger fence of its newest
  owner). Every owner advances it (``begin``) before it reads anything; a swap under a
  lower fence is refused whole with ``FencedError``: that attempt's chunk was claimed
  again, and it ends as every zombie of the farm does.
- each user's generation (``keys.feed_generations``): ``begin`` draws the attempt's from
  one counter (``keys.feeds_generation``) before any follow or pin is read, and a swap
  stores it beside each feed it writes. A feed is written only under a generation at least
  the one that wrote it last; a user whose feed a later reader wrote (another run's chunk,
  or this chunk's next owner) is left as it is and counted as ``superseded``. This holds
  for a stale actor whose chunk was not (yet) claimed again, of an older run, or whose
  chunk fence expired (``FENCE_SECONDS`` after its last advance).

A reader (``LRANGE home:<id> 0 49``) sees a user's old feed or the new one, never a
half-built one: the transaction is atomic.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from redis.commands.core import Script

from farmcore import keys
from shardfarm.errors import FencedError
from sharding.fencing import FenceToken

if TYPE_CHECKING:
    from redis import Redis

BATCH = 200  # users per MULTI/EXEC
FENCE_SECONDS = 7 * 86400  # a chunk fence outlives its last advance by this much

# Stored values are read as numbers, 0 when they are not (whoever can write to Redis must
# not make a script fail on them for good).
_NUM = b"""
local function num(v)
  local x = tonumber(v)
  if x then return x end
  return 0
end
"""

# KEYS: chunk fences, generation counter. ARGV: chunk ID, fence, seconds to keep the fence.
# Refused ({0, held}) if a higher fence is held; else advances it and draws a generation.
_BEGIN = Script(None, _NUM + b"""
local held, mine = num(redis.call('HGET', KEYS[1], ARGV[1])), tonumber(ARGV[2])
if held > mine then return {0, held} end
if held < mine then redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) end
redis.call('EXPIRE', KEYS[1], ARGV[3])
return {redis.call('INCR', KEYS[2]), mine}
""")

# Run last in the MULTI/EXEC that wrote each non-empty feed to its temporary key, so nothing
# comes between it and them. KEYS: chunk fences, then per user: temporary key, feed,
# generations hash. ARGV: chunk ID, fence, generation, then per user: field in the
# generations hash, pins. Refused whole ({0, held, 0, 0}) if a higher fence is held; else
# {1, pins, feeds, superseded}: each feed last written under a higher generation is left,
# every other replaced by its temporary key (an empty one deleted). No temporary key is left.
_SWAP = Script(None, _NUM + b"""
local held = num(redis.call('HGET', KEYS[1], ARGV[1]))
local refused = held > tonumber(ARGV[2])
local gen = tonumber(ARGV[3])
local a, pins, feeds, superseded = 4, 0, 0, 0
for k = 2, #KEYS, 3 do
  local field, n = ARGV[a], tonumber(ARGV[a + 1])
  a = a + 2
  if refused then
    redis.call('DEL', KEYS[k])
  elseif num(redis.call('HGET', KEYS[k + 2], field)) > gen then
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
if refused then return {0, held, 0, 0} end
return {1, pins, feeds, superseded}
""")


@dataclass(frozen=True)
class FeedFence:
    """What an attempt's swaps are judged by: its chunk's lease token and its generation."""

    token: FenceToken
    generation: int


class Swapped(NamedTuple):
    """What a swap did: pins written, non-empty feeds written, feeds left as newer."""

    pins: int = 0
    feeds: int = 0
    superseded: int = 0


def _refused(token: FenceToken, held: int) -> FencedError:
    return FencedError(f"chunk {token.chunk_id} of run {token.run_id} was taken over "
                       f"(fence {token.fence} < {held}); its feeds are refused")


def begin(redis: Redis, token: FenceToken) -> FeedFence:
    """Before an attempt reads anything: advance the chunk's fence to ``token``'s and draw
    the attempt's generation. ``FencedError`` if a newer owner of the chunk advanced it
    further."""
    ok, held = _BEGIN(keys=[keys.feeds_fence(token.run_id), keys.feeds_generation()],
                      args=[token.chunk_id, token.fence, FENCE_SECONDS], client=redis)
    if not ok:
        raise _refused(token, int(held))
    return FeedFence(token, int(ok))


def _batches(items: Sequence, size: int) -> Iterator[Sequence]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def swap_feeds(redis: Redis, feeds: dict[int, list[int]], fence: FeedFence,
               batch: int = BATCH) -> Swapped:
    """Replace each user's feed with its new pins (an empty feed deletes the key), judged by
    ``fence`` (see the module's text): per ``batch`` users one ``MULTI/EXEC`` that writes
    each new feed to a temporary key and ends with the script that judges and renames them.
    ``FencedError`` if the chunk was taken over: that batch replaces nothing."""
    token, done = fence.token, Swapped()
    for group in _batches(list(feeds.items()), batch):
        pipe = redis.pipeline(transaction=True)
        names, args = [keys.feeds_fence(token.run_id)], [token.chunk_id, token.fence,
                                                          fence.generation]
        for user, feed in group:
            tmp = keys.home_feed_tmp(user)
            if feed:
                pipe.delete(tmp)
                pipe.rpush(tmp, *[b"%d" % p for p in feed])  # bytes: cheapest to pack
            names += (tmp, keys.home_feed(user), keys.feed_generations(user))
            args += (keys.feed_generation_field(user), len(feed))
        _SWAP(keys=names, args=args, client=pipe)
        ok, pins, written, superseded = pipe.execute()[-1]
        if not ok:
            raise _refused(token, int(pins))
        done = Swapped(done.pins + pins, done.feeds + written, done.superseded + superseded)
    return done
