"""``farm feeds rebuild`` with real workers; expected feeds come from plain SQL, not the loader."""

import json
import math
import random
import subprocess
import threading

import pytest
import redis

from sharding import ids
from sharding.mappings import Edge, MappingStore
from sharding.objects import ObjectStore
from tests.conftest import SHARDS_A, SHARDS_B, run_farm
from tests.farmkit import start_workers, stop

pytestmark = pytest.mark.slow  # end-to-end: real workers, servers or long waits

USER_SHARDS = [SHARDS_A[0] + 1, SHARDS_A[0] + 3, SHARDS_B[0] + 1, SHARDS_B[0] + 5]
BOARD_SHARDS = [SHARDS_A[0] + 2, SHARDS_A[0] + 5, SHARDS_B[0] + 2, SHARDS_B[0] + 6]
TABLES = ("users", "boards", "pins", "board_has_pins", "user_follows_boards")
SENTINEL_PINS = list(range(1, 701))  # no real pin has these IDs; longer than any feed
SENTINEL = [str(p) for p in SENTINEL_PINS]


def farm(env: dict, *args: str) -> subprocess.CompletedProcess:
    """The real ``farm`` CLI in a subprocess."""
    return run_farm(env, *args, timeout=120)


def summary(out: subprocess.CompletedProcess) -> dict:
    assert out.returncode == 0, out.stderr + out.stdout
    return json.loads(out.stdout.strip().splitlines()[-1])


def _truncate(router) -> None:
    for s in router.shardmap.shards():
        router.run(s, lambda cur, s=s: [cur.execute(f"TRUNCATE TABLE `db{s:05d}`.`{t}`")
                                        for t in TABLES])


@pytest.fixture(scope="module")
def graph(router):
    """Users and boards on both servers, pins with many equal sequences, repins, follows."""
    _truncate(router)
    rng = random.Random(7)
    objects = ObjectStore(router)
    users = [objects.create(USER_SHARDS[i % 4], "user", {"n": i}) for i in range(13)]
    boards = [objects.create(BOARD_SHARDS[i % 4], "board", {"n": i}) for i in range(9)]
    pins, has_pins = [], []
    for b, count in zip(boards[:8], (160, 90, 70, 40, 30, 25, 10, 5), strict=True):
        for _ in range(count):
            pin = objects.create(ids.shard_of(b), "pin", {"board": b})
            pins.append(pin)
            has_pins.append(Edge(b, pin, 1000 + rng.randrange(12)))  # many ties
    for pin in rng.sample(pins, 40):  # repins: the same pin on another board
        has_pins.append(Edge(rng.choice(boards[:8]), pin, 1000 + rng.randrange(14)))
    MappingStore(router, "board_has_pins").add_many(has_pins)
    follow = [Edge(u, b, 1) for u in users[:10] for b in rng.sample(boards, rng.randint(1, 6))]
    follow += [Edge(users[10], boards[8], 1)]  # only an empty board; users[11] follows nothing
    follow += [Edge(users[12], b, 1) for b in boards]  # users[12] is made inactive
    MappingStore(router, "user_follows_boards").add_many(follow)
    objects.delete(users[12])
    return {"users": users, "active": users[:12], "inactive": users[12]}


@pytest.fixture
def env(farm_env, ledger, settings):
    redis.Redis.from_url(settings.redis_url).flushdb()
    return farm_env


@pytest.fixture
def r(settings):
    conn = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    yield conn
    conn.close()


def expected_feed(router, user: int, length: int) -> list[str]:
    """Newest ``length`` distinct pins of the boards ``user`` follows, by plain SQL."""
    def q(shard: int, sql: str, arg: int) -> list[tuple]:
        return router.query(router.host_for(shard), sql.format(db=f"db{shard:05d}"), (arg,))
    best: dict[int, int] = {}
    for (board,) in q(ids.shard_of(user), "SELECT to_id FROM {db}.user_follows_boards "
                                  "WHERE from_id = %s", user):
        for pin, seq in q(ids.shard_of(board), "SELECT to_id, sequence FROM {db}.board_has_pins "
                                       "WHERE from_id = %s", board):
            best[pin] = max(seq, best.get(pin, seq))
    return [str(p) for p in sorted(best, key=lambda p: (best[p], p), reverse=True)[:length]]


def seed(r, users) -> None:
    for u in users:
        r.delete(f"home:{u}")
        r.rpush(f"home:{u}", *SENTINEL)


def run_with_burst_workers(env: dict, ledger, *args: str) -> dict:
    """Start a rebuild without --wait, run it with burst workers; the run's summary."""
    doc = summary(farm(env, "feeds", "rebuild", *args))
    start_workers(env, 2, "--burst").wait(timeout=60)
    assert ledger.refresh_status(doc["run_id"]) == "done"
    return doc


def test_listed_users_capped_by_length(graph, env, router, r, ledger):
    listed, skipped = graph["active"][1:], graph["active"][0]
    seed(r, graph["users"])
    doc = run_with_burst_workers(env, ledger, "--users", ",".join(map(str, listed)),
                                 "--length", "40")
    assert max(len(expected_feed(router, u, 10_000)) for u in listed) > 40  # the cap bites
    written = 0
    for u in listed:
        want = expected_feed(router, u, 40)
        assert r.lrange(f"home:{u}", 0, -1) == want, u
        written += bool(want)
    assert not r.exists(f"home:{graph['active'][10]}", f"home:{graph['active'][11]}")
    assert r.lrange(f"home:{skipped}", 0, -1) == SENTINEL  # not listed: untouched
    assert not r.keys("home:*:tmp")
    assert ledger.progress(doc["run_id"])[0]["rows_written"] == written


def test_every_user_by_ranges_with_wait(graph, env, router, r, ledger):
    seed(r, graph["users"])
    workers = start_workers(env, 2)
    try:
        doc = summary(farm(env, "feeds", "rebuild", "--chunk-size", "2", "--wait"))
    finally:
        stop(workers)
    written = sum(bool(expected_feed(router, u, 500)) for u in graph["active"])
    assert doc["status"] == "done" and doc["loaded"] == {"feeds": written}
    per_shard = [sum(ids.shard_of(u) == s for u in graph["active"]) for s in USER_SHARDS]
    assert ledger.run(doc["run_id"])["total_chunks"] == sum(math.ceil(n / 2) for n in per_shard)
    assert ledger.progress(doc["run_id"])[0]["rows_read"] == len(graph["active"])
    for u in graph["active"]:
        assert r.lrange(f"home:{u}", 0, -1) == expected_feed(router, u, 500), u
    assert r.lrange(f"home:{graph['inactive']}", 0, -1) == SENTINEL  # inactive: not rebuilt


class Reader(threading.Thread):
    """LRANGE 0 -1 over the feeds in a loop; records every list that is neither old nor new."""

    def __init__(self, url: str, allowed: dict[str, list[list[str]]]) -> None:
        super().__init__(daemon=True)
        self.conn = redis.Redis.from_url(url, decode_responses=True)
        self.allowed, self.bad, self.seen = allowed, [], {"old": 0, "new": 0}
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            for key, (old, new) in self.allowed.items():
                got = self.conn.lrange(key, 0, -1)
                if got in (old, new):
                    self.seen["old" if got == old else "new"] += 1
                else:
                    self.bad.append((key, len(got)))


def test_swap_is_atomic(graph, env, router, r, settings, ledger):
    from loaders.feedswap import begin, swap_feeds
    from sharding.fencing import FenceToken
    users = [u for u in graph["active"] if expected_feed(router, u, 500)]
    new = {u: expected_feed(router, u, 500) for u in users}
    seed(r, users)
    reader = Reader(settings.redis_url, {f"home:{u}": (SENTINEL, new[u]) for u in users})
    reader.start()
    try:
        run_with_burst_workers(env, ledger, "--users", ",".join(map(str, users)))
        fence = begin(r, FenceToken("t-atomic", 0, 1), lambda: None)  # a fence of its own
        for i in range(60):  # hammer: swap old and new lists back and forth under the reader
            swap_feeds(r, {u: SENTINEL_PINS if i % 2 == 0 else list(map(int, new[u]))
                           for u in users}, fence)
    finally:
        reader.done.set()
        reader.join()
    assert reader.bad == []
    assert reader.seen["old"] and reader.seen["new"]
    assert all(r.lrange(f"home:{u}", 0, -1) == new[u] for u in users)


def test_a_user_on_a_shard_the_map_does_not_hold_is_refused_before_a_run(farm_env, ledger,
                                                                        router):
    """``--users`` naming a user of a shard outside the map is a usage mistake, in one line
    before anything starts (a run was started, and its chunk failed on a worker)."""
    away = ids.encode(SHARDS_B[1] + 1, "user", 5)
    runs_before = ledger.runs(limit=1000)
    out = run_farm(farm_env, "feeds", "rebuild", "--users", f"{away}")
    assert out.returncode == 2, (out.returncode, out.stdout, out.stderr)
    assert out.stderr.splitlines() == [
        f"farm: error: --users: user {away} is on shard {SHARDS_B[1] + 1}, which the shard map "
        "does not hold"]
    assert ledger.runs(limit=1000) == runs_before
