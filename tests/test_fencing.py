"""Fences and shard state on the shard itself: a write routed with a stale map or into a frozen
shard, and a zombie's writes to shards and mod buckets after its successor's."""

from __future__ import annotations

import pytest

from loaders.migration import writer
from loaders.migration.build import TargetRows
from shardfarm.errors import FencedError, ShardFrozenError, StaleMapError
from shardfarm.retry import RetryPolicy
from sharding import fencing
from sharding.mapsource import FixedSource
from sharding.router import Router
from sharding.schema import mod_table, shard_table
from sharding.shardmap import Range, ShardMap
from tests.conftest import SHARDS_A
from tests.migratekit import users_named

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


@pytest.fixture
def bucket(router):
    """A mod bucket whose test lookups and fences (run ``t-mod``) are deleted after."""
    b = 5
    home = fencing.mod_home(router.shardmap, b)
    yield b

    def clean(cur) -> None:
        cur.execute(f"DELETE FROM {mod_table(b, 'username_to_user')} "
                    "WHERE username LIKE 'fence-test-%'")
        cur.execute(f"DELETE FROM {mod_table(home, 'chunk_fences')} WHERE run_id = 't-mod'")
    router.run_mod(b, clean)


def _username(b: int, key: str, user_id: int) -> TargetRows:
    rows = TargetRows()
    rows.lookups[(b, "username_to_user")].append((key, user_id))
    return rows


def test_a_zombies_lookups_and_their_removal_after_its_successors_are_refused(router, bucket):
    """A chunk's writes to mod buckets are fenced like its shard writes: once its successor
    (a higher fence) wrote to a mod server, the zombie's upserts and deletes there are
    refused, whatever they would have done (here the upsert keeps the smaller user ID)."""
    heir, zombie = fencing.FenceToken("t-mod", 3, 2), fencing.FenceToken("t-mod", 3, 1)
    key = "fence-test-a"
    writer.write_mod(router, _username(bucket, key, 200), heir)
    with pytest.raises(FencedError, match="fence 1 < 2"):
        writer.write_mod(router, _username(bucket, key, 100), zombie)
    delete = (bucket, f"DELETE FROM {mod_table(bucket, 'username_to_user')} "
                      "WHERE username = %s", (key,))
    with pytest.raises(FencedError, match="fence 1 < 2"):
        writer.run_mod_statements(router, [delete], zombie)
    assert users_named(router, bucket, key) == [200]
    writer.write_mod(router, _username(bucket, key, 100), heir)  # the heir still writes
    assert users_named(router, bucket, key) == [100]


def test_a_mod_fence_raised_after_the_transactions_snapshot_still_refuses(router, bucket):
    """As on a shard: the mod fence is read as it is now, not as the snapshot saw it."""
    home = fencing.mod_home(router.shardmap, bucket)
    q = mod_table(home, "chunk_fences")

    def zombie(cur) -> None:
        cur.execute(f"SELECT COUNT(*) FROM {q}")  # a consistent read: the snapshot is taken
        router.run_mod(bucket, lambda other: fencing.check_mod(
            other, router.shardmap, [bucket], fencing.FenceToken("t-mod", 0, 2)))
        fencing.check_mod(cur, router.shardmap, [bucket], fencing.FenceToken("t-mod", 0, 1))
    with pytest.raises(FencedError):
        router.run_mod(bucket, zombie, policy=ONCE)


def _two_ranges(router: Router) -> Router:
    """``router`` with its one mod range cut in two (``0-31``, ``32-63``) on the same hosts."""
    m = router.shardmap
    r = m.mod_ranges[0]
    half = (r.lo + r.hi + 1) // 2
    view = router.pinned()
    view.source = FixedSource(ShardMap(m.version, m.hosts, m.shard_ranges, m.open_ranges,
                                       m.buckets, [Range(r.lo, half - 1, r.master, r.slave),
                                                   Range(half, r.hi, r.master, r.slave)]))
    return view


def test_a_transaction_over_two_ranges_is_fenced_in_each_and_writes_nothing_if_refused(
        router, bucket):
    """With two ranges on one server, a transaction writing a bucket of each checks both
    ranges' fences: refused by the second range's, it writes nothing in the first."""
    two = _two_ranges(router)
    m = two.shardmap
    other = m.mod_ranges[1].lo + 3
    assert [fencing.mod_home(m, b) for b in (bucket, other)] == [m.mod_ranges[0].lo,
                                                                  m.mod_ranges[1].lo]
    heir, zombie = fencing.FenceToken("t-mod", 4, 2), fencing.FenceToken("t-mod", 4, 1)
    writer.write_mod(two, _username(other, "fence-test-c", 300), heir)  # the second range
    both = _username(bucket, "fence-test-b", 100)
    both.lookups[(other, "username_to_user")].append(("fence-test-c", 100))
    try:
        with pytest.raises(FencedError, match="fence 1 < 2"):
            writer.write_mod(two, both, zombie)
        assert users_named(two, bucket, "fence-test-b") == []
        assert users_named(two, other, "fence-test-c") == [300]
    finally:
        q = mod_table(other, "username_to_user")
        home = mod_table(m.mod_ranges[1].lo, "chunk_fences")
        two.run_mod(other, lambda cur: (
            cur.execute(f"DELETE FROM {q} WHERE username LIKE 'fence-test-%'"),
            cur.execute(f"DELETE FROM {home} WHERE run_id = 't-mod'")))
