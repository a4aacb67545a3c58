"""``shards init``: every database and table on its master, on both servers, idempotently."""

import pymysql
import pytest

from sharding.provision import (
    REDO_MIN,
    _cache_advice,
    _redo_advice,
    init_databases,
    server_advice,
)
from sharding.schema import MAPPING_TABLES, MOD_FARM_TABLES, MOD_TABLES, OBJECT_TABLES
from tests.conftest import SHARDS_A, SHARDS_B, TEST_BUCKETS
from tests.servers import PrivateMariaDB


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


@pytest.fixture
def own_server():
    """A private server as MariaDB ships it (96M redo log, table caches 2000 and 400): tuning
    it changes nothing another test shares."""
    server = PrivateMariaDB.start()
    conn = server.connect()
    try:
        yield conn.cursor()
    finally:
        conn.close()
        server.stop()


def _variables(cur, *names):
    cur.execute("SELECT " + ", ".join(f"@@{n}" for n in names))
    return cur.fetchone()


def test_a_small_redo_log_is_named_and_tune_raises_it_online(own_server):
    cur = own_server
    assert _variables(cur, "innodb_log_file_size") == (96 << 20,)
    (line,) = _redo_advice(cur, "server X", tune=False)
    assert line.startswith("server X has innodb_log_file_size=96M: bulk loads rewrite") \
        and "'farm shards init --tune'" in line, line
    assert _variables(cur, "innodb_log_file_size") == (96 << 20,)  # advice alone changes nothing
    assert _redo_advice(cur, "server X", tune=True) == [
        "raised innodb_log_file_size of server X from 96M to 1024M (until it restarts)"]
    assert _variables(cur, "innodb_log_file_size") == (REDO_MIN,)
    assert _redo_advice(cur, "server X", tune=True) == []  # large enough: nothing to say


def test_small_table_caches_are_named_and_tune_raises_them(own_server):
    cur = own_server
    (line,) = _cache_advice(cur, "server X", 5000, tune=False)
    assert line.startswith("server X holds 5000 tables but table_open_cache=2000, "
                           "table_definition_cache=400: raise both to at least 5000"), line
    assert _cache_advice(cur, "server X", 5000, tune=True) == [
        "raised table_open_cache and table_definition_cache of server X to 6000 for its 5000 "
        "tables (until it restarts)"]
    assert _variables(cur, "table_open_cache", "table_definition_cache") == (6000, 6000)
    assert _cache_advice(cur, "server X", 5000, tune=False) == []


def test_server_advice_names_each_server_and_redo_false_skips_the_redo_log(router, server_b):
    lines = server_advice(router)  # advice only: the shared server is left as it is
    b = f"server {server_b.host}:{server_b.port}"
    assert any(line.startswith(f"{b} has innodb_log_file_size=") for line in lines), lines
    assert not any("innodb_log_file_size" in line for line in server_advice(router, redo=False))
