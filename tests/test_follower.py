"""``farm sync``'s leader (``loaders.migration.follower``): its lease held while an apply
outlasts it, and given up when another process took it over."""

import time

import pytest

from loaders.migration import follower
from loaders.migration.follower import Follower

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
