"""``farm shards move`` with the map in ZooKeeper: the node in force puts the range on its new
pair; --dry-run changes nothing (it lists the copies --drop-source would drop);
--drop-source drops the source copies with --yes, never without."""

from __future__ import annotations

import json
import uuid

import pytest

from sharding.mappublish import publish
from sharding.mapsource import open_source
from sharding.objects import ObjectStore
from sharding.router import Router
from sharding.schema import shard_db
from tests.conftest import SHARDS_B, map_with_pair, run_farm
from tests.farmkit import start_workers, stop

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("park_leftover_runs")]
R = (SHARDS_B[1] + 20, SHARDS_B[1] + 21)  # opened on the private pair by the test


def _dbs(server) -> set[str]:
    return {r[0] for r in server.sql("SHOW DATABASES") if r[0] in {shard_db(s) for s in
                                                                    range(R[0], R[1] + 1)}}


def _move(env: dict, to: str, *extra: str) -> dict:
    out = run_farm(env, "shards", "move", f"{R[0]}-{R[1]}", "--to", to, "--wait", *extra)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


def test_move_through_zookeeper_and_drop_the_source(zk_server, server_b, repl_pair, env):
    url = zk_server.url(f"/move/{uuid.uuid4().hex}")
    publish(url, json.dumps(map_with_pair(server_b.port, repl_pair)))
    e = {**env, "FARM_SHARDMAP": url}
    out = run_farm(e, "shards", "open", f"{R[0]}-{R[1]}", "--master", "PairM", "--slave", "PairS")
    assert out.returncode == 0, out.stderr
    source = open_source(url)
    workers = start_workers(e, 2)
    try:
        store = ObjectStore(Router(source))
        made = [store.create(R[i % 2], "board", {"name": f"b{i}"}) for i in range(50)]
        refused = run_farm(e, "shards", "move", f"{R[0]}-{R[1]}", "--to", "TestB1/TestB2",
                           "--drop-source")
        assert refused.returncode == 2 and "without --yes" in refused.stderr, refused.stderr
        preview = _move(e, "TestB1/TestB2", "--drop-source", "--dry-run")
        assert preview["dry_run"] and preview["version"] == 3 and preview["chunks"] > 0
        assert preview["would_drop"] == [f"PairM:{shard_db(s)}" for s in R]
        assert source.current().master(R[0]).name == "PairM"  # nothing moved
        assert source.current().version == 2 and _dbs(server_b) == set()
        first = _move(e, "TestB1/TestB2")
        assert first["version"] == 3 and "dropped" not in first
        assert source.current().master(R[0]).name == "TestB1"  # the node in force says so
        assert _dbs(repl_pair.master) == {shard_db(R[0]), shard_db(R[1])}  # nothing dropped
        store.delete(made[0])  # a change on the new home, then back to the pair
        second = _move(e, "PairM/PairS", "--drop-source", "--yes", "--grace", "0")
        assert second["version"] == 4 and second["dropped"] == [
            f"TestB1:{shard_db(R[0])}", f"TestB1:{shard_db(R[1])}"]
        assert source.current().master(R[1]).name == "PairM"
        assert _dbs(server_b) == set()
        assert store.get_many(made).missing == [made[0]]
        assert second["rows"]["boards"] == 50
    finally:
        stop(workers)
        source.close()
        for s in range(R[0], R[1] + 1):
            repl_pair.master.sql(f"DROP DATABASE IF EXISTS `{shard_db(s)}`")
            server_b.sql(f"DROP DATABASE IF EXISTS `{shard_db(s)}`")
