"""Whatever anyone who can reach Redis writes into the keys of the home feeds' fenced swap
(``loaders.feedswap``: the run's chunk fences, the generation counter, the users'
generations) stops no ``farm feeds rebuild`` for good, marks no feed superseded for good
and leaves no temporary key, with a real worker. (That no zombie wins over such keys:
``tests/test_feeds_fence.py``.)"""

from __future__ import annotations

import pytest
import redis

from farmcore import keys
from jobs import runs
from loaders import feeds, feedswap
from sharding import ids
from sharding.fencing import FenceToken
from tests.farmkit import start_workers, stop
from tests.test_feeds import SENTINEL, expected_feed, graph, r, seed  # noqa: F401 - fixtures

pytestmark = pytest.mark.slow  # real workers

# what a run's chunk fences may hold that no owner wrote: -> how to write it
NOT_A_FENCE = {"a string": lambda c, k: c.set(k, "evil"),
               "a list": lambda c, k: c.rpush(k, "evil"),
               "inf": lambda c, k: c.hset(k, "0", "inf"),
               "1e300": lambda c, k: c.hset(k, "0", "1e300"),
               "a huge integer": lambda c, k: c.hset(k, "0", "9" * 30),
               "not a number": lambda c, k: c.hset(k, "0", "\xff")}


def _each_bucket(how):
    return lambda c, users: [how(c, keys.feed_generations(u), keys.feed_generation_field(u))
                             for u in users]


def _counter(value: str | None):
    def forge(c, users):
        c.delete(keys.feeds_generation())
        if value is None:  # deleted
            return
        if value == "hash":
            c.hset(keys.feeds_generation(), "evil", "1")
        else:
            c.set(keys.feeds_generation(), value)
    return forge


# generations no draw made: -> how to write them for ``users``
NOT_A_GENERATION = {
    "generations a string": _each_bucket(lambda c, k, f: c.set(k, "evil")),
    "generations a list": _each_bucket(lambda c, k, f: (c.delete(k), c.rpush(k, "evil"))),
    "generation inf": _each_bucket(lambda c, k, f: c.hset(k, f, "inf")),
    "generation 1e300": _each_bucket(lambda c, k, f: c.hset(k, f, "1e300")),
    "generation a huge integer": _each_bucket(lambda c, k, f: c.hset(k, f, "9" * 30)),
    "counter inf": _counter("inf"),
    "counter text": _counter("evil"),
    "counter at INCR's limit": _counter(str(2**63 - 1)),
    "counter 1e300": _counter("1e300"),
    "counter a hash": _counter("hash"),
}


def _start(rt, users: list[int]) -> str:
    """A feeds run of ``users`` in one chunk, not yet run (no worker serves it)."""
    params, chunks = feeds.plan(rt.router, users=users)
    return runs.start(rt, "feeds", feeds.HANDLER, chunks, params)


def _run(env: dict, rt, *run_ids: str) -> None:
    """A real ``farm workers`` runs the runs to their end: each must be done."""
    worker = start_workers(env, 1)
    try:
        ends = [runs.wait(rt, run_id, timeout=40) for run_id in run_ids]
    finally:
        log = stop(worker)
    assert ends == ["done"] * len(run_ids), log[-4000:]
    assert "Traceback" not in log, log[-4000:]


def _assert_rebuilt(r, router, ledger, run_id: str, users: list[int]) -> None:  # noqa: F811
    """Every feed of ``users`` rebuilt (none left superseded), no temporary key left."""
    want = {u: expected_feed(router, u, 500) for u in users}
    assert {u: r.lrange(f"home:{u}", 0, -1) for u in users} == want
    assert ledger.chunk(run_id, 0)["rows_written"] == sum(1 for f in want.values() if f)
    assert r.keys("home:*:tmp") == []


@pytest.mark.usefixtures("park_leftover_runs")
@pytest.mark.parametrize("how", NOT_A_FENCE)
def test_a_chunk_fence_no_owner_wrote_stops_no_rebuild(graph, env, rt, router, r,  # noqa: F811
                                                       ledger, how):
    """The ledger has the chunk's owner hold it, so it replaces the fence. Before: another
    type failed every attempt's ``begin`` (WRONGTYPE); a fence above every number (or a
    huge one) refused every owner as a zombie: the run never ended."""
    users = graph["active"]
    seed(r, users)
    run_id = _start(rt, users)
    NOT_A_FENCE[how](r, keys.feeds_fence(run_id))
    _run(env, rt, run_id)
    _assert_rebuilt(r, router, ledger, run_id, users)
    fence = ledger.chunk(run_id, 0)["fence"]
    assert r.hgetall(keys.feeds_fence(run_id)) == {"0": str(fence)}


@pytest.mark.usefixtures("park_leftover_runs")
@pytest.mark.parametrize("how", NOT_A_GENERATION)
def test_generations_no_draw_made_stop_no_rebuild(graph, env, rt, router, r,  # noqa: F811
                                                  ledger, how):
    """Before: a generations hash of another type failed every swap half way (WRONGTYPE),
    leaving ``home:<id>:tmp`` keys; a generation above every number left the users'
    feeds as they were, counted superseded, for ever; a counter that was not a number (or
    at INCR's limit) failed every ``begin``."""
    users = graph["active"]
    seed(r, users)
    NOT_A_GENERATION[how](r, users)
    run_id = _start(rt, users)
    _run(env, rt, run_id)
    _assert_rebuilt(r, router, ledger, run_id, users)


@pytest.mark.parametrize("reset", [None, "0"], ids=["deleted", "set to 0"])
def test_a_counter_reset_marks_no_feed_superseded(graph, env, rt, router, r,  # noqa: F811
                                                  ledger, reset):
    """Two rebuilds, the counter deleted (or set to 0), a third rebuild: before, it drew
    generations below the stored ones and left every feed as it was, counted superseded,
    until the counter caught up."""
    users = graph["active"]
    _run(env, rt, _start(rt, users), _start(rt, users))
    _counter(reset)(r, users)
    seed(r, users)
    run_id = _start(rt, users)
    _run(env, rt, run_id)
    _assert_rebuilt(r, router, ledger, run_id, users)


def test_a_swap_that_fails_half_way_leaves_no_temporary_key(env, r, monkeypatch):  # noqa: F811
    """Redis forgets its scripts (a restart, a fail-over, ``SCRIPT FLUSH``) between the
    pipeline's check that the swap's script is loaded and its ``EXEC``: the ``EXEC`` runs
    the ``RPUSH``es to the temporary keys and fails at the script (``NOSCRIPT``). The swap
    raises and replaces nothing; before, every ``home:<id>:tmp`` of the batch stayed."""
    users = [ids.encode(7, "user", i) for i in range(1, 6)]
    seed(r, users)
    fence = feedswap.begin(r, FenceToken("t-flushed", 0, 1), lambda: None)
    load = redis.client.Pipeline.load_scripts

    def load_then_forget(pipe):
        load(pipe)
        r.script_flush()
    monkeypatch.setattr(redis.client.Pipeline, "load_scripts", load_then_forget)
    with pytest.raises(redis.exceptions.NoScriptError):
        feedswap.swap_feeds(r, {u: [1, 2, 3] for u in users}, fence)
    assert r.keys("home:*:tmp") == []
    assert all(r.lrange(f"home:{u}", 0, -1) == SENTINEL for u in users)
