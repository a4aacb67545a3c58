"""``farm sync``'s leader (``loaders.migration.follower``): its lease held while an apply
outlasts it, and given up when another process took it over; ``--until-caught-up`` ends on
a legacy server that keeps logging other databases' writes."""

import threading
import time

import pymysql
import pytest

from farmcore.syncstate import ROW
from loaders.migration import binlog, follower
from loaders.migration.binlog import MalformedPositionError
from loaders.migration.follower import Follower
from tests.conftest import ns_db, run_farm
from tests.migratekit import last_json
from tests.synckit import legacy_server, live  # noqa: F401 - fixtures

LEASE = 0.6


@pytest.fixture
def lease(ledger, monkeypatch):
    monkeypatch.setattr(follower, "LEASE_SECONDS", LEASE)
    ledger.pool.execute("DELETE FROM sync_state")
    yield ledger.sync_state
    ledger.pool.execute("DELETE FROM sync_state")


def test_an_apply_longer_than_the_lease_keeps_it(settings, router, ledger, lease):
    leader = Follower(settings, router, ledger, "leader", "host-a")
    fence = lease.acquire("leader", "host-a", LEASE)
    with leader._renewing(fence) as lost:
        time.sleep(3 * LEASE)  # the apply: three leases long
        assert lease.acquire("standby", "host-b", LEASE) is None  # it never expired
    assert not lost.is_set()
    time.sleep(LEASE * 1.5)  # no renewing once the apply is over: it expires
    assert lease.acquire("standby", "host-b", LEASE) == fence + 1


def test_a_lease_taken_over_during_an_apply_is_reported_lost(settings, router, ledger, lease):
    leader = Follower(settings, router, ledger, "leader", "host-a")
    fence = lease.acquire("leader", "host-a", LEASE)
    lease.release(fence)  # as if it had expired
    assert lease.acquire("standby", "host-b", 60) == fence + 1
    with leader._renewing(fence) as lost:
        assert lost.wait(5 * LEASE)  # the next renewal is refused
    assert lease.read()["owner"] == "standby"


@pytest.mark.slow
def test_until_caught_up_ends_while_other_databases_keep_writing(live, ledger,  # noqa: F811
                                                                  legacy_server):  # noqa: F811
    """The legacy server logs every database's transactions (another application's, or the
    control database's when it shares the server, as in the default setup): sync applies
    what was logged before it looked and stops, instead of waiting for a quiet instant
    (never, with the sync's own lease writes on that server) and running for ever."""
    out = run_farm(live, "migrate", "--wait", timeout=600)
    assert out.returncode == 0, out.stderr
    run_id = last_json(out.stdout)["run_id"]
    legacy_server.sql("CREATE DATABASE IF NOT EXISTS busy")
    legacy_server.sql("CREATE TABLE IF NOT EXISTS busy.t (n INT PRIMARY KEY AUTO_INCREMENT)")
    done = threading.Event()

    def other_application() -> None:
        conn = legacy_server.connect()
        try:
            while not done.wait(0.05):
                conn.cursor().execute("INSERT INTO busy.t VALUES ()")
        finally:
            conn.close()
    writer = threading.Thread(target=other_application, daemon=True)
    writer.start()
    try:
        out = run_farm(live, "sync", "--until-caught-up", timeout=90)
    finally:
        done.set()
        writer.join()
        legacy_server.sql("DROP DATABASE busy")
    assert out.returncode == 0, out.stderr
    assert ledger.sync_state.read()["run_id"] == run_id


FORGED = "garbage; DROP TABLE x"


@pytest.fixture
def forged_state(ledger, farm_env):
    """A sync_state row whose positions anyone wrote by hand; the legacy database exists
    (so status views reach the legacy server and compute the lag)."""
    conn = pymysql.connect(host="127.0.0.1", port=3306, user="root", autocommit=True)
    with conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE IF NOT EXISTS `{ns_db('legacy_test')}`")
    conn.close()
    ledger.pool.execute("DELETE FROM sync_state")
    ledger.pool.execute("INSERT INTO sync_state (name, owner, host, run_id, gtid, event_time, "
                        "applying_from) VALUES (%s, 'o', 'h', 'r1', %s, 1, %s)",
                        (ROW, FORGED, FORGED))
    yield
    ledger.pool.execute("DELETE FROM sync_state")


def test_a_forged_position_leaves_the_status_views_answering(farm_env, forged_state):
    """Before: 'farm sync status' and 'farm status' ended in a ValueError traceback (the
    dashboard's page in a 500) when sync_state.gtid held anything but a position."""
    out = run_farm(farm_env, "sync", "status")
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    doc = last_json(out.stdout)
    assert doc["position"] == FORGED and "lag_events" not in doc
    out = run_farm(farm_env, "status")
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert f"at {FORGED}" in out.stdout
    assert "lag unknown (the stored position is not a GTID position" in out.stdout


@pytest.mark.parametrize("col", ["gtid", "applying_from", "applying_to"])
def test_a_forged_position_is_refused_in_one_line_before_following(settings, router, ledger,
                                                                   forged_state, col):
    """Before: a forged applying_from was a ValueError out of 'farm sync' (a traceback), a
    forged checkpoint was handed to the binlog reader as the place to start from."""
    ledger.pool.execute("UPDATE sync_state SET gtid = '0-1-5', applying_from = NULL")
    ledger.pool.execute(f"UPDATE sync_state SET {col} = %s", (FORGED,))
    leader = Follower(settings, router, ledger, "leader", "host-a")
    with pytest.raises(MalformedPositionError) as err:
        leader._start({"run_id": "r1", "params": {"binlog_pos": "0-1-3"}})
    assert f"sync_state.{col}" in str(err.value) and "\n" not in str(err.value)
    assert "set it to NULL" in str(err.value)


@pytest.mark.parametrize("text", ["", "0-1-5", "0-1-5,1-2-7"])
def test_positions_parse_and_anything_else_is_one_farm_error(text):
    binlog.parse(text)
    for bad in ("x", "0-1", "0-1-2-3", "0-1-x", None, 5):
        with pytest.raises(MalformedPositionError):
            binlog.parse(bad)
