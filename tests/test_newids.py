"""New IDs for legacy rows: pure for small IDs, allocated once for big (or zero) ones."""

import threading

import pytest

from loaders.migration.newids import NewIds
from loaders.migration.spec import SPEC
from shardfarm.errors import FencedError
from sharding import fencing, ids
from sharding.fencing import FenceToken
from sharding.modshard import bucket_of, legacy_key
from sharding.schema import mod_table, shard_table
from tests.conftest import SHARDS_A, SHARDS_B
from tests.farmkit import until

FLOOR = ids.FIRST_ALLOCATED - 1  # every allocated local ID is above: 2**35 and up


def test_small_ids_are_a_pure_function(router):
    n = NewIds(router)
    assert n.new_id(SPEC["pins"], 42, SHARDS_B[0]) == ids.encode(SHARDS_B[0], "pin", 42)
    top = 2**35 - 1
    assert n.new_id(SPEC["pins"], top, SHARDS_B[0]) == ids.encode(SHARDS_B[0], "pin", top)


def test_ids_from_2_35_up_are_allocated_never_copied(router):
    shard = SHARDS_A[0] + 4
    n = NewIds(router)
    n.prepare([(SPEC["users"], 2**35, shard), (SPEC["users"], 2**36 - 1, shard)])
    got = {n.new_id(SPEC["users"], legacy, shard) for legacy in (2**35, 2**36 - 1)}
    assert len(got) == 2 and all(ids.decode(g).local >= 2**35 for g in got)
    assert ids.encode(shard, "user", 2**36 - 1) not in got  # allocated, not copied


def test_big_and_zero_ids_are_allocated_once_from_2_35_up(router):
    shard = SHARDS_A[0] + 6
    for legacy in (2**40 + 12345, 0, 2**64 - 7):
        first = NewIds(router)
        first.prepare([(SPEC["boards"], legacy, shard)])
        new = first.new_id(SPEC["boards"], legacy, shard)
        d = ids.decode(new)
        assert (d.shard, d.type_name) == (shard, "board") and d.local > FLOOR
        again = NewIds(router)  # another process finds it through legacy_id_map
        again.prepare([(SPEC["boards"], legacy, shard)])
        assert again.new_id(SPEC["boards"], legacy, shard) == new


def test_racing_allocations_agree_and_losers_give_back(router):
    shard = SHARDS_B[1]
    legacy = 2**50 + 999
    results, barrier = [], threading.Barrier(4)

    def allocate():
        n = NewIds(router)
        barrier.wait()
        n.prepare([(SPEC["pins"], legacy, shard)])
        results.append(n.new_id(SPEC["pins"], legacy, shard))
    threads = [threading.Thread(target=allocate) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(results)) == 1
    q = shard_table(shard, "pins")
    placeholders = router.query(router.host_for(shard),
                                f"SELECT COUNT(*) FROM {q} WHERE active = 0 AND local_id > %s",
                                (FLOOR,), shard)[0][0]
    assert placeholders == 1  # only the winner's row remains


def test_batched_allocations_race_agree_and_leave_one_row_each(router):
    """Two processes allocate overlapping batches over two servers at once: one ID each."""
    shards = [SHARDS_A[0] + 3, SHARDS_B[0] + 3]
    wanted = [(SPEC["comments"], 2**45 + i, shards[i % 2]) for i in range(60)]
    for shard in shards:  # the first server outlives a test session
        q = shard_table(shard, "comments")
        router.run(shard, lambda cur, q=q: cur.execute(f"DELETE FROM {q} WHERE active = 0"))
    results, barrier = [], threading.Barrier(2)

    def allocate(part):
        n = NewIds(router)
        barrier.wait()
        n.prepare(part)
        results.append({legacy: n.new_id(tbl, legacy, shard) for tbl, legacy, shard in part})
    threads = [threading.Thread(target=allocate, args=(p,)) for p in (wanted[:45], wanted[15:])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    a, b = results
    assert all(a[k] == b[k] for k in a.keys() & b.keys()) and len(a.keys() & b.keys()) == 30
    every = {**a, **b}
    assert len(set(every.values())) == 60
    for legacy, new in every.items():
        d = ids.decode(new)
        assert d.shard == shards[(legacy - 2**45) % 2] and d.local > FLOOR
    for shard in shards:
        q = shard_table(shard, "comments")
        rows = router.query(router.host_for(shard), f"SELECT local_id FROM {q} WHERE active = 0 "
                            "AND local_id > %s", (FLOOR,), shard)
        assert sorted(r[0] for r in rows) == sorted(
            ids.decode(n).local for n in every.values() if ids.decode(n).shard == shard)


ZOMBIE, HEIR = FenceToken("t-alloc", 0, 1), FenceToken("t-alloc", 0, 2)


@pytest.fixture
def moved_pin(router):
    """A big legacy pin ID and two shards of one server it is placed on, the zombie's
    placement first; its slots, lookup and fences are deleted after."""
    legacy, s1, s2 = 2**52 + 77, SHARDS_B[0] + 2, SHARDS_B[0] + 5
    b = bucket_of(legacy_key("pin", legacy), router.shardmap.buckets)
    yield legacy, s1, s2, b
    router.run_mod(b, lambda cur: cur.execute(
        f"DELETE FROM {mod_table(b, 'legacy_id_map')} WHERE legacy_id = %s", (legacy,)))
    home = fencing.mod_home(router.shardmap, b)
    router.run_mod(home, lambda cur: cur.execute(
        f"DELETE FROM {mod_table(home, 'chunk_fences')} WHERE run_id = 't-alloc'"))
    for s in (s1, s2):
        def clean(cur, s=s) -> None:
            cur.execute(f"DELETE FROM {shard_table(s, 'pins')} WHERE local_id > %s", (FLOOR,))
            cur.execute(f"DELETE FROM {shard_table(s, 'chunk_fences')} "
                        "WHERE run_id = 't-alloc'")
        router.run(s, clean)


def _recorded(router, b: int, legacy: int) -> list[int]:
    q = mod_table(b, "legacy_id_map")
    return [int(r[0]) for r in router.run_mod(b, lambda cur: (cur.execute(
        f"SELECT new_id FROM {q} WHERE legacy_id = %s", (legacy,)), cur.fetchall())[1])]


def test_a_zombies_claim_after_its_successor_placed_the_id_elsewhere_is_refused(
        router, moved_pin):
    """The zombie looked the big ID up (nothing yet) and stalls; its successor, which reads
    the object placed on another shard, allocates and claims it. The zombie's claim would
    overwrite the successor's (a claim for another shard wins): the fence refuses it."""
    legacy, s1, s2, b = moved_pin
    zombie, heir = NewIds(router, token=ZOMBIE), NewIds(router, token=HEIR)
    real = zombie._lookup

    def stalled(keys):
        found = real(keys)
        heir.prepare([(SPEC["pins"], legacy, s2)])  # the successor, meanwhile
        return found
    zombie._lookup = stalled
    with pytest.raises(FencedError, match="fence 1 < 2"):
        zombie.prepare([(SPEC["pins"], legacy, s1)])
    assert _recorded(router, b, legacy) == [heir.new_id(SPEC["pins"], legacy, s2)]


def test_a_zombie_does_not_retire_the_slot_its_successor_wrote(router, moved_pin):
    """The successor placed the big ID on its shard and wrote the object there (fenced);
    the zombie, still placing it on its old shard, would retire that slot first: refused."""
    legacy, s1, s2, b = moved_pin
    heir = NewIds(router, token=HEIR)
    heir.prepare([(SPEC["pins"], legacy, s2)])
    new = heir.new_id(SPEC["pins"], legacy, s2)

    def write(cur) -> None:  # the successor's object row, fenced like its loader's
        fencing.check(cur, s2, HEIR)
        cur.execute(f"UPDATE {shard_table(s2, 'pins')} SET active = 1, data = %s "
                    "WHERE local_id = %s", (f'{{"legacy_id": {legacy}}}', new & ids.MAX_LOCAL))
    router.run(s2, write)
    with pytest.raises(FencedError, match="fence 1 < 2"):
        NewIds(router, token=ZOMBIE).prepare([(SPEC["pins"], legacy, s1)])
    q = shard_table(s2, "pins")
    assert router.query(router.host_for(s2), f"SELECT active FROM {q} WHERE local_id = %s",
                        (new & ids.MAX_LOCAL,), s2) == [(1,)]
    assert _recorded(router, b, legacy) == [new]


def _insert_waits(router, shard: int, q: str) -> int:
    """How many transactions on ``shard``'s server wait for a lock in an insert into ``q``
    (the barrier: the insert has taken its AUTO_INCREMENT values and waits). InnoDB
    refreshes what ``INNODB_TRX`` shows only after 0.1 s without a read: polled faster, it
    never changes (``until`` polls every 0.2 s)."""
    return router.query(router.host_for(shard), "SELECT COUNT(*) FROM information_schema."
                        "INNODB_TRX WHERE trx_state = 'LOCK WAIT' AND trx_query LIKE %s",
                        (f"INSERT INTO {q}%",), shard)[0][0]


def test_placeholders_racing_an_explicit_row_into_a_truncated_table_are_allocated_again(
        router):
    """A table truncated by hand has its counter back at 1. A placeholder insert took the
    values 1 and 2 and waited for a lock before writing them; meanwhile a legacy row wrote
    its own slot 1 (a small legacy ID is its local ID) and committed. The insert then hit
    that row: MySQL 1062 failed the chunk for good (seen in CI with two migrate runs
    loading one range). Now a duplicate there counts as a lost race: the counter is raised
    above 2**35 and the placeholders are inserted again."""
    shard = SHARDS_B[0] + 7
    q = shard_table(shard, "pins")
    router.run(shard, lambda cur: cur.execute(f"TRUNCATE TABLE {q}"))
    wanted = [(SPEC["pins"], 2**41 + i, shard) for i in (1, 2)]
    got, failed = [], []

    def allocate() -> None:
        n = NewIds(router)
        try:
            n.prepare(wanted)
            got.extend(n.new_id(tbl, legacy, s) for tbl, legacy, s in wanted)
        except Exception as exc:  # noqa: BLE001 - the test reports it
            failed.append(exc)
    with router.connection(router.host_for(shard), shard) as gate, gate.cursor() as cur:
        cur.execute("BEGIN")
        cur.execute(f"SELECT local_id FROM {q} WHERE local_id >= 0 FOR UPDATE")  # the gap
        t = threading.Thread(target=allocate)
        t.start()
        until(lambda: _insert_waits(router, shard, q), timeout=20, every=0.2,
              what=f"an insert into {q} waiting for the gap lock")
        cur.execute(f"INSERT INTO {q} (local_id, data, active) VALUES (1, %s, 1)",
                    ('{"legacy_id": 1}',))
        cur.execute("COMMIT")
    t.join(60)
    try:
        assert failed == [] and len(got) == 2
        assert all(ids.decode(g).local > FLOOR for g in got)
        rows = router.query(router.host_for(shard), f"SELECT local_id, active FROM {q} "
                            "ORDER BY local_id", (), shard)
        assert rows == [(1, 1), *sorted((ids.decode(g).local, 0) for g in got)]
    finally:
        router.run(shard, lambda cur: cur.execute(f"DELETE FROM {q}"))
