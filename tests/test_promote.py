"""``farm shards promote``: kill the master of a real pair, refuse a lagging slave, promote the
caught-up one, and keep writing."""

from __future__ import annotations

import json

import pytest

from sharding.mapsource import ShardMapSource
from sharding.objects import ObjectStore
from sharding.promote import missing
from sharding.provision import create_shard
from sharding.router import Router
from tests.conftest import SHARDS_B, map_with_pair, run_farm
from tests.farmkit import until
from tests.servers import ReplicationPair, slave_status

RANGE = (SHARDS_B[1] + 5, SHARDS_B[1] + 6)  # only ever on the private pair


def test_missing_names_each_domain_behind():
    assert missing("0-1-10,1-2-5", "0-1-10,1-2-4") == []
    assert missing("0-1-9", "0-1-10,1-2-3") == ["domain 0: 9 < 10", "domain 1: 0 < 3"]
    assert missing("0-1-9", "") == []


@pytest.fixture
def doomed_pair():
    pair = ReplicationPair.start(first_server_id=71)
    yield pair
    pair.stop()


def _pair_map(pair, server_b, farm_env: dict, tmp_path) -> tuple:
    """A map whose RANGE lives on ``pair`` (PairM/PairS), and the environment using it."""
    doc = map_with_pair(server_b.port, pair)
    doc["shards"].append({"range": list(RANGE), "master": "PairM", "slave": "PairS"})
    path = tmp_path / "map.json"
    path.write_text(json.dumps(doc))
    return path, {**farm_env, "FARM_SHARDMAP": str(path), "FARM_CONNECT_TIMEOUT": "3"}


@pytest.mark.slow
def test_kill_the_master_promote_the_slave_and_keep_writing(doomed_pair, server_b, farm_env,
                                                            tmp_path):
    pair = doomed_pair
    path, env = _pair_map(doomed_pair, server_b, farm_env, tmp_path)
    router = Router(ShardMapSource(path, interval=0))
    store = ObjectStore(router)
    for s in range(RANGE[0], RANGE[1] + 1):
        create_shard(router, router.shardmap.master(s), s)
    written = [store.create(RANGE[i % 2], "user", {"n": i}) for i in range(20)]
    pair.wait_caught_up()
    pair.slave.sql("STOP SLAVE SQL_THREAD")  # the slave receives but does not apply
    written += [store.create(RANGE[0], "user", {"n": i}) for i in range(20, 25)]
    sent = pair.master.sql("SELECT @@gtid_binlog_pos")[0][0]
    until(lambda: slave_status(pair.slave)["Gtid_IO_Pos"] == sent, timeout=30,
          what="the slave to receive everything")
    pair.master.kill()

    out = run_farm(env, "shards", "promote", "PairS", "--wait-seconds", "1")
    assert out.returncode == 1 and "PairS is behind its master PairM" in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert router.shardmap.version == 1

    pair.slave.sql("START SLAVE SQL_THREAD")
    out = run_farm(env, "shards", "promote", "PairS")
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout.splitlines()[-1])
    assert summary["version"] == 2 and summary["old_master"] == "PairM"
    assert not summary["accepted_loss"] and "provision a new slave of PairS" in out.stderr
    m = router.shardmap
    assert m.master(RANGE[0]).name == "PairS" and m.gone == {"PairM"}
    assert store.get_many(written).missing == []
    more = [store.create(RANGE[i % 2], "user", {"n": i}) for i in range(25, 35)]
    assert store.get_many(more).missing == []
    assert pair.slave.sql("SELECT @@read_only")[0][0] == 0
    router.close()


@pytest.mark.slow
def test_a_refused_promotion_leaves_a_live_master_writable(doomed_pair, server_b, farm_env,
                                                           tmp_path):
    """Promote makes a master that still answers read-only before it compares positions; a
    refusal (the slave is behind) gives it back its writes: the fleet stayed read-only."""
    pair = doomed_pair
    path, env = _pair_map(doomed_pair, server_b, farm_env, tmp_path)
    pair.slave.sql("STOP SLAVE SQL_THREAD")  # the slave receives but does not apply
    pair.master.sql("CREATE DATABASE IF NOT EXISTS promote_probe")
    out = run_farm(env, "shards", "promote", "PairS", "--wait-seconds", "1")
    assert out.returncode == 1 and "PairS is behind its master PairM" in out.stderr, out.stderr
    assert pair.master.sql("SELECT @@read_only")[0][0] == 0
    assert json.loads(path.read_text())["version"] == 1
