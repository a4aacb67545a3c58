"""Rebalance linearizable for readers and writers: stale actors, writers killed or frozen
between any two statements (real processes, see ``tests.faults``), reads at every state."""

import threading

import pytest

from jobs import lifecycle
from jobs.runtime import Runtime
from loaders.mappings import rebalance as rebalancer
from sharding import hotspot, ids
from sharding.mappings import Edge, MappingStore
from sharding.schema import shard_table
from tests import faults
from tests import test_hotspot as base
from tests.conftest import SHARDS_A, SHARDS_B
from tests.test_hotspot import HOT_SHARD, _all_followers, _reverse, _rows_everywhere, _run_inline

hot_board, rt = base.hot_board, base.rt  # the fixtures of test_hotspot

FOLLOWERS = hotspot.FOLLOWERS
SHARDS = [*range(SHARDS_A[0], SHARDS_A[1] + 1), *range(SHARDS_B[0], SHARDS_B[1] + 1)]
NEW_USER = ids.encode(SHARDS_B[0] + 3, "user", 960_000_001)
NEW_SEQ = 1_600_000_000
REAL_COPY = rebalancer._copy


class Watch:
    """Reads a board's followers and records what breaks the reader's promise."""

    def __init__(self, router, board: int, expected: set) -> None:
        self.router, self.board, self.expected = router, board, expected
        self.problems: list[str] = []

    def new_visible(self, when: str) -> bool:
        """Whether the new follower is seen; every other follower must be seen once."""
        got = _all_followers(self.router, self.board)
        seen = set(got)
        if len(got) != len(seen):
            self.problems.append(f"{when}: {len(got) - len(seen)} follower(s) seen twice")
        if seen - {(NEW_USER, NEW_SEQ)} != self.expected:
            self.problems.append(f"{when}: {len(self.expected - seen)} follower(s) missing")
        return (NEW_USER, NEW_SEQ) in seen

    def expect(self, when: str, visible: bool) -> None:
        """The new follower must be seen exactly when ``visible``."""
        if self.new_visible(when) != visible:
            self.problems.append(f"{when}: new follower {'lost' if visible else 'appeared'}")


def _reset(router, board: int, expected: set) -> None:
    """The board not hot yet: every follower row on its home shard, no directory entry."""
    for s in SHARDS:
        router.run(s, lambda cur, s=s: cur.execute(
            f"DELETE FROM {shard_table(s, FOLLOWERS)} WHERE from_id = %s", (board,)))
    router.run(HOT_SHARD, lambda cur: cur.execute(
        f"DELETE FROM {shard_table(HOT_SHARD, hotspot.DIRECTORY)} WHERE board_id = %s",
        (board,)))
    MappingStore(router, FOLLOWERS).add_many([Edge(board, u, q) for u, q in expected])


def _rebalance(rt, router, monkeypatch, after_copy=None, on_state=None) -> None:
    """Run the board's rebalance inline; ``after_copy()`` runs once every home row was
    copied, before the flip; ``on_state(state)`` after each durable step."""
    def copy(ctx, entry):
        counts = REAL_COPY(ctx, entry)
        if after_copy:
            after_copy()
        return counts
    monkeypatch.setattr(rebalancer, "_copy", copy)
    monkeypatch.setattr(rebalancer, "after_state", lambda b, s: on_state and on_state(s))
    params, chunks = rebalancer.plan(router, FOLLOWERS, 1000, 3)
    _run_inline(rt, "rebalance", rebalancer.HANDLER, params, chunks)


def _assert_settled(router, board: int, expected: set) -> None:
    """Cleaned: every row (the new follower's included) once, on its follower shard."""
    entry = hotspot.Directory(router).get(board)
    rows = _rows_everywhere(router, board)
    assert entry.state == "cleaned"
    assert sorted((u, q) for _, u, q in rows) == sorted(expected | {(NEW_USER, NEW_SEQ)})
    assert all(s == hotspot.follower_shard(u, entry.shards) for s, u, _ in rows)


def _steps_after_copy(rt, router, monkeypatch, board, expected, scenario, args) -> list[str]:
    trace: list[str] = []
    _reset(router, board, expected)
    _rebalance(rt, router, monkeypatch,
               after_copy=lambda: trace.extend(faults.steps(scenario, args)))
    assert trace
    return trace


def test_stale_rebalancer_stops_instead_of_moving_the_board_back(settings, rt, router,
                                                                 hot_board, monkeypatch):
    """Bug (a): an actor that read ``planned`` and stalled wrote ``copying`` after another
    took the board to ``cleaned``; readers then looked at the emptied home shard."""
    board, expected = hot_board
    _reverse(rt, router, [FOLLOWERS])
    hotspot.Directory(router).plan(board, hotspot.choose_shards(router, board, 3))
    reached, release = threading.Event(), threading.Event()
    real_get = hotspot.Directory.get

    def get(self, b):
        entry = real_get(self, b)
        if threading.current_thread().name == "stale" and entry.state == "planned":
            reached.set()
            release.wait(faults.TIMEOUT)
        return entry
    monkeypatch.setattr(hotspot.Directory, "get", get)
    watch = Watch(router, board, expected)
    monkeypatch.setattr(rebalancer, "after_state",
                        lambda b, s: watch.new_visible(f"{threading.current_thread().name} "
                                                       f"after {s}"))
    params, chunks = rebalancer.plan(router, FOLLOWERS, 1000, 3)
    handler = {**params, "handler": rebalancer.HANDLER}
    stale_run = rt.ledger.create_run("rebalance", "none", handler, chunks)
    stale_rt, result = Runtime(settings), []
    stale = threading.Thread(name="stale", target=lambda: result.append(
        lifecycle.execute(stale_rt, stale_run, 0)))
    stale.start()
    try:
        assert reached.wait(faults.TIMEOUT)
        _run_inline(rt, "rebalance", rebalancer.HANDLER, params, chunks)  # the live actor
    finally:
        release.set()
        stale.join()
        stale_rt.close()
    assert hotspot.Directory(router).get(board).state == "cleaned"
    assert not watch.problems, watch.problems
    assert result == ["failed"]
    assert "StaleStateError" in str(rt.ledger.failures(stale_run))
    assert sorted(_all_followers(router, board)) == sorted(expected)


def _killed_at_each_step(rt, router, monkeypatch, hot_board, step: str, args: dict,
                         retry) -> None:
    """For each statement of ``step`` after the copy: a child running it is killed just
    before that statement while the board is rebalanced; readers never see the new follower
    twice, keep seeing it once it was visible, and see it exactly once after ``retry()``."""
    board, expected = hot_board
    trace = _steps_after_copy(rt, router, monkeypatch, board, expected, step, args)
    for n in range(1, len(trace) + 1):
        _reset(router, board, expected)
        watch, at = Watch(router, board, expected), f"killed before step {n} {trace[n - 1]!r}"
        before = []

        def kill(n=n, watch=watch, at=at, before=before):
            faults.run_killed(step, args, n)
            before.append(watch.new_visible(at))
        _rebalance(rt, router, monkeypatch, after_copy=kill,
                   on_state=lambda s, w=watch, at=at, b=before: b and w.expect(f"{at}, {s}", b[0]))
        assert not watch.problems, watch.problems
        retry()
        watch.expect(f"{at}, retried", True)
        assert not watch.problems, watch.problems
        _assert_settled(router, board, expected)


@pytest.mark.slow
def test_add_follower_killed_between_any_two_statements(rt, router, hot_board, monkeypatch):
    """Bug (b), crash: home and listed shard were written in two transactions; a writer
    killed between them while the board was being copied lost the follower at the flip."""
    board, _ = hot_board
    args = {"shardmap": str(router.source.path), "board": board, "user": NEW_USER,
            "sequence": NEW_SEQ}
    _killed_at_each_step(rt, router, monkeypatch, hot_board, "add_follower", args,
                         lambda: hotspot.add_follower(router, board, NEW_USER, NEW_SEQ))


def _flip_beside_frozen(rt, router, monkeypatch, watch: Watch, child, at: str,
                        after_copy: bool = False) -> None:
    """Run the rebalance in a thread beside a writer stopped by ``child()`` (a
    ``faults.frozen`` context entered before the rebalance, or once its copy is done);
    read while the flip waits for the writer (or after it went through), release the
    writer, and check what readers saw."""
    errors: list[BaseException] = []
    held: list = []
    ready = threading.Event()

    def freeze():
        held.append(child())
        held[-1].__enter__()
        ready.set()

    def go():
        try:
            _rebalance(rt, router, monkeypatch, after_copy=freeze if after_copy else None)
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            errors.append(exc)
            ready.set()
    if not after_copy:
        freeze()
    flip = threading.Thread(target=go)
    flip.start()
    try:
        assert ready.wait(faults.TIMEOUT) and held, errors
        before = watch.new_visible(f"{at}, frozen")
        faults.wait_until(lambda: not flip.is_alive() or faults.blocked(
            router, HOT_SHARD, hotspot.DIRECTORY) > 0, "the rebalance to finish or wait")
        watch.expect(f"{at}, while the writer is frozen", before)
    finally:
        for cm in held:
            cm.__exit__(None, None, None)
    flip.join(faults.TIMEOUT)
    assert not flip.is_alive() and not errors, errors
    watch.expect(f"{at}, released", True)
    assert not watch.problems, watch.problems


@pytest.mark.slow
def test_add_follower_frozen_at_each_step_while_the_board_flips(rt, router, hot_board,
                                                                 monkeypatch):
    """Bug (b), flip: a flip between the home write and the listed shard's write hid the
    follower (and lost it once the home shard was cleaned)."""
    board, expected = hot_board
    args = {"shardmap": str(router.source.path), "board": board, "user": NEW_USER,
            "sequence": NEW_SEQ}
    trace = _steps_after_copy(rt, router, monkeypatch, board, expected, "add_follower", args)
    for n in range(1, len(trace) + 1):
        _reset(router, board, expected)
        watch, at = Watch(router, board, expected), f"frozen before step {n} {trace[n - 1]!r}"
        _flip_beside_frozen(rt, router, monkeypatch, watch,
                            lambda n=n: faults.frozen("add_follower", args, n), at,
                            after_copy=True)
        _assert_settled(router, board, expected)


def _follow(router, board: int) -> dict:
    """The new user follows the board (forward row only); the reverse chunk of that row."""
    MappingStore(router, "user_follows_boards").add(NEW_USER, board, NEW_SEQ)
    return {"shardmap": str(router.source.path), "table": FOLLOWERS,
            "shard": ids.shard_of(NEW_USER), "lo": NEW_USER, "hi": NEW_USER}


@pytest.mark.slow
def test_reverse_frozen_at_each_step_beside_a_rebalance(rt, router, hot_board, monkeypatch):
    """Bug (c): a reverse rebuild read the directory unlocked, and wrote home after the
    rebalance cleaned it, where no reader looks: the follower was lost."""
    board, expected = hot_board
    args = _follow(router, board)
    _reset(router, board, expected)
    trace = faults.steps("reverse", args)
    for n in range(1, len(trace) + 1):
        _reset(router, board, expected)
        watch, at = Watch(router, board, expected), f"frozen before step {n} {trace[n - 1]!r}"
        _flip_beside_frozen(rt, router, monkeypatch, watch,
                            lambda n=n: faults.frozen("reverse", args, n), at)
        _assert_settled(router, board, expected)


@pytest.mark.slow
def test_reverse_killed_between_any_two_statements(rt, router, hot_board, monkeypatch):
    """Bug (c), crash: a reverse chunk killed while the board is being copied leaves no
    row where readers would find it once, or lose it; its retry writes it exactly once."""
    board, _ = hot_board
    _killed_at_each_step(rt, router, monkeypatch, hot_board, "reverse", _follow(router, board),
                         lambda: _reverse(rt, router, [FOLLOWERS]))  # dispatched again


@pytest.fixture(autouse=True)
def _drop_new_follow(router):
    yield
    s = ids.shard_of(NEW_USER)
    router.run(s, lambda cur: cur.execute(
        f"DELETE FROM {shard_table(s, 'user_follows_boards')} WHERE from_id = %s", (NEW_USER,)))
