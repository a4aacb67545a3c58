"""``farm shards status``: roles, shards, lag, read-only and the map version each host was told;
exit 1 naming the hosts that do not answer (but one the map marks gone)."""

from __future__ import annotations

import json

from sharding.growth import open_range
from sharding.mapsource import ShardMapSource
from sharding.router import Router
from sharding.schema import shard_db
from tests.conftest import SHARDS_A, SHARDS_B, make_map_doc, map_with_pair, run_farm
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
        assert out.returncode == 1, out.stderr  # Dead does not answer
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


def _map_env(server_b, farm_env: dict, tmp_path, dead: tuple[str, ...] = (),
             gone: tuple[str, ...] = ()) -> dict:
    """The environment of the test map plus hosts ``dead`` that refuse connections, of which
    the map marks ``gone`` as gone."""
    doc = make_map_doc(server_b.port)
    for name in dead:
        doc["hosts"][name] = {"host": "127.0.0.1", "port": free_port(), "user": "root"}
    doc["gone"] = list(gone)
    path = tmp_path / "map.json"
    path.write_text(json.dumps(doc))
    return {**farm_env, "FARM_SHARDMAP": str(path), "FARM_CONNECT_TIMEOUT": "2"}


def test_status_exits_1_naming_the_hosts_that_do_not_answer(server_b, farm_env, tmp_path,
                                                           router):
    """Before, it printed UNREACHABLE beside them and exited 0: a script or a check watching
    the fleet with 'farm shards status' saw a healthy fleet."""
    env = _map_env(server_b, farm_env, tmp_path, ("Dead1", "Dead2", "Old"), gone=("Old",))
    line = ("farm: error: 2 host(s) of the map do not answer: Dead1, Dead2 (their entries "
            "above say why; a host the map marks gone is not counted)")
    text = run_farm(env, "shards", "status")
    assert text.returncode == 1 and text.stderr.splitlines() == [line], text.stderr
    rows = text.stdout.splitlines()
    assert rows[0] == "shard map version 1" and len(rows) == 8, text.stdout  # the table, whole
    assert sum("UNREACHABLE" in r for r in rows) == 3  # Old too: gone, and said so
    out = run_farm(env, "shards", "status", "--json")
    assert out.returncode == 1 and out.stderr.splitlines() == [line], out.stderr
    hosts = {h["host"]: h for h in json.loads(out.stdout)["hosts"]}
    assert [n for n, h in hosts.items() if not h["reachable"]] == ["Dead1", "Dead2", "Old"]
    assert hosts["Old"]["role"] == "gone"


def test_status_of_a_fleet_that_answers_exits_0(server_b, farm_env, tmp_path, router):
    """Every host answers (one the map marks gone may not): exit 0, nothing on stderr."""
    env = _map_env(server_b, farm_env, tmp_path, ("Old",), gone=("Old",))
    out = run_farm(env, "shards", "status")
    assert (out.returncode, out.stderr) == (0, ""), out.stderr
    (old,) = [r for r in out.stdout.splitlines() if "UNREACHABLE" in r]
    assert old.startswith("Old "), out.stdout
