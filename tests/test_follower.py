"""``farm sync``'s leader (``loaders.migration.follower``): its lease held while an apply
outlasts it, and given up when another process took it over; ``--until-caught-up`` ends on
a legacy server that keeps logging other databases' writes."""

import threading
import time

import pytest

from loaders.migration import follower
from loaders.migration.follower import Follower
from tests.conftest import run_farm
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
