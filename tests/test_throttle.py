"""Throttle on replica lag: a run with ``max_lag`` waits while a slave of the map lags (or,
when it names them, one of the slaves of what it writes), and ``farm status`` says
THROTTLED with the host and the lag."""

from __future__ import annotations

import json

import pytest

from farmcore.ledger import ChunkSpec
from jobs import runs
from sharding.mapsource import ShardMapSource
from sharding.provision import create_shard
from sharding.router import Router
from tests.conftest import SHARDS_B, map_with_pair, run_farm
from tests.farmkit import start_workers, stop, until

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("park_leftover_runs")]
SHARD = SHARDS_B[1] + 9  # only ever on the private pair


def test_a_run_waits_while_a_slave_lags(repl_pair, server_b, env, rt, tmp_path):
    doc = map_with_pair(server_b.port, repl_pair)
    doc["shards"].append({"range": [SHARD, SHARD], "master": "PairM", "slave": "PairS"})
    path = tmp_path / "map.json"
    path.write_text(json.dumps(doc))
    router = Router(ShardMapSource(path))
    create_shard(router, router.shardmap.master(SHARD), SHARD)
    router.close()
    e = {**env, "FARM_SHARDMAP": str(path)}
    repl_pair.slave.sql("STOP SLAVE SQL_THREAD")  # the slave falls behind from now on
    try:
        assert "TestB2" in doc["hosts"] and "PairS" in doc["hosts"]
        elsewhere = runs.start(rt, "test", "tests.kinds.write_edges",
                               [ChunkSpec("edges", {"shard": SHARD, "start": 100, "count": 5})],
                               params={"max_lag": 2, "lag_hosts": ["TestB2"]})
        proc = start_workers(e, 1)
        try:  # a run that names the slaves it writes is not held back by another one
            assert runs.wait(rt, elsewhere, timeout=90) == "done"
        finally:
            stop(proc)
        run_id = runs.start(rt, "test", "tests.kinds.write_edges",
                            [ChunkSpec("edges", {"shard": SHARD, "start": 1, "count": 10})],
                            params={"max_lag": 2})
        proc = start_workers(e, 1)
        try:
            reason = until(lambda: json.loads(run_farm(e, "status", "--json", "--run", run_id)
                                              .stdout)["runs"][0]["throttled"],
                           what="throttled status")
            assert reason.startswith("PairS lag") and "> 2 s" in reason, reason
            assert rt.ledger.progress(run_id)[0]["done"] == 0
            text = run_farm(e, "status", "--run", run_id).stdout
            assert "THROTTLED" in text and "PairS lag" in text
            repl_pair.slave.sql("START SLAVE SQL_THREAD")
            assert runs.wait(rt, run_id, timeout=90) == "done"
        finally:
            stop(proc)
    finally:
        repl_pair.slave.sql("START SLAVE SQL_THREAD")
        repl_pair.master.sql(f"DROP DATABASE IF EXISTS db{SHARD:05d}")
