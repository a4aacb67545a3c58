"""Whatever anyone who can reach Redis writes into the farm's own keys (``farmcore.keys``):
wrong types, numbers that are not counts, text that is not UTF-8. No process crashes or
stops for good on it, no item is lost or run twice, and every status view still answers."""

from __future__ import annotations

import pytest
import redis

from farmcore import keys
from workers import maintenance

# what a lock key may hold that no housekeeper wrote: -> how to write it
NOT_A_LOCK = {"no expiry": lambda c, k: c.set(k, "someone"),
              "a hash": lambda c, k: c.hset(k, "a", "b"),
              "a year's expiry": lambda c, k: c.set(k, "someone", ex=365 * 86400),
              "a list": lambda c, k: c.rpush(k, "\xff")}


@pytest.fixture
def conn(rt) -> redis.Redis:
    """The test Redis database (emptied before and after the test)."""
    return rt.redis


@pytest.mark.parametrize("how", NOT_A_LOCK)
def test_housekeeping_takes_over_a_lock_key_no_housekeeper_wrote(rt, conn, how):
    """Before: ``SET NX`` never succeeded on it, and that housekeeping (settling failed
    jobs, promoting deferred items, the lost-job sweep, redispatching chunks) stopped for
    good: waits for deferred items hung."""
    for name in ("maintenance:queue:farm", "maintenance:ledger", "maintenance:redispatch"):
        NOT_A_LOCK[how](conn, keys.leader(name))
    assert maintenance.run_once(rt, "me", ["farm"])
    for name in ("maintenance:queue:farm", "maintenance:ledger", "maintenance:redispatch"):
        assert conn.get(keys.leader(name)) == b"me"
        assert 0 < conn.pttl(keys.leader(name)) <= maintenance.REDISPATCH_SECONDS * 1000


def test_a_live_housekeeping_lock_is_respected(rt, conn):
    conn.set(keys.leader("maintenance:queue:farm"), "other", ex=maintenance.LOCK_SECONDS)
    conn.set(keys.leader("maintenance:ledger"), "other", ex=maintenance.LOCK_SECONDS)
    assert not maintenance.run_once(rt, "me", ["farm"])
    assert conn.get(keys.leader("maintenance:ledger")) == b"other"
