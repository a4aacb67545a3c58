"""Shard state on the shard itself: a write routed with a stale map or into a frozen shard."""

from __future__ import annotations

import pytest

from shardfarm.errors import ShardFrozenError, StaleMapError
from shardfarm.retry import RetryPolicy
from sharding import fencing
from sharding.mapsource import FixedSource
from sharding.router import Router
from sharding.schema import shard_table
from sharding.shardmap import ShardMap
from tests.conftest import SHARDS_A

ONCE = RetryPolicy(attempts=1)


def _router_at(router: Router, version: int) -> Router:
    m = router.shardmap
    view = router.pinned()
    view.source = FixedSource(ShardMap(version, m.hosts, m.shard_ranges, m.open_ranges,
                                       m.buckets, m.mod_ranges))
    return view


@pytest.fixture
def shard(router):
    s = SHARDS_A[0] + 3
    yield s
    with router.transaction(router.host_for(s)) as cur:
        cur.execute(f"DELETE FROM {shard_table(s, 'shard_state')}")


def test_a_write_routed_with_an_older_map_than_the_shards_is_refused(router, shard):
    router.run(shard, lambda cur: fencing.set_state(cur, shard, 7, False))
    with pytest.raises(StaleMapError, match="moved by shard map version 7"):
        _router_at(router, 6).run(shard, lambda cur: cur.execute("SELECT 1"), policy=ONCE)
    assert _router_at(router, 7).run(shard, lambda cur: 42, policy=ONCE) == 42
    assert router.run(shard, lambda cur: fencing.state(cur, shard), role="slave") == (7, False)


def test_a_frozen_shard_refuses_writes_with_a_retryable_error(router, shard):
    v = router.shardmap.version
    router.run(shard, lambda cur: fencing.set_state(cur, shard, v, True))
    with pytest.raises(ShardFrozenError, match="frozen"):
        router.run(shard, lambda cur: None, policy=ONCE)
    with router.transaction(router.host_for(shard)) as cur:
        fencing.set_state(cur, shard, v, False)
    assert router.run(shard, lambda cur: 1, policy=ONCE) == 1


def test_a_shard_without_state_takes_every_write(router, shard):
    assert router.run(shard, lambda cur: fencing.state(cur, shard), policy=ONCE) == (0, False)


def test_a_fence_raised_after_the_transactions_snapshot_still_refuses_the_write(router, shard):
    """The fence is read as it is now, not as the transaction's first read saw the shard
    (a group transaction writes many shards after its snapshot was taken): a chunk taken
    over meanwhile is refused, never let through or crashed on a missing row."""
    from shardfarm.errors import FencedError
    q = shard_table(shard, "chunk_fences")
    heir = fencing.FenceToken("t-snapshot", 0, 2)

    def zombie(cur) -> None:
        cur.execute(f"SELECT COUNT(*) FROM {q}")  # a consistent read: the snapshot is taken
        router.run(shard, lambda other: fencing.check(other, shard, heir))  # heir commits
        fencing.check(cur, shard, fencing.FenceToken("t-snapshot", 0, 1))
    try:
        with pytest.raises(FencedError):
            router.run(shard, zombie, policy=ONCE)
    finally:
        router.run(shard, lambda cur: cur.execute(
            f"DELETE FROM {q} WHERE run_id = 't-snapshot'"))
