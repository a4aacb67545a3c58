"""``farm shards status``: roles, shards, lag, read-only and the map version each host was told."""

from __future__ import annotations

import json

from sharding.growth import open_range
from sharding.mapsource import ShardMapSource
from sharding.router import Router
from sharding.schema import shard_db
from tests.conftest import SHARDS_A, SHARDS_B, map_with_pair, run_farm
from tests.servers import free_port

NEW = (SHARDS_B[1] + 12, SHARDS_B[1] + 13)  # only ever on the private pair


def test_status_shows_each_host_as_its_server_sees_it(tmp_path, server_b, repl_pair, farm_env,
                                                      router):
    doc = map_with_pair(server_b.port, repl_pair)
    doc["hosts"]["Dead"] = {"host": "127.0.0.1", "port": free_port(), "user": "root"}
    path = tmp_path / "map.json"
    path.write_text(json.dumps(doc))
    grown = Router(ShardMapSource(path, interval=0))
    try:
        open_range(grown, str(path), NEW[0], NEW[1], "PairM", "PairS")
        repl_pair.wait_caught_up()
        env = {**farm_env, "FARM_SHARDMAP": str(path), "FARM_CONNECT_TIMEOUT": "2"}
        out = run_farm(env, "shards", "status", "--json")
        assert out.returncode == 0, out.stderr
        hosts = {h["host"]: h for h in json.loads(out.stdout)["hosts"]}
        m, s = hosts["PairM"], hosts["PairS"]
        assert (m["role"], m["master_of"], m["map_version"]) == ("master", [list(NEW)], 2)
        assert m["lag_seconds"] is None and m["replicates_from"] is None
        assert (s["role"], s["slave_of"], s["map_version"]) == ("slave", [list(NEW)], 2)
        assert s["lag_seconds"] == 0
        assert s["replicates_from"] == f"127.0.0.1:{repl_pair.master.port}"
        assert hosts["TestA1"]["master_of"] == [list(SHARDS_A)]
        assert hosts["Dead"]["reachable"] is False and hosts["Dead"]["role"] == "spare"
        text = run_farm(env, "shards", "status").stdout
        assert "shard map version 2" in text and "UNREACHABLE" in text
        assert any(line.startswith("PairS") and "lag 0" in line and "told v2" in line
                   for line in text.splitlines()), text
    finally:
        grown.close()
        for shard in range(NEW[0], NEW[1] + 1):
            repl_pair.master.sql(f"DROP DATABASE IF EXISTS `{shard_db(shard)}`")
