"""``shards init``: every database and table on its master, on both servers, idempotently."""

import pymysql

from sharding.provision import init_databases
from sharding.schema import MAPPING_TABLES, MOD_FARM_TABLES, MOD_TABLES, OBJECT_TABLES
from tests.conftest import SHARDS_A, SHARDS_B, TEST_BUCKETS


def _tables(port: int, like: str) -> dict[str, set[str]]:
    conn = pymysql.connect(host="127.0.0.1", port=port, user="root")
    with conn.cursor() as cur:
        cur.execute("SELECT table_schema, table_name FROM information_schema.tables "
                    "WHERE table_schema LIKE %s", (like,))
        out: dict[str, set[str]] = {}
        for db, t in cur.fetchall():
            out.setdefault(db, set()).add(t)
    conn.close()
    return out


def test_every_table_on_its_master(router, server_b):
    expected = {*OBJECT_TABLES, *MAPPING_TABLES, "board_followedby_user_shard", "chunk_fences",
                "shard_state"}
    a = _tables(3306, "db6%")  # the suite's namespace (FARM_TEST_NS) picks among db6xxxx
    b = _tables(server_b.port, "db6%")
    for s in range(SHARDS_A[0], SHARDS_A[1] + 1):
        assert a[f"db{s:05d}"] == expected
        assert f"db{s:05d}" not in b
    for s in range(SHARDS_B[0], SHARDS_B[1] + 1):
        assert b[f"db{s:05d}"] == expected
    mods = _tables(server_b.port, "mod%")
    assert len(mods) == TEST_BUCKETS
    assert all(t == {*MOD_TABLES, *MOD_FARM_TABLES} for t in mods.values())


def test_init_is_idempotent_and_keeps_rows(router):
    from sharding.objects import ObjectStore
    oid = ObjectStore(router).create(SHARDS_B[0], "user", {"username": "keep"})
    rep = init_databases(router)
    assert rep.shards == 16 and rep.buckets == TEST_BUCKETS and rep.servers == 2
    assert ObjectStore(router).get(oid).data == {"username": "keep"}


def test_init_lifts_object_counters_to_the_allocated_half(router):
    """Tables made before the local ID space was split (counter below 2**35) are raised;
    a counter already above stays where it is."""
    from sharding.schema import shard_table
    low, high = SHARDS_A[0] + 5, SHARDS_B[0] + 5
    for shard, counter in ((low, 1000), (high, 2**35 + 500)):
        q = shard_table(shard, "comments")
        router.run(shard, lambda cur, q=q, c=counter: (
            cur.execute(f"TRUNCATE TABLE {q}"),
            cur.execute(f"ALTER TABLE {q} AUTO_INCREMENT = {c}")))
    init_databases(router)
    for shard, want in ((low, 2**35), (high, 2**35 + 500)):
        got = router.query(router.host_for(shard), "SELECT AUTO_INCREMENT FROM "
                           "information_schema.tables WHERE table_schema = %s AND "
                           "table_name = 'comments'", (f"db{shard:05d}",), shard)
        assert got[0][0] == want
