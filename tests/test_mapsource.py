"""A map reload never splits a chunk: a chunk routes with one map from start to end, and a
reload that re-buckets or moves mod buckets waits while a run is active (real MariaDB
servers, real Redis, the real control database)."""

from __future__ import annotations

import dataclasses
import json
import logging
import threading

import pytest
import redis

from farmcore import control_schema
from farmcore.ledger import ChunkSpec
from jobs import lifecycle, runtime
from jobs.runtime import Runtime
from shardfarm.mysql.db import connect, ensure_database
from sharding import mapsource
from sharding.mapsource import ShardMapSource, bucket_change
from sharding.shardmap import ShardMap
from tests.conftest import TEST_BUCKETS, make_map_doc, ns_db
from tests.farmkit import until


def _moved(doc: dict) -> dict:
    """The same map with every mod bucket moved from server B to server A (3306)."""
    out = json.loads(json.dumps(doc))
    out["mod"]["ranges"] = [{"range": [0, TEST_BUCKETS - 1], "master": "TestA1",
                             "slave": "TestA2"}]
    out["version"] += 1
    return out


def _write(path, doc: dict) -> None:
    path.write_text(json.dumps(doc))


@pytest.fixture
def own_map(tmp_path, server_b):
    path = tmp_path / "map.json"
    doc = make_map_doc(server_b.port)
    _write(path, doc)
    return path, doc


@pytest.fixture
def private_control(settings):
    """A control database of this test's own (the session's ledger holds other tests' runs,
    and whether any run is active is what the guard asks)."""
    dsn = dataclasses.replace(settings.control_dsn, database=ns_db("farm_control_mapsource"))
    ensure_database(dsn)
    control_schema.ensure(dsn)
    yield dsn
    conn = connect(dsn, database=False)
    with conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS `{dsn.database}`")
    conn.close()


def test_bucket_change_names_re_bucketing_moves_and_re_cuts_but_not_promotions(server_b):
    doc = make_map_doc(server_b.port)
    old = ShardMap.from_dict(doc)
    assert bucket_change(old, ShardMap.from_dict(doc)) is None
    promoted = json.loads(json.dumps(doc))
    promoted["mod"]["ranges"][0].update(master="TestB2", slave="TestB1")
    assert bucket_change(old, ShardMap.from_dict(promoted)) is None
    assert "moves from TestB1 to TestA1" in bucket_change(old, ShardMap.from_dict(_moved(doc)))
    more = json.loads(json.dumps(doc))
    more["mod"]["buckets"] = TEST_BUCKETS * 2
    more["mod"]["ranges"][0]["range"] = [0, TEST_BUCKETS * 2 - 1]
    assert "mod.buckets changes from 64 to 128" in bucket_change(old, ShardMap.from_dict(more))
    recut = json.loads(json.dumps(doc))  # same server, two ranges: their fences move
    whole = recut["mod"]["ranges"][0]
    recut["mod"]["ranges"] = [{**whole, "range": [0, 31]}, {**whole, "range": [32, 63]}]
    assert "re-cut from 0-63 to 0-31, 32-63" in bucket_change(old, ShardMap.from_dict(recut))


def test_a_reload_that_moves_buckets_waits_while_a_run_is_active(settings, private_control,
                                                                  own_map, monkeypatch, caplog):
    monkeypatch.setattr(mapsource, "GUARD_RETRY", 0.0)
    path, doc = own_map
    rt = Runtime(settings.with_(control_dsn=private_control, shardmap_path=path))
    rt.router.source.interval = 0
    try:
        run_id = rt.ledger.create_run("test", "farm", {"handler": "tests.kinds.sleepy"},
                                      [ChunkSpec("nap", {"seconds": 0})])
        _write(path, _moved(doc))
        with caplog.at_level(logging.ERROR, logger="sharding.mapsource"):
            for _ in range(3):
                assert rt.router.shardmap.mod_master(0).name == "TestB1"
        said = [r.getMessage() for r in caplog.records if "not reloading" in r.getMessage()]
        assert len(said) == 1 and f"while run {run_id} is active" in said[0]
        assert "mod bucket 0 moves from TestB1 to TestA1" in said[0]
        lease = rt.ledger.claim(run_id, 0, "me")
        rt.ledger.fail(lease, "done with the test", None)
        rt.ledger.refresh_status(run_id)  # no run is active any more: the reload goes ahead
        assert rt.router.shardmap.mod_master(0).name == "TestA1"
    finally:
        rt.close()


def test_a_change_that_keeps_buckets_in_place_reloads_during_a_run(settings, private_control,
                                                                    own_map):
    path, doc = own_map
    rt = Runtime(settings.with_(control_dsn=private_control, shardmap_path=path))
    rt.router.source.interval = 0
    try:
        rt.ledger.create_run("test", "farm", {"handler": "tests.kinds.sleepy"},
                             [ChunkSpec("nap", {"seconds": 0})])
        promoted = json.loads(json.dumps(doc))
        promoted["mod"]["ranges"][0].update(master="TestB2", slave="TestB1")
        promoted["version"] += 1
        _write(path, promoted)
        assert rt.router.shardmap.version == doc["version"] + 1
    finally:
        rt.close()


def test_a_chunk_routes_with_one_map_from_start_to_end(settings, ledger, own_map, server_b):
    """The map moves every bucket to another server while the chunk is half way (a barrier in
    the handler): the chunk's second half still goes where its first half went."""
    path, doc = own_map
    rt = Runtime(settings.with_(shardmap_path=path))
    rt.router.source = ShardMapSource(path, interval=0)  # no guard: the chunk must hold alone
    conn = redis.Redis.from_url(settings.redis_url)
    key = "test:mod_ports"
    conn.delete(key, f"{key}:half", f"{key}:go")
    runtime.install(rt)
    try:
        run_id = ledger.create_run("test", "farm", {"handler": "tests.kinds.mod_ports"},
                                   [ChunkSpec("ports", {"buckets": list(range(8)), "key": key})])
        worker = threading.Thread(target=lifecycle.execute, args=(rt, run_id, 0))
        worker.start()
        until(lambda: conn.get(f"{key}:half"), what="the chunk to reach its half way barrier")
        _write(path, _moved(doc))
        assert rt.router.shardmap.mod_master(0).name == "TestA1"  # the process reloaded
        conn.rpush(f"{key}:go", 1)
        worker.join(timeout=60)
        ports = {int(p) for p in conn.lrange(key, 0, -1)}
        assert ledger.chunk(run_id, 0)["state"] == "done"
        assert ports == {server_b.port}
    finally:
        conn.delete(key, f"{key}:half", f"{key}:go")
        rt.close()
