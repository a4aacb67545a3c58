"""Worker hosts as real network hosts (tests/netns.py): three "machines" in their own network
namespaces and host names, each running 'farm workers', reaching a private MariaDB and
Redis over their own addresses on a bridge (the servers listen on the bridge address, not
127.0.0.1). 'farm scale --host' moves one machine's workers only; a machine whose link is
cut mid-chunk loses its leases and its chunks finish elsewhere; when the link comes back,
the zombie's late write and its late "done" are refused by the fence, and the target is
exact. If the kernel refuses namespaces the tests fail (they never skip)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from farmcore.ledger import ChunkSpec, Ledger
from jobs import runs
from jobs.runtime import Runtime
from shardfarm.settings import Settings
from sharding import ids
from tests.conftest import NS, ROOT, run_farm
from tests.faults import wait_until
from tests.netns import NetLab, NetLabError
from tests.servers import PrivateMariaDB, PrivateRedis

pytestmark = pytest.mark.slow  # real namespaces, servers and supervisors
SHARDS = (0, 3)


def _map(host: str, port: int) -> dict:
    h = {"host": host, "port": port, "user": "root", "password": ""}
    return {"version": 1, "hosts": {"NetA": h, "NetB": dict(h)},
            "shards": [{"range": list(SHARDS), "master": "NetA", "slave": "NetB"}],
            "open": [list(SHARDS)],
            "mod": {"buckets": 4, "ranges": [{"range": [0, 3], "master": "NetA",
                                              "slave": "NetB"}]}}


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """The namespaces, the servers on the bridge address, the farm set up, and an idle
    supervisor (``--count 0``) on each machine."""
    try:
        net = NetLab.build(NS, 3)
    except NetLabError as exc:
        pytest.fail(f"cannot build network namespaces here: {exc}")
    db = rds = None
    try:
        db = PrivateMariaDB.launch({"innodb-buffer-pool-size": "64M", "skip-name-resolve": "1",
                                    "innodb-flush-log-at-trx-commit": "2",
                                    "max-connections": "300"}, bind=net.gateway)
        rds = PrivateRedis.start(bind=net.gateway)
        tmp = tmp_path_factory.mktemp("net")
        (tmp / "map.json").write_text(json.dumps(_map(net.gateway, db.port)))
        env = {**os.environ, "FARM_SHARDMAP": str(tmp / "map.json"),
               "FARM_CONTROL_DSN": f"mysql://root@{net.gateway}:{db.port}/farm_control",
               "FARM_LEGACY_DSN": f"mysql://root@{net.gateway}:{db.port}/legacy",
               "FARM_REDIS_URL": rds.url(), "FARM_LEASE_SECONDS": "3",
               "FARM_LOG_LEVEL": "INFO", "PYTHONPATH": str(ROOT)}
        out = run_farm(env, "shards", "init")
        assert out.returncode == 0, out.stderr
        for m in net.machines:
            log = open(tmp / f"{m}.log", "wb")  # noqa: SIM115 - closed with the process
            net.popen(m, [sys.executable, "-m", "scripts", "workers", "--count", "0"],
                      env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        yield {"net": net, "env": env, "db": db, "redis": rds, "tmp": tmp}
    finally:
        net.teardown()
        for server in (rds, db):
            if server is not None:
                server.stop()


def workers_by_host(env: dict) -> dict[str, int]:
    """Live workers per host, from 'farm status --json' (rq's registry, as operators see)."""
    out = run_farm(env, "status", "--json")
    assert out.returncode == 0, out.stderr
    return {h: w["workers"] for h, w in json.loads(out.stdout)["workers"].items()}


def scale(env: dict, count: int, host: str) -> None:
    out = run_farm(env, "scale", str(count), "--host", host)
    assert out.returncode == 0, out.stderr


def wait_workers(env: dict, want: dict[str, int]) -> None:
    wait_until(lambda: {h: n for h, n in workers_by_host(env).items() if n} == want,
               f"workers per host {want}", timeout=90)


def test_scale_host_moves_only_that_hosts_workers_over_its_own_address(lab):
    env, net = lab["env"], lab["net"]
    scale(env, 2, "m2")
    wait_workers(env, {"m2": 2})
    scale(env, 1, "m3")
    wait_workers(env, {"m2": 2, "m3": 1})
    scale(env, 0, "m2")
    wait_workers(env, {"m3": 1})
    # they came over their own links, not over loopback
    clients = redis.Redis.from_url(env["FARM_REDIS_URL"]).client_list()
    addrs = {c["addr"].rsplit(":", 1)[0] for c in clients}
    assert net.address("m3") in addrs and net.address("m1") in addrs
    assert "127.0.0.1" not in addrs
    hosts = {r[0].rsplit(":", 1)[0] for r in lab["db"].sql(
        "SELECT host FROM information_schema.PROCESSLIST")}
    machines = {net.address(m) for m in net.machines}
    assert hosts & machines and hosts <= machines | {net.gateway}  # gateway: this test
    scale(env, 0, "m3")
    wait_workers(env, {})


def test_a_migration_loads_from_another_host(lab):
    """LOAD DATA LOCAL's temp file lives on the worker's machine and goes over the client
    connection: a worker on m3 migrates a small legacy database exactly."""
    env = lab["env"]
    out = run_farm(env, "legacy", "generate", "--users", "30", "--seed", "4")
    assert out.returncode == 0, out.stderr
    try:
        scale(env, 1, "m3")
        wait_workers(env, {"m3": 1})
        out = run_farm(env, "migrate", "--wait", timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        summary = json.loads(out.stdout.splitlines()[-1])
        assert summary["status"] == "done" and summary["loaded"]["users"] > 0
        out = run_farm(env, "verify", timeout=300)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    finally:
        scale(env, 0, "m3")


def shard_rows(db: PrivateMariaDB, shard: int) -> dict[int, int]:
    """to_id's local ID -> sequence of the rows of user 7 on ``shard`` (the test's own SQL)."""
    owner = ids.encode(shard, "user", 7)
    return {ids.decode(to_id).local: seq for to_id, seq in db.sql(
        f"SELECT to_id, sequence FROM db{shard:05d}.user_has_pins WHERE from_id = %s",
        (owner,))}


def test_a_cut_host_loses_its_chunks_and_its_late_writes_are_fenced(lab):
    env, net, db, tmp = lab["env"], lab["net"], lab["db"], lab["tmp"]
    settings = Settings.from_env(env)
    rt = Runtime(settings)
    gates = [str(tmp / "gate-middle"), str(tmp / "gate-end")]
    specs = [ChunkSpec("held", {"shard": 1, "start": 1000 * (i + 1), "count": 40,
                                "hold": hold, "gate": gates[i]})
             for i, hold in enumerate(("middle", "end"))]
    try:
        scale(env, 2, "m1")
        wait_workers(env, {"m1": 2})
        run_id = runs.start(rt, "test", "tests.kinds.held_edges", specs)
        held = [Path(f"{g}.held") for g in gates]
        wait_until(lambda: all(p.exists() and p.read_text() for p in held),
                   "both chunks held on m1", timeout=90)
        zombies = [tuple(map(int, p.read_text().split())) for p in held]  # (pid, fence)
        net.cut("m1")
        scale(env, 2, "m2")
        wait_until(lambda: rt.ledger.run(run_id)["status"] == "done",
                   "the run finished on m2", timeout=180)
        for pid, _fence in zombies:
            os.kill(pid, 0)  # the zombie runs on, isolated
        winner = exact(rt.ledger, db, run_id, zombies)
        net.restore("m1")
        for g in gates:
            Path(f"{g}.go").touch()
        late = [Path(f"{g}.late") for g in gates]
        wait_until(lambda: all(p.exists() for p in late), "the zombies' late steps",
                   timeout=180)
        assert [p.read_text().split(":")[0] for p in late] == ["refused", "refused"]
        assert "this write is refused" in late[0].read_text()  # the shard's fence
        assert "no longer current" in late[1].read_text()  # the ledger's fence on "done"
        assert exact(rt.ledger, db, run_id, zombies) == winner
    finally:
        scale(env, 0, "m1")
        scale(env, 0, "m2")
        rt.close()


def exact(ledger: Ledger, db: PrivateMariaDB, run_id: str, zombies: list) -> list[int]:
    """Both chunks done by a later attempt than the zombie's, every row there once, each last
    written by the winning attempt; returns the winners' fences."""
    fences = []
    rows = shard_rows(db, 1)
    assert sorted(rows) == [*range(1000, 1040), *range(2000, 2040)]
    for chunk_id, (_pid, zombie_fence) in enumerate(zombies):
        c = ledger.chunk(run_id, chunk_id)
        assert c["state"] == "done" and c["fence"] > zombie_fence, c
        assert c["rows_written"] == 40
        base = 1000 * (chunk_id + 1)
        assert {rows[i] // 10**6 for i in range(base, base + 40)} == {c["fence"]}
        fences.append(c["fence"])
    return fences


def test_the_lab_refuses_loudly_without_privileges(tmp_path):
    """The helper's error names the failed 'ip' command (what the suite fails with)."""
    from tests.netns import ip
    with pytest.raises(NetLabError, match="ip link add"):
        ip("link", "add", "x" * 40, "type", "bridge")  # an impossible interface name

