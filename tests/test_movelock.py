"""The per-shard move lock of ``farm shards move`` (``loaders.capacity.movelock``): held for
as long as the move runs, however long its connection sits idle, and a move that lost it
(its connection killed) notices in one line."""

from __future__ import annotations

import time

import pytest

from farmcore.ledger import Ledger
from loaders.capacity.movelock import lock_name, moving
from shardfarm.mysql import pool as pools
from tests import faults
from tests.conftest import SHARDS_B

LO, HI = SHARDS_B[1] + 50, SHARDS_B[1] + 52  # lock names only: no database is touched


@pytest.fixture
def control(settings, ledger):
    """A fresh ledger's pool on the session's control database, closed after the test."""
    led = Ledger(settings.control_dsn)
    yield led.pool
    led.close()


def _holder(pool, shard: int) -> int | None:
    return pool.query("SELECT IS_USED_LOCK(%s)", (lock_name(pool.database, shard),))[0][0]



def test_the_lock_outlives_the_pools_idle_limit(control, monkeypatch):
    """The lock's connection is idle while the copy runs: the pool's short idle limit (30 s
    in production, 3 s here) closed it and the locks went with it, silently."""
    monkeypatch.setattr(pools, "IDLE_TIMEOUT", 3)
    with moving(control, LO, HI) as lock:
        held = _holder(control, LO)
        time.sleep(5)  # past the 3 s idle limit the connection was opened with
        assert _holder(control, LO) == held is not None
        lock.check("the test")
    assert _holder(control, LO) is None


def test_a_move_whose_lock_connection_was_killed_stops_at_its_next_check(control):
    """KILL the lock's connection (a server restart, a network cut): a second move can then
    take the shards, and the first one's next check says so in one line."""
    from loaders.capacity.movelock import MoveLockLostError
    with moving(control, LO, HI) as lock:
        faults.kill(control, _holder(control, LO))
        with moving(control, LO, HI), pytest.raises(MoveLockLostError) as err:  # let in
            lock.check("the flip")
    text = str(err.value)
    assert "\n" not in text and f"shards {LO}-{HI} lost its locks" in text, text
    assert "before the flip" in text and "run the same move again" in text, text
