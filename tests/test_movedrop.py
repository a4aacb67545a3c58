"""``farm shards move --drop-source``: every source copy is checked before any is dropped, and a
drop that stopped half way is finished when run again. The source copies here live only on
the session's private second server (shards past the test map's), never on the shared one."""

from __future__ import annotations

import json

import pytest

from loaders.capacity import move as capmove
from shardfarm.errors import FatalError
from sharding import fencing
from sharding.mapsource import ShardMapSource
from sharding.provision import create_shard
from sharding.router import Router
from sharding.schema import shard_db
from tests.conftest import SHARDS_B, make_map_doc

R = (SHARDS_B[1] + 40, SHARDS_B[1] + 42)  # only ever on the private second server
SHARDS = range(R[0], R[1] + 1)


@pytest.fixture
def sources(server_b, tmp_path):
    """A router over a map with R on TestB1 (the private server), its shards created there;
    every one of them is dropped after the test."""
    doc = make_map_doc(server_b.port)
    doc["shards"].append({"range": list(R), "master": "TestB1", "slave": "TestB2"})
    path = tmp_path / "map.json"
    path.write_text(json.dumps(doc))
    router = Router(ShardMapSource(path, interval=0))
    for s in SHARDS:
        create_shard(router, router.shardmap.hosts["TestB1"], s)
    yield router
    router.close()
    for s in SHARDS:
        server_b.sql(f"DROP DATABASE IF EXISTS `{shard_db(s)}`")


def _record(router: Router, versions: dict[int, int]) -> None:
    host = router.shardmap.hosts["TestB1"]
    for s, v in versions.items():
        router.run_on(host, lambda cur, s=s, v=v: fencing.set_state(cur, s, v, False), s)


def _there(server_b) -> list[int]:
    names = {r[0] for r in server_b.sql("SHOW DATABASES")}
    return [s for s in SHARDS if shard_db(s) in names]


def test_a_source_that_has_not_recorded_the_move_stops_the_drop_before_any(sources, server_b):
    """The middle shard has not recorded the flip: nothing is dropped, not even the first
    shard (which had), and the line names the one that has not."""
    plan = capmove.MovePlan(R[0], R[1], "TestA1", "TestA2", 1, dict.fromkeys(SHARDS, "TestB1"))
    _record(sources, {R[0]: 2, R[0] + 1: 1, R[1]: 2})
    with pytest.raises(FatalError) as err:
        capmove.drop_sources(sources, plan)
    assert f"{shard_db(R[0] + 1)} on TestB1 has not recorded the move" in str(err.value)
    assert "nothing dropped" in str(err.value) and shard_db(R[0]) not in str(err.value)
    assert _there(server_b) == list(SHARDS)


def test_a_drop_that_stopped_half_way_finishes_when_run_again(sources, server_b):
    """The first source copy is already gone (the drop that stopped half way dropped it):
    it counts as dropped, not as an 'Unknown database' error, and the rest are dropped."""
    plan = capmove.MovePlan(R[0], R[1], "TestA1", "TestA2", 1, dict.fromkeys(SHARDS, "TestB1"))
    _record(sources, dict.fromkeys(SHARDS, 2))
    server_b.sql(f"DROP DATABASE `{shard_db(R[0])}`")
    dropped = capmove.drop_sources(sources, plan)
    assert dropped == [f"TestB1:{shard_db(s)}" for s in SHARDS]
    assert _there(server_b) == []
    assert capmove.drop_sources(sources, plan) == dropped  # and once more: nothing left


def test_a_drop_that_lost_its_lock_stops_before_the_next_drop(sources, server_b, env, settings,
                                                              ledger, monkeypatch):
    """The move lock's connection is killed while ``--drop-source`` is stopped just before
    its second DROP (the lock of that shard checked already): another move of these shards
    could run now, so it drops no shard after that one and says so in one line; run again,
    it drops the rest."""
    from loaders.capacity.movelock import lock_name
    from tests import faults
    plan = capmove.MovePlan(R[0], R[1], "TestA1", "TestA2", 1, dict.fromkeys(SHARDS, "TestB1"))
    _record(sources, dict.fromkeys(SHARDS, 2))
    path = str(sources.source.path)
    args = {"shardmap": path, "env": {**env, "FARM_SHARDMAP": path}, "plan": plan.params}
    monkeypatch.setenv("FARM_FAULT_MATCH", "DROP DATABASE")
    with faults.frozen("drop_sources", args, 2, rc=1) as proc:
        (holder,), = ledger.pool.query("SELECT IS_USED_LOCK(%s)",
                                       (lock_name(settings.control_dsn.database, R[0]),))
        faults.kill(ledger.pool, holder)
    monkeypatch.delenv("FARM_FAULT_MATCH")
    assert "MoveLockLostError" in proc.err and "lost its locks" in proc.err, proc.err
    assert f"before dropping TestB1:{shard_db(R[1])}" in proc.err, proc.err
    assert _there(server_b) == [R[1]]
    assert capmove.drop_sources(sources, plan) == [f"TestB1:{shard_db(s)}" for s in SHARDS]
    assert _there(server_b) == []
