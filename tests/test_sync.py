"""``farm sync`` and ``farm cutover`` on a private mariadbd writing a ROW binlog with GTIDs:
a write load (inserts, updates, deletes, cascading deletes, bad rows, rows made valid)
runs while ``farm migrate`` and ``farm sync`` run; a worker is SIGKILLed inside a chunk of
the migration, and sync between an apply and its checkpoint and inside an apply (moved
pins' new slots written, their old ones not yet retired); after ``farm cutover
--freeze`` the target matches the independent checker exactly. Plus the one-line
refusals (no binlog, a purged position)."""

import json
import threading

import pymysql
import pytest

from loaders.migration import feed as feed_module
from loaders.migration import sync
from loaders.migration.binlog import behind
from shardfarm.errors import FencedError, TransientDatabaseError
from shardfarm.mysql.dsn import DSN
from shardfarm.retry import RetryPolicy
from sharding import fencing
from sharding.fencing import FenceToken
from sharding.schema import shard_table
from tests import faults
from tests.conftest import SHARDS_A, run_farm
from tests.dashkit import dashboard, get, labels, scrape
from tests.farmkit import stop
from tests.migratekit import last_json
from tests.proxy import TcpProxy
from tests.synckit import exact, legacy_server, live, load, start_sync  # noqa: F401 - fixtures

ONCE = RetryPolicy(attempts=1)
CHECKPOINT = "UPDATE sync_state SET run_id"
VALID_BOARD = ("(SELECT b.id FROM boards b JOIN users u ON u.id = b.user_id WHERE b.id < 900000 "
               "AND b.created_at IS NOT NULL AND u.username IS NOT NULL AND u.created_at IS NOT "
               "NULL ORDER BY b.id DESC LIMIT 1)")
MOVED_PINS = (f"UPDATE pins SET board_id = {VALID_BOARD}, user_id = (SELECT user_id FROM "
              f"boards WHERE id = {VALID_BOARD}) WHERE id % 7 = 0 AND id {{}} 34359738368")
MOVES = [  # objects placed anew, and where sync is killed applying them:
    # small IDs: new slots written and mapped, the first old slot of a pin not yet retired
    ([MOVED_PINS.format("<")], "`pins` SET active = 0"),
    # big IDs (and the pins of moved boards): an old slot read to be retired, no new ID yet
    ([MOVED_PINS.format(">="), "UPDATE boards SET user_id = (SELECT MIN(id) FROM users WHERE "
      "username IS NOT NULL AND created_at IS NOT NULL) WHERE id % 13 = 0"],
     "SELECT local_id, data FROM")]

LOAD = [  # the write load: every kind of change, each statement its own transaction
    "UPDATE users SET created_at = NULL WHERE id = (SELECT MAX(id) FROM (SELECT id FROM users "
    "WHERE username IS NOT NULL AND created_at IS NOT NULL) x)",
    "UPDATE users SET username = CONCAT('Reborn', id) WHERE username IS NULL",
    "UPDATE users SET email = 'Live@Example.com' WHERE id IN (SELECT id FROM (SELECT id FROM "
    "users ORDER BY id LIMIT 3) x)",
    "DELETE FROM users WHERE id = (SELECT id FROM (SELECT user_id id FROM boards "
    "GROUP BY user_id ORDER BY COUNT(*) DESC LIMIT 1) x)",
    "UPDATE pins SET created_at = '2015-01-02 03:04:05' WHERE created_at IS NULL",
    "UPDATE pins SET board_id = board_id + 1 WHERE id % 17 = 0",
    "DELETE FROM boards WHERE id % 11 = 0",
    "DELETE FROM follows WHERE user_id % 5 = 0",
    "INSERT INTO users (id, username, email, full_name, created_at) VALUES "
    "(900001, 'newcomer', 'live@example.com', 'New', '2016-02-03 04:05:06'), "
    "(900002, NULL, NULL, 'Bad', '2016-02-03 04:05:06')",
    "INSERT INTO boards (id, user_id, name, description, created_at) VALUES "
    "(900001, 900001, 'b', NULL, '2016-02-03 04:05:06'), (900002, 900002, 'x', NULL, NULL)",
    "INSERT INTO pins (id, user_id, board_id, details, link, image_url, created_at) VALUES "
    "(900001, 900001, 900001, 'p', NULL, NULL, '2016-02-03 04:05:07')",
    "INSERT INTO follows (user_id, board_id, created_at) VALUES (900001, 900001, NOW())",
    "UPDATE users SET username = 'fixed900002' WHERE id = 900002",
    "UPDATE boards SET created_at = NOW() WHERE id = 900002",
]


def _kill_a_worker_inside_a_chunk(server, ledger, since) -> tuple[str, int]:
    """Hold a write lock on the legacy ``likes`` table (its chunks come last) until a worker
    is blocked reading it inside a chunk of the migration started after ``since``, SIGKILL
    that worker, then release the lock: the chunk's lease expires and another worker runs
    it again. Returns the chunk's ``(run_id, chunk_id)``."""
    import os
    import signal

    def run_id() -> str | None:
        rows = ledger.pool.query("SELECT run_id FROM runs WHERE kind = 'migrate' AND "
                                 "created_at >= %s", (since,))
        return rows[0][0] if rows else None
    faults.wait_until(lambda: run_id() is not None, "the migrate run")
    lock = server.connect()
    try:
        with lock.cursor() as cur:
            cur.execute("LOCK TABLES legacy.likes WRITE")
        held: list = []

        def blocked() -> bool:  # a likes chunk is leased and its worker waits for the lock
            held[:] = ledger.pool.query(
                "SELECT chunk_id, lease_owner FROM chunks WHERE run_id = %s AND kind = 'likes' "
                "AND state = 'running'", (run_id(),))
            waiting = server.sql("SELECT COUNT(*) FROM information_schema.processlist WHERE "
                                 "state LIKE 'Waiting for table%%lock' AND info LIKE '%%likes%%'")
            return bool(held) and waiting[0][0] > 0
        faults.wait_until(blocked, "a worker blocked inside a likes chunk")
        chunk_id, owner = held[0]
        os.kill(int(owner.split(":")[1]), signal.SIGKILL)
        with lock.cursor() as cur:
            cur.execute("UNLOCK TABLES")
    finally:
        lock.close()
    return run_id(), int(chunk_id)


@pytest.mark.slow
def test_sync_killed_mid_apply_or_before_its_checkpoint_then_cutover_is_exact(
        live, settings, ledger, map_path, legacy_server, monkeypatch):  # noqa: F811
    half = len(LOAD) // 2
    (since,), = ledger.pool.query("SELECT NOW(3)")
    done: dict = {}
    migrating = threading.Thread(target=lambda: done.update(out=run_farm(
        live, "migrate", "--chunk-size", "200", "--wait", timeout=600)))
    migrating.start()
    writer = threading.Thread(target=load, args=(legacy_server, LOAD[:half]))
    writer.start()  # changes made while the migration runs
    killed = _kill_a_worker_inside_a_chunk(legacy_server, ledger, since)
    migrating.join()
    writer.join()
    out = done["out"]
    assert out.returncode == 0, out.stderr + out.stdout
    assert ledger.chunk(killed[0], killed[1])["attempts"] >= 2  # run again after the kill
    run_id = last_json(out.stdout)["run_id"]
    assert ledger.run(run_id)["params"]["binlog_pos"] is not None
    load(legacy_server, LOAD[half:])
    args = {"shardmap": str(map_path), "env": live}
    monkeypatch.setenv("FARM_FAULT_MATCH", CHECKPOINT)
    assert faults.run_killed("sync", args, 1) == -9  # applied, then killed: no checkpoint
    assert not ledger.sync_state.read().get("gtid")
    load(legacy_server, ["DELETE FROM users WHERE id = 900001",  # cascades again
                          "UPDATE users SET created_at = NOW() WHERE created_at IS NULL"])
    assert faults.run_killed("sync", args, 1) == -9  # killed again after applying more
    assert not ledger.sync_state.read().get("gtid")
    for moves, step in MOVES:
        monkeypatch.setenv("FARM_FAULT_MATCH", step)
        load(legacy_server, moves)
        assert faults.run_killed("sync", args, 1) == -9
        (now,), = legacy_server.sql("SELECT @@gtid_binlog_pos")
        assert behind(ledger.sync_state.read().get("gtid") or "", now) >= len(moves)
    monkeypatch.delenv("FARM_FAULT_MATCH")
    done = run_farm(live, "sync", "--until-caught-up", timeout=300)
    assert done.returncode == 0, done.stderr
    problems = exact(legacy_server, settings, map_path, run_id)
    assert problems == [], "\n".join(problems)
    status = run_farm(live, "sync", "status")
    doc = last_json(status.stdout)
    assert doc["lag_events"] == 0 and doc["run_id"] == run_id and doc["applied"]["users"] > 0
    assert doc["quarantined"]["users"] and doc["leader"] is None  # stopped: nobody leads
    farm_status = run_farm(live, "status")
    assert "lag 0 transaction(s) / 0 s" in farm_status.stdout, farm_status.stdout
    with dashboard(live) as (url, _):
        code, page = get(url + "fragment")
        metrics = scrape(url + "metrics")
    assert code == 200 and 'id="sync-lag">0 transaction(s) / 0 s' in page, page[-3000:]
    (raw,), = ledger.pool.query("SELECT applied FROM sync_state")
    applied = json.loads(raw)
    assert applied["users"] > 0 and f"users {applied['users']:,}" in page
    for table, n in applied.items():
        assert metrics[("shardfarm_sync_applied_keys_total", labels(table=table))] == n
    assert metrics[("shardfarm_sync_lag_transactions", ())] == 0
    assert metrics[("shardfarm_sync_leader", ())] == 0  # stopped: nobody leads
    sync = start_sync(live)
    try:
        cut = run_farm(live, "cutover", "--freeze", timeout=600)
    finally:
        stop(sync)
    assert cut.returncode == 0, cut.stdout + cut.stderr
    assert "cutover: target exact at legacy binlog position" in cut.stdout
    assert "0 mismatch(es)" in cut.stdout
    with pytest.raises(pymysql.err.OperationalError):  # frozen for the application
        load(legacy_server, ["DELETE FROM likes LIMIT 1"])
    legacy_server.sql("SET GLOBAL read_only = 0")


def test_sync_refuses_a_server_without_binlog(farm_env, ledger, server_b):
    env = {**farm_env, "FARM_LEGACY_DSN": f"mysql://root@127.0.0.1:{server_b.port}/mysql"}
    out = run_farm(env, "sync", timeout=60)
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "log_bin=ON and binlog_format=ROW" in lines[0], out.stderr


@pytest.mark.slow
def test_sync_refuses_a_purged_position(live, ledger, legacy_server):  # noqa: F811
    ledger.pool.execute("DELETE FROM sync_state")
    out = run_farm(live, "migrate", "--wait", timeout=600)
    assert out.returncode == 0, out.stderr
    load(legacy_server, ["DELETE FROM likes LIMIT 1"])
    legacy_server.sql("FLUSH BINARY LOGS")
    last = legacy_server.sql("SHOW BINARY LOGS")[-1][0]

    def purged() -> bool:  # the server keeps a log until its binlog checkpoint moved on
        legacy_server.sql(f"PURGE BINARY LOGS TO '{last}'")
        return len(legacy_server.sql("SHOW BINARY LOGS")) == 1
    faults.wait_until(purged, "the old binary logs purged")
    out = run_farm(live, "sync", timeout=120)
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "purged" in lines[0] and "full re-run" in lines[0], out.stderr


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie nobody reaped has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_the_binlog_reader_process_ends_with_its_follower(legacy_server):  # noqa: F811
    """SIGKILL the process following the binlog: its reader process ends by itself."""
    import os
    import signal
    import subprocess
    import sys

    from tests.conftest import ROOT
    pos = legacy_server.sql("SELECT @@gtid_binlog_pos")[0][0]
    code = ("import time\nfrom loaders.migration.feed import Feed\n"
            "from shardfarm.mysql.dsn import DSN\n"
            f"f = Feed(DSN.parse('mysql://root@127.0.0.1:{legacy_server.port}/legacy'), "
            f"'{pos}')\nprint(f._proc.pid, flush=True)\ntime.sleep(600)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE)
    reader = int(parent.stdout.readline())
    assert _running(reader)
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    parent.stdout.close()
    faults.wait_until(lambda: not _running(reader), "the reader process to end", timeout=15)


def test_a_stalled_binlog_stream_ends_the_feed_in_one_line(legacy_server,  # noqa: F811
                                                            monkeypatch):
    """The legacy server (or the network) stops answering without closing the connection:
    no event, no heartbeat. Before, the follower waited for the next message for ever
    ('farm sync --until-caught-up' never ended, SIGTERM did not stop it); now it gives up
    after SILENCE_SECONDS with one transient error naming the server."""
    monkeypatch.setattr(feed_module, "SILENCE_SECONDS", 3.0)
    pos = legacy_server.sql("SELECT @@gtid_binlog_pos")[0][0]
    with TcpProxy.start(legacy_server.port) as proxy:
        feed = feed_module.Feed(DSN.parse(f"mysql://root@127.0.0.1:{proxy.port}/legacy"),
                                pos)
        try:
            assert feed.take(sync.Changes(), 10).idle  # heartbeats come through the proxy
            proxy.freeze()
            ended: list[BaseException] = []

            def taking() -> None:
                try:
                    while True:  # the heartbeats read ahead before the freeze, then silence
                        feed.take(sync.Changes(), 10)
                except BaseException as exc:  # noqa: BLE001 - looked at below
                    ended.append(exc)
            taker = threading.Thread(target=taking, daemon=True)
            taker.start()
            taker.join(60)  # 20 times the bound: a feed still waiting then waits for ever
            assert ended, "the feed still waits for a stalled stream"
            assert isinstance(ended[0], TransientDatabaseError), ended[0]
            message = str(ended[0])
            assert f"127.0.0.1:{proxy.port}" in message and "heartbeat" in message
            assert "\n" not in message
        finally:
            feed.close()


def test_tables_fence_apart_and_a_zombie_leader_is_refused_per_table(router):
    """Selections of different tables write under fence rows of their own: one holding its
    row does not make another wait (lock wait 1 s here). A zombie leader (an older lease)
    is refused on a shard once its successor wrote the same table's rows there."""
    shard = SHARDS_A[0] + 5
    zombie, heir = FenceToken("sync-test", 0, 1), FenceToken("sync-test", 0, 2)

    def impatient(token: FenceToken):
        def tx(cur) -> None:
            cur.execute("SET SESSION innodb_lock_wait_timeout = 1")
            try:
                fencing.check(cur, shard, token)
            finally:
                cur.execute("SET SESSION innodb_lock_wait_timeout = DEFAULT")
        return tx

    def heir_holds_pins(cur) -> None:
        fencing.check(cur, shard, sync.table_token(heir, "pins"))  # locked until commit
        router.run(shard, impatient(sync.table_token(zombie, "likes")), policy=ONCE)
    try:
        router.run(shard, heir_holds_pins, policy=ONCE)
        with pytest.raises(FencedError, match="taken over"):
            router.run(shard, impatient(sync.table_token(zombie, "pins")), policy=ONCE)
        router.run(shard, impatient(sync.table_token(zombie, "likes")), policy=ONCE)
    finally:
        router.run(shard, lambda cur: cur.execute(
            f"DELETE FROM {shard_table(shard, 'chunk_fences')} WHERE run_id = 'sync-test'"))
