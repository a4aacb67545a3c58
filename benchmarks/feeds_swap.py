"""The cost of fencing the home feed swap: ``loaders.feedswap.swap_feeds`` (per 200 users
one ``MULTI/EXEC`` of ``DEL`` + ``RPUSH`` of a temporary key per user and the script that
judges the chunk's fence and each user's generation and renames) against the unfenced swap
it replaced (the same with ``RENAME`` per user in place of the script), on the same feeds.

``python -m benchmarks.feeds_swap [--users N] [--length L] [--rounds R]`` prints, for each,
the best seconds of a round of every user's feed (rounds of the two alternate, so a busy
machine slows both alike) and microseconds per user, and the Redis bytes the fence adds per
user. Runs its own private ``redis-server``; nothing else is touched.
"""

from __future__ import annotations

import argparse
import random
import time

from redis import Redis

from farmcore import keys
from loaders.feedswap import BATCH, begin, swap_feeds
from sharding import ids
from sharding.fencing import FenceToken
from tests.servers import PrivateRedis


def unfenced(redis: Redis, feeds: dict[int, list[int]]) -> None:
    """The swap before the fence: a temporary key renamed over the feed, 200 users a MULTI."""
    items = list(feeds.items())
    for i in range(0, len(items), BATCH):
        pipe = redis.pipeline(transaction=True)
        for user, feed in items[i:i + BATCH]:
            tmp = f"{keys.home_feed(user)}:tmp"
            pipe.delete(tmp)
            pipe.rpush(tmp, *[b"%d" % p for p in feed])
            pipe.rename(tmp, keys.home_feed(user))
        pipe.execute()


def _seconds(fn) -> float:
    began = time.perf_counter()
    fn()
    return time.perf_counter() - began


def main() -> None:
    """Measure both swaps on a private Redis and print one line each."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=4_000)
    ap.add_argument("--length", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    rng = random.Random(1)
    feeds = {ids.encode(7, "user", i + 1): sorted(rng.sample(range(1, 10**9), a.length))
             for i in range(a.users)}
    server = PrivateRedis.start()
    try:
        redis = Redis.from_url(server.url())
        fence = begin(redis, FenceToken("bench", 0, 1), confirm=lambda: None)
        old = new = float("inf")
        for _ in range(a.rounds):
            old = min(old, _seconds(lambda: unfenced(redis, feeds)))
            new = min(new, _seconds(lambda: swap_feeds(redis, feeds, fence)))
        fence_bytes = sum(redis.memory_usage(k) for k in {keys.feed_generations(u)
                                                          for u in feeds})
        for name, s in (("unfenced", old), ("fenced", new)):
            print(f"{name:8s} {s:7.2f} s per round, {s / a.users * 1e6:6.1f} us per user "
                  f"({a.users:,} users x {a.length} pins)")
        print(f"fenced / unfenced: {new / old:.2f}; fence state: "
              f"{fence_bytes / a.users:.1f} bytes per user (the generations)")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
