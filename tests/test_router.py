"""Router and pools: retries on dropped connections, clean errors, no bind values."""

import pymysql
import pytest

from shardfarm.errors import DatabaseError, UnreachableError
from shardfarm.retry import RetryPolicy
from sharding.mapsource import FixedSource, ShardMapSource
from sharding.router import Router
from sharding.schema import shard_table
from sharding.shardmap import ShardMap
from tests.conftest import SHARDS_A, SHARDS_B, TEST_BUCKETS, make_map_doc


def _connection_id(router, shard):
    return router.run(shard, lambda cur: (cur.execute("SELECT CONNECTION_ID()"),
                                          cur.fetchone()[0])[1])


def test_one_pool_per_server(router):
    ports = {router.host_for(s).port for s in (SHARDS_A[0], SHARDS_A[1], SHARDS_B[0])}
    assert len(ports) == 2
    for s in (SHARDS_A[0], SHARDS_A[1], SHARDS_B[0], SHARDS_B[1]):
        _connection_id(router, s)
    plain = [key for key in router._pools if key[-2:] == (False, False)]  # no capabilities
    assert len(plain) == 2


def test_killed_connection_is_retried(router, server_b):
    shard = SHARDS_B[0]
    cid = _connection_id(router, shard)
    admin = pymysql.connect(host="127.0.0.1", port=server_b.port, user="root", autocommit=True)
    with admin.cursor() as cur:
        cur.execute("KILL %s", (cid,))
    admin.close()
    assert _connection_id(router, shard) != cid  # the dead pooled connection was replaced


def test_errors_name_host_and_shard_but_not_values(router):
    shard = SHARDS_A[0]
    q = shard_table(shard, "user_has_pins")
    secret = 987654321987

    def dup(cur):
        cur.execute(f"INSERT INTO {q} (from_id, to_id, sequence) VALUES (%s, %s, 1)",
                    (secret, secret))
        cur.execute(f"INSERT INTO {q} (from_id, to_id, sequence) VALUES (%s, %s, 1)",
                    (secret, secret))
    with pytest.raises(DatabaseError) as exc:
        router.run(shard, dup)
    msg = str(exc.value)
    assert "TestA1" in msg and str(shard) in msg and str(secret) not in msg
    assert exc.value.code == 1062


def test_unreachable_server_is_bounded_and_clear(tmp_path):
    import json

    from tests.conftest import make_map_doc
    from tests.servers import free_port
    doc = make_map_doc(free_port())
    doc["hosts"]["TestB1"]["password"] = "s3cret"
    path = tmp_path / "m.json"
    path.write_text(json.dumps(doc))
    r = Router(ShardMapSource(path), policy=RetryPolicy(attempts=3, base=0.01, max_wait=0.05))
    with pytest.raises(UnreachableError) as exc:
        r.run(SHARDS_B[0], lambda cur: cur.execute("SELECT 1"))
    assert "TestB1" in str(exc.value) and "s3cret" not in str(exc.value)


def test_rollback_on_error(router):
    shard = SHARDS_B[1]
    q = shard_table(shard, "pin_has_comments")

    def half(cur):
        cur.execute(f"INSERT INTO {q} (from_id, to_id, sequence) VALUES (77, 78, 1)")
        raise RuntimeError("boom")
    with pytest.raises(RuntimeError):
        router.run(shard, half)
    n = router.run(shard, lambda cur: (cur.execute(f"SELECT COUNT(*) FROM {q} WHERE from_id=77"),
                                       cur.fetchone()[0])[1])
    assert n == 0


def _count(router, shard, q, from_id):
    return router.run(shard, lambda cur: (cur.execute(
        f"SELECT COUNT(*) FROM {q} WHERE from_id = %s", (from_id,)), cur.fetchone()[0])[1])


def test_server_groups_keep_each_group_on_one_server(router):
    shards = [*range(SHARDS_A[0], SHARDS_A[1] + 1), *range(SHARDS_B[0], SHARDS_B[1] + 1)]
    groups = router.server_groups(list(reversed(shards)), parts=2, most=3)
    assert sorted(s for g in groups for s in g) == shards
    for g in groups:
        assert g == sorted(g) and len(g) <= 3
        assert len({router.host_for(s).server for s in g}) == 1
    assert len(router.server_groups(shards, parts=2, most=100)) == 4  # 2 per server


def test_mod_groups_keep_each_group_on_one_server():
    """Buckets of two servers, interleaved: groups never mix them (pure: no connection)."""
    doc = make_map_doc(port_b=3399)
    doc["mod"]["ranges"] = [
        {"range": [0, 9], "master": "TestA1", "slave": "TestA2"},
        {"range": [10, 19], "master": "TestB1", "slave": "TestB2"},
        {"range": [20, TEST_BUCKETS - 1], "master": "TestA1", "slave": "TestA2"}]
    router = Router(FixedSource(ShardMap.from_dict(doc)))
    groups = router.mod_groups(reversed(range(TEST_BUCKETS)), most=16)
    assert sorted(b for g in groups for b in g) == list(range(TEST_BUCKETS))
    for g in groups:
        assert g == sorted(g) and len(g) <= 16
        assert len({router.shardmap.mod_master(b).port for b in g}) == 1
    assert [0, *range(1, 10), *range(20, 26)] in groups  # server A's first 16, across ranges
    assert router.mod_groups([12, 3, 12], most=16) == [[3], [12]]


def test_a_group_is_one_transaction_and_follows_a_changed_map(router):
    """Every shard of a group is written in one transaction (an error on the last one leaves
    none written); a group whose shards no longer share a server is written shard by shard."""
    from shardfarm.retry import NO_RETRY
    q = "pin_has_comments"
    group = router.server_groups(list(range(SHARDS_A[0], SHARDS_A[1] + 1)))[0]

    def write(cur, shard):
        cur.execute(f"INSERT INTO {shard_table(shard, q)} (from_id, to_id, sequence) "
                    "VALUES (91, %s, 1)", (shard,))
        if shard == group[-1]:
            raise RuntimeError("boom")
    with pytest.raises(RuntimeError):
        router.run_group(group, write, NO_RETRY)
    assert [_count(router, s, shard_table(s, q), 91) for s in group] == [0] * len(group)
    spanning = [SHARDS_A[0], SHARDS_B[0]]  # as if the map had moved one of them meanwhile
    router.run_group(spanning, lambda cur, s: cur.execute(
        f"INSERT INTO {shard_table(s, q)} (from_id, to_id, sequence) VALUES (92, 1, 1)"))
    assert [_count(router, s, shard_table(s, q), 92) for s in spanning] == [1, 1]
    for s in spanning:
        router.run(s, lambda cur, s=s: cur.execute(
            f"DELETE FROM {shard_table(s, q)} WHERE from_id = 92"))


def test_a_frozen_shard_refuses_its_whole_group(router):
    from shardfarm.errors import ShardFrozenError
    from shardfarm.retry import NO_RETRY
    from sharding import fencing
    q = "pin_has_comments"
    group = [SHARDS_A[0], SHARDS_A[0] + 1]
    version = router.shardmap.version
    router.run(group[1], lambda cur: fencing.set_state(cur, group[1], version, True))
    try:
        with pytest.raises(ShardFrozenError):
            router.run_group(group, lambda cur, s: cur.execute(
                f"INSERT INTO {shard_table(s, q)} (from_id, to_id, sequence) VALUES (93, 1, 1)"),
                NO_RETRY)
    finally:
        router.run_on(router.host_for(group[1]), lambda cur: fencing.set_state(
            cur, group[1], version, False))
    assert [_count(router, s, shard_table(s, q), 93) for s in group] == [0, 0]


def test_pool_recovers_when_every_idle_connection_was_killed(router, server_b):
    import threading
    shard = SHARDS_B[1]
    barrier = threading.Barrier(8)

    def hold():
        def tx(cur):
            barrier.wait(timeout=10)
            cur.execute("SELECT 1")
        router.run(shard, tx)
    threads = [threading.Thread(target=hold) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    admin = pymysql.connect(host="127.0.0.1", port=server_b.port, user="root", autocommit=True)
    with admin.cursor() as cur:
        cur.execute("SELECT id FROM information_schema.processlist WHERE id <> CONNECTION_ID() "
                    "AND user = 'root' AND command = 'Sleep'")
        for (pid,) in cur.fetchall():
            cur.execute("KILL %s", (pid,))
    admin.close()
    assert _connection_id(router, shard) > 0  # more dead idle connections than retries


@pytest.mark.slow
def test_frozen_transaction_is_rolled_back_so_the_heir_gets_its_locks(router, monkeypatch):
    """A worker frozen (or cut off) inside a fenced transaction must not hold the chunk's
    fence row for hours: the server ends its idle session, and the heir writes."""
    import threading
    import time

    from shardfarm.errors import TransientDatabaseError
    from shardfarm.mysql import pool
    from sharding import fencing
    monkeypatch.setattr(pool, "IDLE_TIMEOUT", 3)
    shard, host = SHARDS_A[0], router.host_for(SHARDS_A[0])
    frozen, heir = pool.Pool(host, size=1), pool.Pool(host, size=1)
    took: dict = {}

    def heir_writes() -> None:
        t0 = time.monotonic()
        try:
            with heir.connection(shard) as conn, conn.cursor() as cur:
                cur.execute("BEGIN")
                fencing.check(cur, shard, fencing.FenceToken("t-frozen", 0, 2))
                cur.execute("COMMIT")
            took["seconds"] = time.monotonic() - t0
        except Exception as exc:  # noqa: BLE001 - reported below
            took["error"] = exc
    with pytest.raises(TransientDatabaseError), frozen.connection(shard) as zombie:
        zcur = zombie.cursor()
        zcur.execute("BEGIN")
        fencing.check(zcur, shard, fencing.FenceToken("t-frozen", 0, 1))  # holds the row lock
        worker = threading.Thread(target=heir_writes)
        worker.start()
        worker.join()
        assert took.get("seconds", 99) < 20, took  # not innodb_lock_wait_timeout, nor hours
        zcur.execute("SELECT 1")  # the zombie wakes up: its session (and transaction) is gone
    router.run(shard, lambda cur: cur.execute(
        f"DELETE FROM {shard_table(shard, 'chunk_fences')} WHERE run_id = 't-frozen'"))


@pytest.mark.slow
def test_pool_does_not_hand_out_a_connection_the_server_may_have_closed(router, monkeypatch):
    import time

    from shardfarm.mysql import pool
    monkeypatch.setattr(pool, "IDLE_TIMEOUT", 6)
    shard = SHARDS_A[1]
    p = pool.Pool(router.host_for(shard), size=2)

    def cid() -> int:
        with p.connection(shard) as conn, conn.cursor() as cur:
            cur.execute("SELECT CONNECTION_ID()")
            return cur.fetchone()[0]
    first = cid()
    assert cid() == first  # reused while fresh
    time.sleep(1.5)  # past IDLE_TIMEOUT - 5: the pool drops it rather than risk error 2006
    assert cid() != first
    p.close()


def test_pool_never_reuses_a_connection_left_in_a_transaction_or_after_an_error(router):
    from shardfarm.errors import DatabaseError
    from shardfarm.mysql import pool
    shard = SHARDS_A[0]
    p = pool.Pool(router.host_for(shard), size=1)

    def session(*sql: str) -> tuple:
        with p.connection(shard) as conn, conn.cursor() as cur:
            for s in sql:
                cur.execute(s)
            return cur.fetchone()
    first, = session("START TRANSACTION", "SELECT CONNECTION_ID()")  # left open
    second, in_tx = session("SELECT CONNECTION_ID(), @@in_transaction")
    assert second != first and in_tx == 0
    assert session("SELECT CONNECTION_ID()")[0] == second  # a clean one is reused
    with pytest.raises(DatabaseError):
        session("START TRANSACTION", "SELECT * FROM no_such_table_here")
    assert session("SELECT CONNECTION_ID()")[0] != second
    p.close()


def test_pool_sessions_are_repeatable_read_whatever_the_servers_default():
    """A writer that locks a slot it found empty relies on REPEATABLE READ's gap lock to keep
    another row out of it: a server set to READ COMMITTED still gets such sessions."""
    from shardfarm.mysql import pool
    from shardfarm.mysql.dsn import Host
    from tests.servers import PrivateMariaDB
    server = PrivateMariaDB.launch({"innodb-buffer-pool-size": "32M",
                                    "transaction-isolation": "READ-COMMITTED"})
    try:
        assert server.sql("SELECT @@global.tx_isolation") == [("READ-COMMITTED",)]
        p = pool.Pool(Host("rc", server.host, server.port, "root"), size=1)
        with p.connection() as conn, conn.cursor() as cur:
            cur.execute("SELECT @@session.tx_isolation")
            assert cur.fetchone() == ("REPEATABLE-READ",)
        p.close()
    finally:
        server.stop()
