"""Object store across two real servers: create, multi-get, read-modify-write, soft delete."""

import threading

import pytest

from shardfarm.errors import NotFoundError
from sharding import ids
from sharding.objects import ObjectStore
from tests.conftest import SHARDS_A, SHARDS_B


@pytest.fixture
def store(router):
    return ObjectStore(router)


def test_create_assigns_local_id_on_the_shard(store):
    oid = store.create(SHARDS_A[0] + 1, "pin", {"details": "hello"})
    d = ids.decode(oid)
    assert (d.shard, d.type_name) == (SHARDS_A[0] + 1, "pin") and d.local >= 2**35
    assert store.get(oid).data == {"details": "hello"}


def test_create_never_takes_a_legacy_slot_even_after_a_truncate(store, router):
    """A table truncated by hand (counter back to 1) still allocates from 2**35 up, and the
    insert that got a lower ID is rolled back, not left behind."""
    from sharding.schema import shard_table
    shard = SHARDS_B[0] + 2
    q = shard_table(shard, "comments")
    router.run(shard, lambda cur: cur.execute(f"TRUNCATE TABLE {q}"))
    oid = store.create(shard, "comment", {"body": "after truncate"})
    assert ids.decode(oid).local == 2**35
    rows = router.query(router.host_for(shard), f"SELECT local_id FROM {q}", (), shard)
    assert rows == [(2**35,)]


def test_get_many_across_servers_in_requested_order(store):
    docs = {"a": "plain", "b": "emoji 😀 and quotes \" ' \\ and\nnewline", "c": "nul \x00 x"}
    made = []
    for i, (k, text) in enumerate(docs.items()):
        made.append(store.create(SHARDS_A[0] + i, "board", {"k": k, "text": text}))
        made.append(store.create(SHARDS_B[0] + i, "user", {"k": k, "text": text}))
    missing_b = ids.encode(SHARDS_B[1], "pin", 2**36 - 1)
    missing_a = ids.encode(SHARDS_A[1], "comment", 2**36 - 2)
    order = [made[3], missing_b, made[0], made[5], missing_a, made[2], made[1], made[4]]
    res = store.get_many(order)
    assert [o.id for o in res.found] == [i for i in order if i not in (missing_a, missing_b)]
    assert res.missing == [missing_b, missing_a]
    by_id = res.by_id()
    assert by_id[made[2]].data["text"] == docs["b"]
    assert by_id[made[5]].data["text"] == docs["c"]


def test_soft_delete_hides_and_restores(store):
    oid = store.create(SHARDS_B[1], "comment", {"body": "x"})
    assert store.delete(oid)
    assert store.get_many([oid]).missing == [oid]
    assert store.get(oid, include_inactive=True).active is False
    with pytest.raises(NotFoundError):
        store.update(oid, lambda d: d)
    store.set_active(oid, True)
    assert store.get(oid).active


def test_concurrent_updates_lose_nothing(store):
    oid = store.create(SHARDS_B[0], "board", {"followers": 0})
    per_thread, threads = 25, 8

    def bump(doc):
        doc["followers"] += 1

    def work():
        for _ in range(per_thread):
            store.update(oid, bump)
    ts = [threading.Thread(target=work) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert store.get(oid).data["followers"] == per_thread * threads


def test_new_fields_are_added_with_defaults_on_read(store):
    oid = store.create(SHARDS_A[0], "user", {"username": "old"})
    doc = {"theme": "light", **store.get(oid).data}
    assert doc == {"theme": "light", "username": "old"}
