"""Feed swaps are fenced in Redis: a feeds chunk frozen between its last lease check and its
swap never puts its older feeds over the ones a newer owner wrote meanwhile (the chunk's
next owner, or a later run), with real worker processes."""

import os
import signal

import pytest

from farmcore import keys
from farmcore.ledger import ChunkSpec
from jobs import runs
from sharding import ids
from sharding.mappings import MappingStore
from sharding.objects import ObjectStore
from tests.conftest import run_farm
from tests.farmkit import start_workers, stop, until
from tests.test_feeds import expected_feed, graph, r, seed  # noqa: F401 - fixtures

pytestmark = pytest.mark.slow  # real workers, leases that must expire

FROZEN = "tests.kinds.feeds_frozen"
NEWEST = 10_000  # a sequence above every pin of the graph


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def _lease_expired(ledger, run_id: str) -> bool:
    rows = ledger.pool.query("SELECT lease_expires < NOW(3) FROM chunks WHERE run_id = %s "
                             "AND chunk_id = 0", (run_id,))
    return bool(rows[0][0])


@pytest.fixture
def new_pin(graph, router):  # noqa: F811 - the graph fixture
    """``(user, pin)``: a pin added, newest of all, to a board ``user`` follows while the
    zombie is frozen (by ``add``); removed after the test."""
    user = next(u for u in graph["active"] if expected_feed(router, u, 500))
    (board,) = router.query(router.host_for(ids.shard_of(user)),
                            f"SELECT MIN(to_id) FROM db{ids.shard_of(user):05d}."
                            "user_follows_boards WHERE from_id = %s", (user,))[0]
    pin = ObjectStore(router).create(ids.shard_of(board), "pin", {"board": board})
    store = MappingStore(router, "board_has_pins")
    yield user, pin, lambda: store.add(board, pin, NEWEST)
    store.remove(board, pin)


def _freeze_first_attempt(rt, env, users: list[int], marker) -> tuple[str, object, int]:
    """A feeds run of ``users`` in one chunk whose first attempt freezes as it calls its
    swap; returns the run, the frozen worker's supervisor (frozen too, so it cannot help)
    and the frozen worker's PID."""
    run_id = runs.start(rt, "feeds", FROZEN, [ChunkSpec("feeds", {
        "users": users, "freeze_once": str(marker)}, rows=len(users))],
        {"length": 500, "kinds": ["feeds"]})
    zombie = start_workers(env, 1)
    until(lambda: marker.exists() and marker.read_text(), what="the zombie at its swap")
    pid = int(marker.read_text())
    until(lambda: _stopped(pid), what="the zombie frozen")
    os.kill(zombie.pid, signal.SIGSTOP)
    return run_id, zombie, pid


def _release(zombie, pid: int) -> str:
    """Wake the zombie at its swap and its supervisor; let its job end; its log."""
    os.kill(zombie.pid, signal.SIGCONT)
    os.kill(pid, signal.SIGCONT)
    return stop(zombie)  # a warm stop: the zombie's job runs to its end first


def _assert_newest_feeds(conn, router, users: list[int], user: int, pin: int) -> None:
    assert str(pin) == conn.lrange(f"home:{user}", 0, 0)[0]  # the change the zombie missed
    for u in users:
        assert conn.lrange(f"home:{u}", 0, -1) == expected_feed(router, u, 500), u


# what the chunk's fence in Redis may hold when the zombie wakes: -> how to write it
FORGED_FENCES = {"its heir's": lambda c, k: None,
                 "inf": lambda c, k: c.hset(k, "0", "inf"),
                 "a string": lambda c, k: c.set(k, "evil")}


@pytest.mark.parametrize("fence", FORGED_FENCES)
def test_a_zombie_frozen_before_its_swap_never_replaces_its_heirs_feeds(
        graph, env, rt, router, r, ledger, tmp_path, new_pin, fence):  # noqa: F811 - fixtures
    """The chunk's lease expires while its first owner is frozen between its check and its
    swap; a pin is added, and a second worker claims the chunk and writes the feeds with
    it. The zombie, woken, is refused by the chunk's fence in Redis: the heir's feeds
    stand, and the zombie's attempt ends as a taken-over one. So it is when the fence was
    overwritten with one no owner wrote: the ledger, asked, refuses the zombie."""
    users, (user, pin, add) = graph["active"], new_pin
    seed(r, users)
    run_id, zombie, pid = _freeze_first_attempt(rt, env, users, tmp_path / "frozen.pid")
    try:
        add()
        heir = start_workers(env, 1)
        try:
            assert runs.wait(rt, run_id, timeout=90) == "done"
        finally:
            stop(heir)
        assert ledger.chunk(run_id, 0)["fence"] == 2
        _assert_newest_feeds(r, router, users, user, pin)
        FORGED_FENCES[fence](r, keys.feeds_fence(run_id))
    finally:
        out = _release(zombie, pid)
    assert "was taken over; dropping this attempt" in out
    _assert_newest_feeds(r, router, users, user, pin)
    assert ledger.chunk(run_id, 0)["state"] == "done"
    assert r.keys("home:*:tmp") == []


@pytest.mark.parametrize("counter", ["kept", "deleted", "0"])
def test_a_zombie_of_an_older_run_never_replaces_a_newer_runs_feeds(
        graph, env, rt, router, r, ledger, tmp_path, new_pin, park_leftover_runs,  # noqa: F811
        counter):
    """The first owner of an older run's chunk is frozen before its swap and its lease
    expires, but nothing claims its chunk again (its run is paused); a pin is added and a
    newer run rebuilds the same feeds. The zombie, woken, still holds its chunk's fence,
    but every feed it would write was written by a later reader: none is replaced. So it
    is when the generation counter was reset (deleted, or set to 0) before it woke."""
    users, (user, pin, add) = graph["active"], new_pin
    seed(r, users)
    old, zombie, pid = _freeze_first_attempt(rt, env, users, tmp_path / "frozen.pid")
    try:
        ledger.set_paused(old, True)
        add()
        until(lambda: _lease_expired(ledger, old), what="the zombie's lease to expire")
        heir = start_workers(env, 1)
        try:
            out = run_farm(env, "feeds", "rebuild", "--users", ",".join(map(str, users)),
                           "--wait")
            assert out.returncode == 0, out.stderr
        finally:
            stop(heir)
        _assert_newest_feeds(r, router, users, user, pin)
        assert ledger.chunk(old, 0)["fence"] == 1  # never claimed again
        if counter != "kept":
            r.delete(keys.feeds_generation())
        if counter == "0":
            r.set(keys.feeds_generation(), "0")
    finally:
        log = _release(zombie, pid)
    assert "was taken over; dropping this attempt" in log  # its lease had expired
    _assert_newest_feeds(r, router, users, user, pin)
    assert r.keys("home:*:tmp") == []
