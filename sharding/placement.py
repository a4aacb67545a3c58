"""Where a new user goes: a shard of the map's open ranges, by their weights.

The choice is a pure function of the user's key (its legacy ID, or any stable key
the application has) and of the map's ``open`` list, so the same map places the
same key on the same shard. Existing users never move when a range is opened:
a user's shard is part of its 64-bit ID (and the migration places legacy users
with the open-shard list frozen by its first run), so a new ``open`` entry only
changes where users created from then on go.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools

from shardfarm.errors import ConfigError
from sharding.shardmap import ShardMap


def place_user(shardmap: ShardMap, key: int | str) -> int:
    """The open shard a new user with ``key`` goes to: an open range chosen with probability
    proportional to its weight, then a shard of that range (both from one MD5 of the key)."""
    if not shardmap.open_ranges:
        raise ConfigError("the shard map has no open shards to place users on")
    h = int.from_bytes(hashlib.md5(f"user:{key}".encode()).digest()[:8], "big")
    cumulative = list(itertools.accumulate(shardmap.open_weights))
    point = h % cumulative[-1]
    lo, hi = shardmap.open_ranges[bisect.bisect_right(cumulative, point)]
    return lo + (h // cumulative[-1]) % (hi - lo + 1)
