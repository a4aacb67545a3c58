"""Copying shard table ranges between two real servers: awkward text survives byte for byte,
a range copied again loses the rows the source lost, digests agree only on equal copies."""

from __future__ import annotations

import pytest

from loaders.capacity.copy import copy_range, digest, ranges
from sharding.provision import create_shard
from sharding.schema import shard_db, shard_table
from tests.conftest import SHARDS_A

SHARD = SHARDS_A[0] + 6
AWKWARD = ['{"a": "tab\\there"}', '{\n\t"pretty": [1,\r\n 2]\n}', '{"back": "\\\\ \\\\n"}',
           '{"u": "josé 🌍 \\u0000"}', '{"q": "\'\\"`"}', '{}', 'null', '"NULL"',
           '"\\\\N"']  # JSON null and strings a LOAD DATA could take for NULL


@pytest.fixture
def servers(router, server_b):
    src = router.host_for(SHARD)
    dst = router.shardmap.hosts["TestB1"]
    create_shard(router, dst, SHARD)
    q = shard_table(SHARD, "comments")
    router.run_on(src, lambda cur: (cur.execute(f"DELETE FROM {q}"), cur.executemany(
        f"INSERT INTO {q} (local_id, data, active) VALUES (%s, %s, %s)",
        [(i + 1, d, i % 2) for i, d in enumerate(AWKWARD)])), SHARD)
    yield src, dst
    router.run_on(src, lambda cur: cur.execute(f"DELETE FROM {q}"), SHARD)
    server_b.sql(f"DROP DATABASE IF EXISTS `{shard_db(SHARD)}`")


def _rows(router, host) -> list[tuple]:
    return router.query(host, f"SELECT local_id, CAST(data AS BINARY), active FROM "
                        f"{shard_table(SHARD, 'comments')} ORDER BY local_id", (), SHARD)


def test_a_copy_is_byte_for_byte_and_a_recopy_drops_what_the_source_lost(router, servers):
    src, dst = servers
    assert copy_range(None, router, src, dst, SHARD, "comments", None, None) == len(AWKWARD)
    assert _rows(router, dst) == _rows(router, src)
    assert digest(router, src, SHARD, "comments") == digest(router, dst, SHARD, "comments")
    router.run_on(src, lambda cur: cur.execute(
        f"DELETE FROM {shard_table(SHARD, 'comments')} WHERE local_id = 2"), SHARD)
    assert digest(router, src, SHARD, "comments") != digest(router, dst, SHARD, "comments")
    copy_range(None, router, src, dst, SHARD, "comments", 2, 4, replace_all=True)
    assert _rows(router, dst) == _rows(router, src)
    router.run_on(src, lambda cur: cur.execute(  # 8 rows: an even number of flipped flags
        f"UPDATE {shard_table(SHARD, 'comments')} SET active = 1 - active"), SHARD)
    assert digest(router, src, SHARD, "comments") != digest(router, dst, SHARD, "comments")


def test_ranges_cover_the_table_in_pieces_of_the_asked_size(router, servers):
    src, _ = servers
    spans = ranges(router, src, SHARD, "comments", 2)
    assert len(AWKWARD) == 9 and spans == [(None, 3), (3, 5), (5, 7), (7, 9), (9, None)]
    assert ranges(router, src, SHARD, "comments", 100) == [(None, None)]


@pytest.mark.parametrize("cap", [1 << 20, 130, 97, 64])
def test_mapping_lines_joined_by_the_server_or_cut_at_its_cap_all_arrive(router, servers,
                                                                         monkeypatch, cap):
    """A mapping range travels as each from ID's lines joined by the source server; from IDs
    whose lines pass the cap (a line missing, or the last one cut short inside its digits)
    are read again line by line: the copy is exact either way."""
    from loaders.capacity import copy as copier
    src, dst = servers
    q = shard_table(SHARD, "user_has_pins")
    edges = [(10_000 + u, 2**40 + 17 * u + k, 1_700_000_000 + k) for u in range(5)
             for k in range(u + 1)]  # from IDs with 1 to 5 lines
    router.run_on(src, lambda cur: (cur.execute(f"DELETE FROM {q}"), cur.executemany(
        f"INSERT INTO {q} (from_id, to_id, sequence) VALUES (%s, %s, %s)", edges)), SHARD)
    monkeypatch.setattr(copier, "GROUP_MAX", cap)
    try:
        assert copy_range(None, router, src, dst, SHARD, "user_has_pins", None, None,
                          replace_all=True) == len(edges)
        got = router.query(dst, f"SELECT from_id, to_id, sequence FROM {q}", (), SHARD)
        assert sorted(got) == sorted(edges)
    finally:
        router.run_on(src, lambda cur: cur.execute(f"DELETE FROM {q}"), SHARD)
