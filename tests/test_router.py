"""Router and pools: retries on dropped connections, clean errors, no bind values."""

import pymysql
import pytest

from shardfarm.errors import DatabaseError, UnreachableError
from shardfarm.retry import RetryPolicy
from sharding.router import Router
from sharding.schema import shard_table
from sharding.shardmap import ShardMapSource
from tests.conftest import SHARDS_A, SHARDS_B


def _connection_id(router, shard):
    return router.run(shard, lambda cur: (cur.execute("SELECT CONNECTION_ID()"),
                                          cur.fetchone()[0])[1])


def test_one_pool_per_server(router):
    ports = {router.host_for(s).port for s in (SHARDS_A[0], SHARDS_A[1], SHARDS_B[0])}
    assert len(ports) == 2
    for s in (SHARDS_A[0], SHARDS_A[1], SHARDS_B[0], SHARDS_B[1]):
        _connection_id(router, s)
    assert len(router._pools) == 2


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
