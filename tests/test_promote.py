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
    router, store, written = _seeded(pair, path, 20)
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
                                                           tmp_path, ledger):
    """Promote makes a master that still answers read-only before it compares positions; a
    refusal (the slave is behind) gives it back its writes and forgets its record of it:
    the fleet stayed read-only. A record it cannot write refuses it before it changes
    anything."""
    pair = doomed_pair
    path, env = _pair_map(doomed_pair, server_b, farm_env, tmp_path)
    pair.slave.sql("STOP SLAVE SQL_THREAD")  # the slave receives but does not apply
    pair.master.sql("CREATE DATABASE IF NOT EXISTS promote_probe")
    nowhere = {**env, "FARM_CONTROL_DSN": env["FARM_CONTROL_DSN"] + "_not_there"}
    out = run_farm(nowhere, "shards", "promote", "PairS", "--wait-seconds", "1")
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 1 and len(lines) == 1, out.stderr
    assert "cannot record in the control database that PairM is being made read-only" \
        in lines[0] and "nothing changed" in lines[0], lines
    assert pair.master.sql("SELECT @@read_only")[0][0] == 0

    out = run_farm(env, "shards", "promote", "PairS", "--wait-seconds", "1")
    assert out.returncode == 1 and "PairS is behind its master PairM" in out.stderr, out.stderr
    assert pair.master.sql("SELECT @@read_only")[0][0] == 0
    assert json.loads(path.read_text())["version"] == 1
    assert _left(ledger) == []


def _left(ledger) -> list[tuple[str, str]]:
    """``(master, promoting)`` of every master an unfinished promote recorded."""
    from farmcore.readonly import ReadOnlyMasters
    return [(r.master, r.promoting) for r in ReadOnlyMasters(ledger.pool).listed()]


def _seeded(pair, path, rows: int = 10) -> tuple[Router, ObjectStore, list[int]]:
    """Shards of RANGE on the pair's master with ``rows`` users in them, applied by the
    slave."""
    router = Router(ShardMapSource(path, interval=0))
    store = ObjectStore(router)
    for s in range(RANGE[0], RANGE[1] + 1):
        create_shard(router, router.shardmap.master(s), s)
    written = [store.create(RANGE[i % 2], "user", {"n": i}) for i in range(rows)]
    pair.wait_caught_up()
    return router, store, written


def _promote_frozen_before_writable(env: dict, path, rc: int, meanwhile) -> str:
    """``farm shards promote PairS`` in a child stopped just before the slave takes writes
    (its replication already stopped and reset), ``meanwhile()`` run there; its stderr."""
    from tests import faults
    os_env = {"FARM_FAULT_MATCH": "read_only = 0"}  # the slave's SET GLOBAL read_only = 0
    args = {"shardmap": str(path), "env": env, "argv": ["shards", "promote", "PairS"]}
    with _environ(os_env), faults.frozen("farm", args, 1, rc=rc) as proc:
        meanwhile()
    return proc.err


class _environ:
    """Set environment variables for the block (a child started inside inherits them)."""

    def __init__(self, values: dict[str, str]) -> None:
        self.values, self.saved = values, {}

    def __enter__(self) -> None:
        import os
        self.saved = {k: os.environ.get(k) for k in self.values}
        os.environ.update(self.values)

    def __exit__(self, *exc) -> None:
        import os
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.mark.slow
def test_a_promote_whose_map_write_fails_says_so_and_finishes_when_run_again(
        doomed_pair, server_b, farm_env, tmp_path):
    """The slave is made writable, then the map cannot be reached: one line says the slave
    is writable, the map may not name it, run the same command again; that run (and any
    later one) finishes the map change without touching the data."""
    pair = doomed_pair
    path, env = _pair_map(pair, server_b, farm_env, tmp_path)
    router, store, written = _seeded(pair, path)
    pair.master.kill()
    hidden = tmp_path / "map.hidden"
    err = _promote_frozen_before_writable(env, path, 1, lambda: path.rename(hidden))
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "PairS was made a writable master (replication reset)" in lines[0], err
    assert "run 'farm shards promote PairS' again to finish" in lines[0], err
    assert pair.slave.sql("SELECT @@read_only")[0][0] == 0 and slave_status(pair.slave) == {}
    hidden.rename(path)  # the map is back, still naming the old master
    assert json.loads(path.read_text())["version"] == 1

    out = run_farm(env, "shards", "promote", "PairS", "--wait-seconds", "1")
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout.splitlines()[-1])
    assert summary["version"] == 2 and summary["old_master"] == "PairM", summary
    m = router.shardmap
    assert m.master(RANGE[0]).name == "PairS" and m.gone == {"PairM"}
    assert store.get_many(written).missing == []
    assert store.get_many([store.create(RANGE[0], "user", {"n": 99})]).missing == []

    out = run_farm(env, "shards", "promote", "PairS")  # once more: nothing left to do
    assert out.returncode == 0, out.stderr
    again = json.loads(out.stdout.splitlines()[-1])
    assert again == {"promoted": "PairS", "already_promoted": True, "version": 2}, again
    assert json.loads(path.read_text())["version"] == 2
    router.close()


@pytest.mark.slow
def test_a_promote_refuses_a_map_that_no_longer_has_the_host_as_that_slave(
        doomed_pair, server_b, farm_env, tmp_path):
    """Another operator publishes a map giving the range a new slave while the promote runs
    (a stale actor): the promote writes no map naming a master it did not check, and does
    not mark the still-serving master gone; it says what it left behind."""
    pair = doomed_pair
    path, env = _pair_map(pair, server_b, farm_env, tmp_path)
    router, _, _ = _seeded(pair, path)
    pair.master.kill()

    def republish() -> None:
        doc = json.loads(path.read_text())
        doc["version"] = 2
        for entry in doc["shards"]:
            if entry["range"] == list(RANGE):
                entry["slave"] = "TestB2"
        out = run_farm(env, "shards", "publish", "-", input=json.dumps(doc))
        assert out.returncode == 0, out.stderr
    err = _promote_frozen_before_writable(env, path, 1, republish)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "the shard map changed meanwhile (version 2 " in lines[0], err
    assert "PairS was made a writable master" in lines[0], err
    doc = json.loads(path.read_text())
    assert doc["version"] == 2 and "gone" not in doc, doc
    router.close()


@pytest.mark.slow
def test_a_promote_killed_before_any_of_its_statements_finishes_when_run_again(
        doomed_pair, server_b, farm_env, tmp_path, ledger):
    """SIGKILL ``farm shards promote`` just before each MySQL statement it sends, in turn
    (the old master still answers); running the same command again always ends with the
    slave writable and replicating nothing, the old master read-only, and the map naming
    the slave, with every row there and no record of an unfinished promote left."""
    from tests import faults
    from tests.servers import ReplicationPair
    pair = doomed_pair
    path, env = _pair_map(pair, server_b, farm_env, tmp_path)
    router, store, written = _seeded(pair, path)
    original = path.read_text()
    args = {"shardmap": str(path), "env": env, "argv": ["shards", "promote", "PairS"]}

    def reset() -> None:
        path.write_text(original)
        pair.master.sql("SET GLOBAL read_only = 0")
        ReplicationPair.replicate(pair.slave, pair.master)
        pair.slave.sql("SET GLOBAL read_only = 1")
    reset()
    steps = faults.steps("farm", args)
    assert any("RESET SLAVE ALL" in s for s in steps), steps
    for n in range(1, len(steps) + 1):
        reset()
        assert faults.run_killed("farm", args, n) == -9, n
        out = run_farm(env, "shards", "promote", "PairS", "--wait-seconds", "1")
        assert out.returncode == 0, (n, steps[n - 1], out.stderr)
        m = ShardMapSource(path, interval=0).current()
        assert m.version == 2 and m.master(RANGE[0]).name == "PairS", (n, steps[n - 1])
        assert pair.slave.sql("SELECT @@read_only")[0][0] == 0 and slave_status(pair.slave) == {}
        assert pair.master.sql("SELECT @@read_only")[0][0] == 1, n
        assert store.get_many(written).missing == [], n
        assert _left(ledger) == [], n  # finished: nothing left to finish or undo
    router.close()


@pytest.mark.slow
def test_a_refusal_after_a_killed_promote_says_the_old_master_is_left_read_only(
        doomed_pair, server_b, farm_env, tmp_path, ledger):
    """A promote killed right after it made the live master read-only (before it could
    compare positions, refuse and give the writes back): the control database records it
    (written before the SET), and 'farm shards status' lists it with the command that
    finishes the promote and the statement that undoes it. The next run, refused because
    the slave is still behind, found the master read-only: its one line says the master
    stays read-only and how to give it its writes, and the record stays until then."""
    from tests import faults
    pair = doomed_pair
    path, env = _pair_map(pair, server_b, farm_env, tmp_path)
    pair.slave.sql("STOP SLAVE SQL_THREAD")  # the slave receives but does not apply
    pair.master.sql("CREATE DATABASE IF NOT EXISTS promote_probe")
    args = {"shardmap": str(path), "env": env,
            "argv": ["shards", "promote", "PairS", "--wait-seconds", "1"]}
    # step 1: the SELECT @@gtid_binlog_pos right after SET GLOBAL read_only = 1
    with _environ({"FARM_FAULT_MATCH": "@@gtid_binlog_pos"}):
        assert faults.run_killed("farm", args, 1) == -9
    assert pair.master.sql("SELECT @@read_only")[0][0] == 1
    assert _left(ledger) == [("PairM", "PairS")]
    _assert_status_lists_pairm(env)
    out = run_farm(env, "shards", "promote", "PairS", "--wait-seconds", "1")
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 1 and len(lines) == 1, out.stderr
    assert "PairS is behind its master PairM" in lines[0], lines
    assert "PairM stays read-only as this promote found it" in lines[0], lines
    assert "run SET GLOBAL read_only = 0 on it" in lines[0], lines
    assert json.loads(path.read_text())["version"] == 1
    assert _left(ledger) == [("PairM", "PairS")]
    _assert_status_lists_pairm(env)
    pair.master.sql("SET GLOBAL read_only = 0")  # what the line says: it takes writes again
    pair.master.sql("CREATE DATABASE IF NOT EXISTS promote_probe2")
    out = run_farm(env, "shards", "status", "--json")  # undone by hand: not listed any more
    assert out.returncode == 0 and json.loads(out.stdout)["unfinished_promotes"] == [], out
    ledger.pool.execute("DELETE FROM promote_read_only WHERE master = 'PairM'")


def _assert_status_lists_pairm(env: dict) -> None:
    """'farm shards status' (text and JSON) lists PairM as left read-only by an unfinished
    promote of PairS, with what finishes and what undoes it."""
    out = run_farm(env, "shards", "status")
    assert out.returncode == 0, out.stderr
    line, = [x for x in out.stdout.splitlines() if x.startswith("UNFINISHED PROMOTE")]
    assert "PairM may be left read-only by an unfinished 'farm shards promote PairS'" in line
    assert "run 'farm shards promote PairS' to finish it" in line, line
    assert "SET GLOBAL read_only = 0 on PairM to undo it" in line, line
    out = run_farm(env, "shards", "status", "--json")
    assert out.returncode == 0, out.stderr
    left, = json.loads(out.stdout)["unfinished_promotes"]
    assert (left["master"], left["promoting"]) == ("PairM", "PairS"), left
    assert left["finish"] == "farm shards promote PairS", left
