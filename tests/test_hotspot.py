"""Reverse rebuild, hotspot rebalance and the follower read/write paths, on two servers."""

import json
import random
import threading
import time

import pytest
import redis

from jobs import lifecycle, runs
from jobs.runtime import Runtime
from loaders.mappings import rebalance as rebalancer
from loaders.mappings import reverse as reverser
from shardfarm.errors import ConfigError
from sharding import hotspot, ids
from sharding.mappings import Edge, MappingStore
from sharding.mapsource import ShardMapSource
from sharding.router import Router
from sharding.schema import shard_table
from tests.conftest import SHARDS_A, SHARDS_B, run_farm
from tests.farmkit import start_workers, stop
from tests.migratekit import run_inline
from tests.ttykit import in_tty

HOT_SHARD = SHARDS_A[0] + 5
N_FOLLOWERS = 1200


def _sql(router, shard, sql, params=()):
    return router.query(router.host_for(shard), sql, params, shard)


@pytest.fixture
def rt(settings, ledger, router):
    redis.Redis.from_url(settings.redis_url).flushdb()
    r = Runtime(settings)
    yield r
    r.close()


@pytest.fixture
def hot_board(router):
    """A board on server A followed by N users spread over both servers (forward rows only)."""
    rng = random.Random(99)
    board = ids.encode(HOT_SHARD, "board", 900_000_000 + rng.randrange(10**6))
    shards = [*range(SHARDS_A[0], SHARDS_A[1] + 1), *range(SHARDS_B[0], SHARDS_B[1] + 1)]
    users = [ids.encode(rng.choice(shards), "user", 900_000_000 + i) for i in range(N_FOLLOWERS)]
    follows = [Edge(u, board, 1_500_000_000 + i // 7) for i, u in enumerate(users)]
    MappingStore(router, "user_follows_boards").add_many(follows)
    yield board, {(u, f.sequence) for u, f in zip(users, follows, strict=True)}
    for s in shards:
        for t in ("board_followedby_users", "user_follows_boards"):
            col = "from_id" if t == "board_followedby_users" else "to_id"
            router.run(s, lambda cur, s=s, t=t, col=col: cur.execute(
                f"DELETE FROM {shard_table(s, t)} WHERE {col} = %s", (board,)))
    router.run(HOT_SHARD, lambda cur: cur.execute(
        f"DELETE FROM {shard_table(HOT_SHARD, 'board_followedby_user_shard')} "
        "WHERE board_id = %s", (board,)))


def _run_inline(rt, kind, handler, params, chunks):
    run_id = rt.ledger.create_run(kind, "none", {**params, "handler": handler}, chunks)
    run_inline(rt, run_id, range(len(chunks)))
    assert rt.ledger.refresh_status(run_id) == "done", rt.ledger.failures(run_id)
    return run_id


def _reverse(rt, router, tables):
    params, chunks = reverser.plan(router, tables, chunk_rows=500)
    return _run_inline(rt, "reverse", reverser.HANDLER, params, chunks)


def _all_followers(router, board):
    out, cursor = [], None
    while True:
        page = hotspot.followers(router, board, 97, cursor)
        out += [(e.to_id, e.sequence) for e in page.edges]
        if page.next_cursor is None:
            return out
        cursor = page.next_cursor


def _rows_everywhere(router, board):
    """(shard, user, seq) of every board_followedby_users row of the board, on any shard."""
    out = []
    for s in [*range(SHARDS_A[0], SHARDS_A[1] + 1), *range(SHARDS_B[0], SHARDS_B[1] + 1)]:
        out += [(s, u, q) for u, q in _sql(router, s, "SELECT to_id, sequence FROM "
                                           f"{shard_table(s, 'board_followedby_users')} "
                                           "WHERE from_id = %s", (board,))]
    return out


def test_reverse_equals_inverted_forward(rt, router, hot_board):
    board, expected = hot_board
    _reverse(rt, router, ["board_followedby_users"])
    rows = _rows_everywhere(router, board)
    assert {(u, q) for _, u, q in rows} == expected and len(rows) == N_FOLLOWERS
    assert {s for s, _, _ in rows} == {HOT_SHARD}  # on the board's shard
    _reverse(rt, router, ["board_followedby_users"])  # again: nothing changes
    assert sorted(_rows_everywhere(router, board)) == sorted(rows)


@pytest.mark.slow
def test_reader_during_rebalance_sees_every_follower_once(rt, router, hot_board, monkeypatch):
    board, expected = hot_board
    _reverse(rt, router, ["board_followedby_users"])
    monkeypatch.setattr(rebalancer, "BATCH", 100)  # many small copy and clean steps
    seen, finished, errors = [], threading.Event(), []

    def reader():
        r = Router(ShardMapSource(router.source.path))
        while not finished.is_set():
            got = _all_followers(r, board)
            if len(got) != len(set(got)) or set(got) != expected:
                errors.append((len(got), len(set(got))))
            seen.append(len(got))
        r.close()
    checks = []

    def read_now(*_args):
        got = _all_followers(router, board)
        checks.append(len(got) == len(set(got)) and set(got) == expected)
    real_upsert = rebalancer._upsert

    def upsert_then_read(ctx, shard, rows):
        real_upsert(ctx, shard, rows)
        read_now()
    monkeypatch.setattr(rebalancer, "_upsert", upsert_then_read)
    monkeypatch.setattr(rebalancer, "after_state", read_now)
    t = threading.Thread(target=reader)
    t.start()
    try:
        params, chunks = rebalancer.plan(router, "board_followedby_users", 1000, 3)
        assert [c.args["board"] for c in chunks] == [board]
        _run_inline(rt, "rebalance", rebalancer.HANDLER, params, chunks)
    finally:
        finished.set()
        t.join()
    assert not errors and seen and len(checks) >= 30 and all(checks)
    entry = hotspot.Directory(router).get(board)
    assert entry.state == "cleaned" and len(entry.shards) == 3 and HOT_SHARD not in entry.shards
    assert {s for s, _, _ in _rows_everywhere(router, board)} <= set(entry.shards)


@pytest.mark.slow
@pytest.mark.parametrize("die_at", ["copying", "active", "cleaned"])
def test_rebalance_killed_at_each_state_completes_exactly(rt, router, hot_board, monkeypatch,
                                                          die_at):
    board, expected = hot_board
    _reverse(rt, router, ["board_followedby_users"])

    def die(b, state):
        if state == die_at:
            raise KeyboardInterrupt(f"killed after {state}")
    monkeypatch.setattr(rebalancer, "after_state", die)
    monkeypatch.setenv("FARM_LEASE_SECONDS", "0.5")
    params, chunks = rebalancer.plan(router, "board_followedby_users", 1000, 4)
    run_id = rt.ledger.create_run("rebalance", "none", {**params, "handler":
                                                        rebalancer.HANDLER}, chunks)
    with pytest.raises(KeyboardInterrupt):
        lifecycle.execute(rt, run_id, 0)
    assert hotspot.Directory(router).get(board).state == die_at
    assert sorted(_all_followers(router, board)) == sorted(expected)  # still exact
    monkeypatch.setattr(rebalancer, "after_state", lambda b, s: None)
    params, chunks = rebalancer.plan(router, "board_followedby_users", 1000, 4)
    if die_at != "cleaned":
        _run_inline(rt, "rebalance", rebalancer.HANDLER, params, chunks)
    else:
        assert chunks == []  # nothing left to do
    entry = hotspot.Directory(router).get(board)
    rows = _rows_everywhere(router, board)
    assert entry.state == "cleaned" and len(rows) == N_FOLLOWERS
    assert all(s == hotspot.follower_shard(u, entry.shards) for s, u, _ in rows)
    assert sorted(_all_followers(router, board)) == sorted(expected)
    params, chunks = rebalancer.plan(router, "board_followedby_users", 1000, 4)
    assert chunks == []  # re-running changes nothing


def test_reverse_after_rebalance_keeps_the_spread(rt, router, hot_board):
    board, expected = hot_board
    _reverse(rt, router, ["board_followedby_users"])
    params, chunks = rebalancer.plan(router, "board_followedby_users", 1000, 3)
    _run_inline(rt, "rebalance", rebalancer.HANDLER, params, chunks)
    before = sorted(_rows_everywhere(router, board))
    _reverse(rt, router, ["board_followedby_users"])
    after = sorted(_rows_everywhere(router, board))
    assert after == before and HOT_SHARD not in {s for s, _, _ in after}
    assert sorted(_all_followers(router, board)) == sorted(expected)


def test_write_path_during_and_after_rebalance(rt, router, hot_board):
    board, expected = hot_board
    _reverse(rt, router, ["board_followedby_users"])
    d = hotspot.Directory(router)
    d.plan(board, hotspot.choose_shards(router, board, 3))
    d.transition(board, "planned", "copying", None)
    early = ids.encode(SHARDS_B[0], "user", 950_000_001)
    hotspot.add_follower(router, board, early, 1_600_000_000)
    spread = hotspot.follower_shard(early, d.get(board).shards)
    assert {s for s, u, _ in _rows_everywhere(router, board) if u == early} == {HOT_SHARD,
                                                                                 spread}
    params, chunks = rebalancer.plan(router, "board_followedby_users", 1000, 3)
    _run_inline(rt, "rebalance", rebalancer.HANDLER, params, chunks)
    late = ids.encode(SHARDS_A[1], "user", 950_000_002)
    hotspot.add_follower(router, board, late, 1_600_000_001)
    page = hotspot.followers(router, board, 2)
    assert page.ids == [late, early]
    assert sorted(_all_followers(router, board)) == sorted(
        expected | {(early, 1_600_000_000), (late, 1_600_000_001)})


def test_bad_rebalance_requests(router):
    with pytest.raises(ConfigError, match="cannot rebalance"):
        rebalancer.plan(router, "user_has_pins", 10, 3)
    with pytest.raises(ConfigError, match="spread"):
        rebalancer.plan(router, "board_followedby_users", 10, 1)
    with pytest.raises(ConfigError, match="not a reverse table"):
        reverser.plan(router, ["pins"])


def test_a_table_named_twice_is_rebuilt_once(router, hot_board):
    """``farm reverse T T`` plans T once: its chunks were planned twice (every row written
    twice, and counted twice in the run's summary)."""
    once = reverser.plan(router, ["board_followedby_users"], chunk_rows=500)
    twice = reverser.plan(router, ["board_followedby_users"] * 2, chunk_rows=500)
    assert once[1] and twice == once


@pytest.mark.slow
def test_cli_reverse_and_rebalance_with_workers(rt, router, hot_board, farm_env):
    board, _ = hot_board
    workers = start_workers(farm_env, 2)
    try:
        out = run_farm(farm_env, "reverse", "board_followedby_users", "--wait")
        assert out.returncode == 0, out.stderr
        out = run_farm(farm_env, "rebalance", "board_followedby_users", "--threshold", "1000",
                       "--spread", "3", "--wait")
        assert out.returncode == 0, out.stderr
    finally:
        stop(workers)
    out = run_farm(farm_env, "followers", str(board), "--limit", "5")
    doc = json.loads(out.stdout)
    assert doc["directory"]["state"] == "cleaned" and len(doc["followers"]) == 5
    doc = runs.summary(rt, rt.ledger.latest_run("rebalance"))
    assert doc["loaded"] == {"board_followedby_users": N_FOLLOWERS}
    assert doc["boards"] == [{"board": board, "shards": 3}]  # which boards it moved
    code, shown = in_tty(farm_env, "summary", doc["run_id"])  # what a person reads
    assert code == 0 and f"board {board} now on 3 shards" in shown
    assert runs.summary(rt, rt.ledger.latest_run("rebalance"))["loaded"] == {
        "board_followedby_users": N_FOLLOWERS}


def test_reverse_chunks_pack_small_shards_and_cut_big_ones():
    groups = [(1, 10, 10, 3), (1, 11, 11, 3), (2, 5, 5, 2), (3, 7, 7, 9), (3, 8, 8, 1),
              (4, 1, 1, 1)]
    assert list(reverser.pack(groups, 8)) == [([[1, 10, 11], [2, 5, 5]], 8), ([[3, 7, 7]], 9),
                                              ([[3, 8, 8], [4, 1, 1]], 2)]
    assert list(reverser.pack(groups, 100)) == [([[1, 10, 11], [2, 5, 5], [3, 7, 8],
                                                  [4, 1, 1]], 19)]
    assert list(reverser.pack([], 8)) == []


def test_reverse_plan_cuts_a_big_shard_into_slices_of_whole_from_ids(router):
    """A shard holding over a quarter of a chunk is cut by the server into slices that
    begin where the rows before a from_id reach the next multiple of chunk_rows / SLICES,
    never inside a from_id; a small shard stays one group (real server, checked against
    the rows counted here)."""
    big, small = SHARDS_A[0] + 3, SHARDS_A[0] + 4
    rng = random.Random(7)
    counts = {ids.encode(big, "user", 800_000_000 + i): rng.choice([1, 2, 5, 9])
              for i in range(60)}
    counts[ids.encode(big, "user", 800_000_030)] = 70  # one from_id larger than a slice
    few = {ids.encode(small, "user", 800_000_000 + i): 1 for i in range(3)}
    MappingStore(router, "user_follows_boards").add_many(
        [Edge(u, ids.encode(HOT_SHARD, "board", 800_000_000 + k), 1_500_000_000)
         for u, n in {**counts, **few}.items() for k in range(n)])
    step = 20
    chunk_rows = step * reverser.SLICES
    try:
        groups = reverser._groups(
            reverser._slices(router, ["user_follows_boards"], step)["user_follows_boards"],
            chunk_rows)
        held = {s: dict(_sql(router, s, "SELECT from_id, COUNT(*) FROM "
                             f"{shard_table(s, 'user_follows_boards')} GROUP BY from_id"))
                for s in (big, small)}  # other tests' rows too
    finally:
        for shard, users in ((big, counts), (small, few)):
            router.run(shard, lambda cur, s=shard, u=list(users): cur.execute(
                f"DELETE FROM {shard_table(s, 'user_follows_boards')} WHERE from_id IN "
                f"({', '.join(['%s'] * len(u))})", u))
    assert counts.items() <= held[big].items() and few.items() <= held[small].items()
    expected: dict[int, list] = {}
    before = 0
    for user in sorted(held[big]):
        got = expected.setdefault(before // step, [big, user, user, 0])
        got[2], got[3] = user, got[3] + held[big][user]
        before += held[big][user]
    assert [g for g in groups if g[0] == big] == [tuple(g) for g in expected.values()]
    assert len(expected) > 5
    assert sum(g[3] for g in groups if g[0] == small) == sum(held[small].values())
    if sum(held[small].values()) <= chunk_rows // 4:  # as written here: 3 rows
        assert [g for g in groups if g[0] == small] == [
            (small, min(held[small]), max(held[small]), sum(held[small].values()))]


def test_reverse_chunks_share_the_rows_evenly():
    """Ten shards of 10 rows each, at most 60 a chunk: two chunks of 50, not 60 and 40;
    whole shards (from_id ranges) are the groups a chunk is made of."""
    groups = [(s, s * 100, s * 100 + 9, 10) for s in range(10)]
    chunks = list(reverser.pack(groups, 60))
    assert [n for _, n in chunks] == [50, 50]
    assert chunks[0][0] == [[s, s * 100, s * 100 + 9] for s in range(5)]


def test_a_directory_entry_in_no_known_state_fails_its_chunk(rt, router, hot_board):
    """A hot board's directory rows written by hand with a state the rebalance does not know:
    before, no step ran and the chunk 'succeeded' (the run done, exit 0, the board never
    spread, the same again on every run); now the chunk fails, naming what to repair."""
    board, _ = hot_board
    _reverse(rt, router, ["board_followedby_users"])
    directory = shard_table(HOT_SHARD, hotspot.DIRECTORY)
    router.run(HOT_SHARD, lambda cur: cur.executemany(
        f"INSERT INTO {directory} (board_id, shard, state) VALUES (%s, %s, 'copyin')",
        [(board, SHARDS_A[0]), (board, SHARDS_B[0])]))
    params, chunks = rebalancer.plan(router, "board_followedby_users", 1000, 2)
    assert [c.args["board"] for c in chunks] == [board]
    run_id = rt.ledger.create_run("rebalance", "none",
                                  {**params, "handler": rebalancer.HANDLER}, chunks)
    lifecycle.execute(rt, run_id, 0)
    assert rt.ledger.refresh_status(run_id) == "failed"
    (failure,) = rt.ledger.failures(run_id)
    assert "no state the rebalance knows" in str(failure) and hotspot.DIRECTORY in str(failure)
    assert {s for s, _, _ in _rows_everywhere(router, board)} == {HOT_SHARD}  # nothing moved


def test_a_directory_that_lists_the_home_shard_is_refused_not_read_twice(rt, router, hot_board,
                                                                         farm_env):
    """Directory rows forged (or corrupted) to list the board's home shard beside another:
    before, readers fanned out to the home shard too and saw its followers there twice (and
    the write path, the reverse rebuild and a cleanup worked through the entry); now every
    read, write and run through it refuses it in one line naming the table, the board and
    the shard, and no row is written anywhere."""
    board, _ = hot_board
    _reverse(rt, router, ["board_followedby_users"])
    before = sorted(_rows_everywhere(router, board))
    directory = shard_table(HOT_SHARD, hotspot.DIRECTORY)
    router.run(HOT_SHARD, lambda cur: cur.executemany(
        f"INSERT INTO {directory} (board_id, shard, state) VALUES (%s, %s, 'active')",
        [(board, HOT_SHARD), (board, SHARDS_B[0])]))
    want = (f"{hotspot.DIRECTORY} on shard {HOT_SHARD}: hot board {board} lists its own home "
            f"shard {HOT_SHARD} (its readers would see rows twice); repair its rows there")
    user = ids.encode(SHARDS_B[1], "user", 950_000_003)
    for call in (lambda: _all_followers(router, board),
                 lambda: hotspot.Directory(router).get(board),
                 lambda: hotspot.add_follower(router, board, user, 1_600_000_002)):
        with pytest.raises(hotspot.ListedHomeError) as caught:
            call()
        assert str(caught.value) == want
    with pytest.raises(hotspot.ListedHomeError, match=f"hot board {board + 1} lists its own"):
        hotspot.Directory(router).plan(board + 1, (HOT_SHARD, SHARDS_B[0]))  # never written
    assert hotspot.Directory(router).get(board + 1) is None
    params, chunks = reverser.plan(router, ["board_followedby_users"], chunk_rows=500)
    run_id = rt.ledger.create_run("reverse", "none", {**params, "handler": reverser.HANDLER},
                                  chunks)
    run_inline(rt, run_id, range(len(chunks)))
    assert rt.ledger.refresh_status(run_id) == "failed"
    failures = rt.ledger.failures(run_id)  # each chunk that writes to the home shard
    assert failures and all(want in str(f) for f in failures), failures
    out = run_farm(farm_env, "followers", str(board))
    assert out.returncode == 1 and out.stderr == f"farm: error: {want}\n", out.stderr
    assert sorted(_rows_everywhere(router, board)) == before  # nothing written anywhere


def test_hot_boards_listed_on_each_others_homes_rebuild_without_a_lock_cycle(
        rt, router, hot_board, monkeypatch):
    """Board X homed on A spread onto B, board Y homed on B spread onto A, both in one reverse
    chunk: each home transaction took its fence, then wrote its listed shard's rows on
    another connection, which needed the other home's fence: a wait cycle the server cannot
    see, and both sat until a timeout killed one (a rebuild after a rebalance took 30 s and
    more, 'MySQL server has gone away'). A barrier holds both home transactions at the step
    where they write their listed shards' rows, so the two always overlap there."""
    board_x, expected_x = hot_board
    y_home = SHARDS_B[0] + 2
    board_y = ids.encode(y_home, "board", 900_500_000)
    users = [ids.encode(SHARDS_A[0] + i % 4, "user", 900_600_000 + i) for i in range(40)]
    MappingStore(router, "user_follows_boards").add_many(
        [Edge(u, board_y, 1_500_000_000 + i) for i, u in enumerate(users)])
    listed = [(board_x, HOT_SHARD, y_home), (board_y, y_home, HOT_SHARD)]
    try:
        for board, home, shard in listed:
            router.run(home, lambda cur, b=board, h=home, s=shard: cur.execute(
                f"INSERT INTO {shard_table(h, hotspot.DIRECTORY)} (board_id, shard, state) "
                "VALUES (%s, %s, 'active')", (b, s)))
        barrier, real = threading.Barrier(2, timeout=30), reverser.write_shards

        def together(*args, **kwargs):
            barrier.wait()
            return real(*args, **kwargs)
        monkeypatch.setattr(reverser, "write_shards", together)
        params, chunks = reverser.plan(router, ["board_followedby_users"], chunk_rows=100_000)
        assert len(chunks) == 1
        t0 = time.monotonic()
        _run_inline(rt, "reverse", reverser.HANDLER, params, chunks)
        assert time.monotonic() - t0 < 20
        assert {(s, u, q) for s, u, q in _rows_everywhere(router, board_x)} == {
            (y_home, u, q) for u, q in expected_x}  # spread: on its listed shard only
        assert sorted(_rows_everywhere(router, board_y)) == sorted(
            (HOT_SHARD, u, 1_500_000_000 + i) for i, u in enumerate(users))
    finally:
        router.run(y_home, lambda cur: cur.execute(
            f"DELETE FROM {shard_table(y_home, hotspot.DIRECTORY)} WHERE board_id = %s",
            (board_y,)))
        for s in [*range(SHARDS_A[0], SHARDS_A[1] + 1), *range(SHARDS_B[0], SHARDS_B[1] + 1)]:
            for t, col in (("board_followedby_users", "from_id"), ("user_follows_boards",
                                                                   "to_id")):
                router.run(s, lambda cur, s=s, t=t, col=col: cur.execute(
                    f"DELETE FROM {shard_table(s, t)} WHERE {col} = %s", (board_y,)))
