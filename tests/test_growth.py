"""``farm shards open``: a new range on a real replication pair takes a share of new users."""

from __future__ import annotations

import json

import pytest

from sharding.mapsource import ShardMapSource
from sharding.objects import ObjectStore
from sharding.placement import place_user
from sharding.router import Router
from sharding.schema import shard_db
from tests.conftest import SHARDS_A, SHARDS_B, map_with_pair, run_farm
from tests.servers import free_port

NEW = (SHARDS_B[1] + 1, SHARDS_B[1] + 4)  # only ever on the private pair


@pytest.fixture
def grown(tmp_path, server_b, repl_pair, farm_env, router):
    """A map file with the pair's hosts, a router over it, and the farm environment."""
    path = tmp_path / "map.json"
    path.write_text(json.dumps(map_with_pair(server_b.port, repl_pair)))
    r = Router(ShardMapSource(path, interval=0))
    yield path, r, {**farm_env, "FARM_SHARDMAP": str(path)}
    r.close()
    for s in range(NEW[0], NEW[1] + 1):
        repl_pair.master.sql(f"DROP DATABASE IF EXISTS `{shard_db(s)}`")


def test_open_puts_new_users_there_and_finds_every_earlier_one(grown, repl_pair):
    _, router, env = grown
    store = ObjectStore(router)
    before = [store.create(place_user(router.shardmap, k), "user", {"username": f"u{k}"})
              for k in range(40)]
    out = run_farm(env, "shards", "open", f"{NEW[0]}-{NEW[1]}", "--master", "PairM",
                   "--slave", "PairS", "--weight", "16")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[-1])["version"] == 2
    m = router.shardmap
    assert m.version == 2 and m.master(NEW[0]).name == "PairM"
    assert store.get_many(before).missing == []  # nobody moved
    placed = [place_user(m, k) for k in range(1000, 1400)]
    mine = [s for s in placed if NEW[0] <= s <= NEW[1]]
    assert 0.4 < len(mine) / len(placed) < 0.6  # weight 16 against 16 shards of weight 1
    ids_ = [store.create(s, "user", {"username": f"n{i}"}) for i, s in enumerate(mine[:20])]
    repl_pair.wait_caught_up()
    on_slave = sum(repl_pair.slave.sql(f"SELECT COUNT(*) FROM `{shard_db(s)}`.users")[0][0]
                   for s in range(NEW[0], NEW[1] + 1))
    assert on_slave == 20 and store.get_many(ids_).missing == []


@pytest.mark.parametrize("args, code, says", [
    ([f"{SHARDS_A[1]}-{NEW[0]}", "--master", "PairM", "--slave", "PairS"], 2, "overlap"),
    ([f"{NEW[0]}-{NEW[1]}", "--master", "Nope", "--slave", "PairS"], 2, "not a host"),
    ([f"{NEW[1]}-{NEW[0]}", "--master", "PairM", "--slave", "PairS"], 2, "bad shard range"),
    ([f"{NEW[0]}-{NEW[1]}", "--master", "Dead", "--slave", "PairS"], 1, "Dead is unreachable"),
    ([f"{NEW[0]}-{NEW[1]}", "--master", "PairM", "--slave", "PairM"], 2, "both name PairM"),
    ([f"{NEW[0]}-{NEW[1]}", "--master", "PairM", "--slave", "Gone"], 2, "Gone is marked gone"),
])
def test_open_refuses_in_one_line(grown, args, code, says):
    path, _, env = grown
    doc = json.loads(path.read_text())
    doc["hosts"]["Dead"] = {"host": "127.0.0.1", "port": free_port(), "user": "root"}
    doc["hosts"]["Gone"] = {**doc["hosts"]["PairS"]}  # answers, but marked gone
    doc["gone"] = ["Gone"]
    path.write_text(json.dumps(doc))
    out = run_farm({**env, "FARM_CONNECT_TIMEOUT": "2"}, "shards", "open", *args)
    assert out.returncode == code, out.stderr
    assert says in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert json.loads(path.read_text())["version"] == 1
