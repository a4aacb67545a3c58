"""Fleet-wide commands against a server that does not answer: one retry budget in all,
however many shards and buckets live there (never one budget per database), and one line
naming the host by its name in the map and ``user@host:port``."""

from __future__ import annotations

import json
import subprocess
import time

import pymysql
import pytest

from shardfarm.errors import UnreachableError
from sharding.mapsource import ShardMapSource
from sharding.provision import init_databases
from sharding.router import Router
from tests.conftest import run_farm
from tests.proxy import TcpProxy
from tests.servers import free_port

SHARDS = 4096
BUCKETS = 4096


def dead_map(port: int, shards: int = SHARDS, buckets: int = BUCKETS) -> dict:
    """Every shard and mod bucket on host ``Dead`` at ``127.0.0.1:port``."""
    dead = {"host": "127.0.0.1", "port": port, "user": "root", "password": "dead-map-pw"}
    return {"version": 1, "hosts": {"Dead": dead, "DeadB": dict(dead)},
            "shards": [{"range": [0, shards - 1], "master": "Dead", "slave": "DeadB"}],
            "open": [[0, shards - 1]],
            "mod": {"buckets": buckets, "ranges": [{"range": [0, buckets - 1],
                                                    "master": "Dead", "slave": "DeadB"}]}}


def _env_with_map(farm_env: dict, tmp_path, doc: dict, budget: str) -> dict:
    path = tmp_path / "dead.json"
    path.write_text(json.dumps(doc))
    return {**farm_env, "FARM_SHARDMAP": str(path), "FARM_CONNECT_TIMEOUT": budget}


def _one_line_within(env: dict, seconds: float, *command: str) -> str:
    """Run ``farm COMMAND``; it must fail with exit 1 and one line within ``seconds``."""
    t0 = time.monotonic()
    try:
        out = run_farm(env, *command, timeout=seconds + 30)
    except subprocess.TimeoutExpired:
        pytest.fail(f"farm {' '.join(command)} still running after {seconds + 30:g} s")
    took = time.monotonic() - t0
    assert out.returncode == 1, out.stdout + out.stderr
    assert took < seconds, f"took {took:.1f} s"
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "Traceback" not in out.stderr and "dead-map-pw" not in out.stderr + out.stdout
    return lines[0]


def test_shards_init_gives_up_on_a_refusing_server_at_once(farm_env, tmp_path):
    """8,192 databases on a server that refuses: before, each was retried on its own (about
    25 minutes); now one line in seconds."""
    port = free_port()
    env = _env_with_map(farm_env, tmp_path, dead_map(port), "10")
    line = _one_line_within(env, 15, "shards", "init")
    assert line.startswith(f"farm: error: cannot reach MySQL Dead (root@127.0.0.1:{port})")
    assert "refused" in line and "FARM_SHARDMAP" in line


@pytest.fixture
def silent():
    proxy = TcpProxy.silent()
    yield proxy
    proxy.stop()


def test_shards_init_gives_up_on_a_silent_server_within_the_budget(farm_env, tmp_path, silent):
    """A server that accepts and never answers: one FARM_CONNECT_TIMEOUT in all (before,
    four databases at a time waited that long each)."""
    env = _env_with_map(farm_env, tmp_path, dead_map(silent.port), "2")
    line = _one_line_within(env, 12, "shards", "init")
    assert f"cannot reach MySQL Dead (root@127.0.0.1:{silent.port})" in line
    assert "no MySQL handshake within FARM_CONNECT_TIMEOUT=2 s" in line


def test_a_server_that_starts_refusing_midway_stops_init_within_the_budget(
        server_b, tmp_path, monkeypatch):
    """The check up front passes (its one connection is let through), then every new
    connection is refused: the first database that fails stops the rest, instead of each
    of the 576 being retried in turn."""
    monkeypatch.setenv("FARM_CONNECT_TIMEOUT", "2")
    shards = 512
    before = _shard_dbs(server_b.port)
    with TcpProxy.start(server_b.port) as proxy:
        proxy.admit(1)
        path = tmp_path / "far.json"
        doc = dead_map(proxy.port, shards=shards, buckets=64)
        for h in doc["hosts"].values():
            h["password"] = ""
        path.write_text(json.dumps(doc))
        router = Router(ShardMapSource(path))
        t0 = time.monotonic()
        try:
            with pytest.raises(UnreachableError, match=f"Dead \\(root@127.0.0.1:{proxy.port}"):
                init_databases(router)
            took = time.monotonic() - t0
        finally:
            router.close()
    try:
        assert proxy.accepted > 1  # the check's connection, then refused ones
        assert took < 8, f"took {took:.1f} s"
    finally:
        for db in _shard_dbs(server_b.port) - before:  # what this test made there
            _sql(server_b.port, f"DROP DATABASE `{db}`")


def _sql(port: int, statement: str) -> list[tuple]:
    conn = pymysql.connect(host="127.0.0.1", port=port, user="root", autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute(statement)
            return list(cur.fetchall())
    finally:
        conn.close()


def _shard_dbs(port: int) -> set[str]:
    return {r[0] for r in _sql(port, "SHOW DATABASES LIKE 'db0%'")}


def test_shards_status_asks_a_silent_server_once_for_all_its_host_names(
        farm_env, tmp_path, silent):
    """Eight host names on one silent server: before, each waited FARM_CONNECT_TIMEOUT in
    turn (16 s here, 27 minutes for 80 pairs at the default); now one wait, and a live host
    beside them is still read."""
    doc = dead_map(silent.port)
    for i in range(2, 8):
        doc["hosts"][f"Dead{i}"] = dict(doc["hosts"]["Dead"])
    doc["hosts"]["Live"] = {"host": "127.0.0.1", "port": 3306, "user": "root", "password": ""}
    env = _env_with_map(farm_env, tmp_path, doc, "2")
    t0 = time.monotonic()
    out = run_farm(env, "shards", "status", "--json", timeout=60)
    took = time.monotonic() - t0
    assert out.returncode == 1 and out.stderr.startswith(  # after the whole document
        "farm: error: 8 host(s) of the map do not answer: Dead, DeadB, Dead2,"), out.stderr
    assert took < 8, f"took {took:.1f} s"
    hosts = {h["host"]: h for h in json.loads(out.stdout)["hosts"]}
    dead = [h for name, h in hosts.items() if name != "Live"]
    assert len(dead) == 8 and not any(h["reachable"] for h in dead)
    assert all("no MySQL handshake within FARM_CONNECT_TIMEOUT=2 s" in h["error"] for h in dead)
    assert hosts["Live"]["reachable"] is True and hosts["Live"]["role"] == "spare"
    assert "dead-map-pw" not in out.stdout + out.stderr
