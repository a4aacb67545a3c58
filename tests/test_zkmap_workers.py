"""Running workers on a ZooKeeper map switch to a published version between chunks, and a
chunk that started with the old map cannot write to a shard the new map moved."""

from __future__ import annotations

import json
import uuid

import pytest
import redis

from farmcore.ledger import ChunkSpec
from jobs import runs
from sharding import fencing, ids
from sharding.mappublish import publish
from sharding.schema import shard_table
from tests.conftest import SHARDS_A, make_map_doc
from tests.farmkit import start_workers, stop, until

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("park_leftover_runs")]
SHARD = SHARDS_A[0] + 5


def _map(port_b: int, version: int) -> str:
    return json.dumps({**make_map_doc(port_b), "version": version})


def _versions(r: redis.Redis, key: str) -> list[int]:
    return [int(v) for v in r.lrange(key, 0, -1)]


@pytest.fixture
def clean_shard(router):
    yield
    with router.transaction(router.host_for(SHARD)) as cur:
        cur.execute(f"DELETE FROM {shard_table(SHARD, 'shard_state')}")
        cur.execute(f"DELETE FROM {shard_table(SHARD, 'user_has_pins')} WHERE from_id = %s",
                    (ids.encode(SHARD, "user", 9),))


def test_workers_switch_maps_and_a_stale_chunk_write_is_refused(zk_server, server_b, env, rt,
                                                                 router, clean_shard):
    url = zk_server.url(f"/e2e/{uuid.uuid4().hex}")
    publish(url, _map(server_b.port, 1))
    r = redis.Redis.from_url(env["FARM_REDIS_URL"])
    workers = start_workers({**env, "FARM_SHARDMAP": url}, 1)
    try:
        old = runs.start(rt, "probe", "tests.kinds.map_probe",
                         [ChunkSpec("probe", {"shard": SHARD, "key": "old", "pin": 1})])
        until(lambda: _versions(r, "old:started"), what="the chunk to start with version 1")
        publish(url, _map(server_b.port, 2))  # the shard moved by version 2 (as a move does)
        with router.transaction(router.host_for(SHARD)) as cur:
            fencing.set_state(cur, SHARD, 2, False)
        r.set("old:go", 1)
        assert runs.wait(rt, old, timeout=90) == "done"
        new = runs.start(rt, "probe", "tests.kinds.map_probe",
                         [ChunkSpec("probe", {"shard": SHARD, "key": "new", "pin": 2})])
        r.set("new:go", 1)
        assert runs.wait(rt, new, timeout=60) == "done"
    finally:
        out = stop(workers)
    started = _versions(r, "old:started")
    assert started[0] == 1 and started[-1] == 2, (started, out[-3000:])
    assert _versions(r, "old:wrote") == [2]  # the attempt routed with version 1 wrote nothing
    assert "StaleMapError" in out
    assert _versions(r, "new:started") == [2] and _versions(r, "new:wrote") == [2]
    rows = router.run(SHARD, lambda cur: (cur.execute(
        f"SELECT to_id, sequence FROM {shard_table(SHARD, 'user_has_pins')} WHERE from_id = %s "
        "ORDER BY to_id", (ids.encode(SHARD, "user", 9),)), cur.fetchall())[1], role="slave")
    assert [(ids.decode(p).local, n) for p, n in rows] == [(1, 1), (2, 1)]
