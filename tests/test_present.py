"""What the target holds for a selection, read from real shards and mod buckets."""

from __future__ import annotations

import json
from threading import Event

import pytest

from loaders.migration import present
from loaders.migration.present import Selection, held_links, held_objects
from sharding import ids
from sharding.modshard import bucket_of, legacy_key
from sharding.schema import mod_table, shard_table
from tests.conftest import SHARDS_A, SHARDS_B

LEGACY = 777_000_123  # a legacy pin ID below 2**35: its own local ID wherever it sits


@pytest.fixture
def two_slots(router):
    """Pin ``LEGACY`` active on two shards, ``legacy_id_map`` placing it on the first: the
    second is an old slot a placement change left behind."""
    mapped, stray = SHARDS_A[0] + 1, SHARDS_B[0] + 2
    doc = json.dumps({"legacy_id": LEGACY})
    bucket = bucket_of(legacy_key("pin", LEGACY), router.shardmap.buckets)
    new_id = ids.encode(mapped, ids.TYPES["pin"], LEGACY)
    for s in (mapped, stray):
        router.run(s, lambda cur, s=s: cur.execute(
            f"INSERT INTO {shard_table(s, 'pins')} (local_id, data, active) VALUES "
            "(%s, %s, 1)", (LEGACY, doc)))
    router.run_mod(bucket, lambda cur: cur.execute(
        f"INSERT INTO {mod_table(bucket, 'legacy_id_map')} (type_id, legacy_id, new_id) "
        "VALUES (%s, %s, %s)", (ids.TYPES["pin"], LEGACY, new_id)))
    yield new_id, ids.encode(stray, ids.TYPES["pin"], LEGACY)
    for s in (mapped, stray):
        router.run(s, lambda cur, s=s: cur.execute(
            f"DELETE FROM {shard_table(s, 'pins')} WHERE local_id = %s", (LEGACY,)))
    router.run_mod(bucket, lambda cur: cur.execute(
        f"DELETE FROM {mod_table(bucket, 'legacy_id_map')} WHERE legacy_id = %s", (LEGACY,)))


def test_a_selection_finds_old_slots_on_every_shard_unless_mapped_only(router, two_slots):
    mapped, stray = two_slots
    everywhere = held_objects(router, "pins", "pin", Selection.of([LEGACY]))
    assert set(everywhere.slots) == {mapped, stray} and everywhere.mapped == {LEGACY: mapped}
    narrow = held_objects(router, "pins", "pin", Selection.of([LEGACY], mapped_only=True))
    assert set(narrow.slots) == {mapped} and narrow.slots[mapped] == (LEGACY, {
        "legacy_id": LEGACY})


def test_mapped_only_finds_nothing_for_an_id_the_map_does_not_hold(router):
    held = held_objects(router, "pins", "pin", Selection.of([LEGACY + 1], mapped_only=True))
    assert held.slots == {} and held.mapped == {}


def test_a_selection_of_pairs_reads_only_those_pairs(router, monkeypatch):
    """Of its users' forward rows a pair selection holds exactly its pairs; the server
    sends no row of a pin none of the read users' pairs names."""
    shard, other = SHARDS_A[0] + 3, SHARDS_B[0] + 3
    user_t, pin_t = ids.TYPES["user"], ids.TYPES["pin"]
    u1, u2 = 900_000_001, 900_000_002
    rows = [(u1, 1), (u1, 2), (u1, 3), (u2, 1), (u2, 4)]  # (legacy user, legacy pin)
    q = shard_table(shard, "user_likes_pins")
    router.run(shard, lambda cur: cur.executemany(
        f"INSERT INTO {q} (from_id, to_id, sequence) VALUES (%s, %s, 0)",
        [(ids.encode(shard, user_t, u), ids.encode(other, pin_t, p)) for u, p in rows]))
    sent: list[tuple] = []
    real = router.query

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        sent.extend(out)
        return out
    monkeypatch.setattr(router, "query", spy)
    try:
        held = held_links(router, "user_likes_pins", Selection.of_pairs({(u1, 2), (u2, 4)}),
                          lambda u: shard)
    finally:
        router.run(shard, lambda cur: cur.execute(f"DELETE FROM {q} WHERE from_id IN (%s, %s)",
                                                  (ids.encode(shard, user_t, u1),
                                                   ids.encode(shard, user_t, u2))))
    assert held == {(ids.encode(shard, user_t, u), ids.encode(other, pin_t, p))
                    for u, p in ((u1, 2), (u2, 4))}
    # (u1, 4) would pass the server's filter had it existed; pins 1 and 3 never do
    assert sorted(int(b) & ids.MAX_LOCAL for _, b in sent) == [2, 4]


def test_union_statements_stay_within_their_parts_and_parameters():
    """Parts of different sizes (a pair filter's parameters vary) are cut by both limits."""
    parts, most = present.UNION_PARTS, present.MAX_PARAMS
    sizes = [1] * (parts + 5) + [most // 2 + 1] * 3 + [most + 7, 2]
    groups = present._groups([(f"p{i}", [0] * n) for i, n in enumerate(sizes)])
    assert [s for g in groups for s, _ in g] == [f"p{i}" for i in range(len(sizes))]
    for g in groups:
        params = sum(len(p) for _, p in g)
        assert len(g) <= parts and (params <= most or len(g) == 1)
    assert [len(g) for g in groups] == [parts, 6, 1, 1, 1, 1]


@pytest.mark.parametrize("where, queries", [(None, 8), (3, 1), (63, 8)],
                         ids=["none", "first-query", "last-query"])
def test_any_row_sends_queries_until_one_finds_a_row(router, monkeypatch, where, queries):
    """``any_row`` over the 64 test buckets in queries of 8 parts: it stops at the first
    query that returns a row (the planner's ``tables_empty`` on a loaded target)."""
    monkeypatch.setattr(present, "UNION_PARTS", 8)
    sent = []
    real = router.query
    monkeypatch.setattr(router, "query", lambda *a, **k: sent.append(1) or real(*a, **k))
    q = "legacy_id_map"
    if where is not None:
        router.run_mod(where, lambda cur: cur.execute(
            f"INSERT INTO {mod_table(where, q)} (type_id, legacy_id, new_id) VALUES (1, %s, 1)",
            (LEGACY,)))
    try:
        found = present.any_row(router, list(range(router.shardmap.buckets)),
                                router.shardmap.mod_master, lambda b: (
            f"(SELECT 1 FROM {mod_table(b, q)} WHERE legacy_id = {LEGACY} LIMIT 1)", []))
    finally:
        if where is not None:
            router.run_mod(where, lambda cur: cur.execute(
                f"DELETE FROM {mod_table(where, q)} WHERE legacy_id = %s", (LEGACY,)))
    assert (found, len(sent)) == (where is not None, queries)


@pytest.mark.parametrize("first_only, sent", [(True, (1, 1)), (False, (8, 8))],
                         ids=["first-only", "all"])
def test_scan_reads_the_servers_at_once_and_stops_both_at_a_row(router, monkeypatch,
                                                                first_only, sent):
    """``scan`` over the 16 test shards (8 on each server) in queries of one part; only the
    first shard of server A has a row. A's first query waits until B has sent its first (so
    the servers are read at once: one after the other never gets there), and B's first is
    held until A's thread has recorded that row: with ``first_only`` each server then sends
    no more (one query each), without it every shard is read; the rows are A's one row."""
    monkeypatch.setattr(present, "UNION_PARTS", 1)
    recorded = Event()

    class Recorded(Event):
        def set(self) -> None:
            super().set()
            recorded.set()
    monkeypatch.setattr(present, "Event", Recorded)
    a, b = (router.host_for(lo).server for lo, _ in (SHARDS_A, SHARDS_B))
    count = {a: 0, b: 0}
    b_sent = Event()
    real = router.query

    def query(host, sql, params=(), **kw):
        count[host.server] += 1
        if host.server == a and count[a] == 1:
            assert b_sent.wait(30), "server B was not read beside server A"
        if host.server == b and count[b] == 1:
            b_sent.set()
            assert recorded.wait(30), "server A's row was never recorded"
        return real(host, sql, params, **kw)
    monkeypatch.setattr(router, "query", query)
    shards = list(router.shardmap.shards())
    rows = present.scan(router, shards, router.host_for,
                        lambda s: (f"(SELECT {s} FROM DUAL WHERE {s} = {SHARDS_A[0]})", []),
                        first_only=first_only)
    assert (rows, (count[a], count[b])) == ([(SHARDS_A[0],)], sent)
