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
           '{"u": "josé 🌍 \\u0000"}', '{"q": "\'\\"`"}', '{}']


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
    router.run_on(src, lambda cur: cur.execute(
        f"UPDATE {shard_table(SHARD, 'comments')} SET active = 1 - active"), SHARD)
    assert digest(router, src, SHARD, "comments") != digest(router, dst, SHARD, "comments")


def test_ranges_cover_the_table_in_pieces_of_the_asked_size(router, servers):
    src, _ = servers
    spans = ranges(router, src, SHARD, "comments", 2)
    assert spans == [(None, 3), (3, 5), (5, None)]
    assert ranges(router, src, SHARD, "comments", 100) == [(None, None)]
