"""``farm shards move``: 8 shards to a real replication pair while a writer keeps adding pins
through the stores; every write is found and both copies match exactly."""

from __future__ import annotations

import json
import threading

import pymysql
import pytest

from shardfarm.errors import RetryableError
from sharding import ids
from sharding.mappings import Edge, MappingStore
from sharding.mapsource import ShardMapSource
from sharding.objects import ObjectStore
from sharding.router import Router
from sharding.schema import DIRECTORY_TABLES, MAPPING_TABLES, OBJECT_TABLES, shard_db
from tests.conftest import SHARDS_A, map_with_pair, run_farm
from tests.farmkit import start_workers, stop, until

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("park_leftover_runs")]
SHARDS = range(SHARDS_A[0], SHARDS_A[1] + 1)
TABLES = [*OBJECT_TABLES, *MAPPING_TABLES, *DIRECTORY_TABLES]
SEED_USER = 4242


class Writer(threading.Thread):
    """Adds a pin and its user_has_pins row, round-robin over the shards, through the stores;
    a retryable error (a frozen shard, a stale map) is retried until the write is in."""

    def __init__(self, router: Router) -> None:
        super().__init__(daemon=True)
        self.objects, self.edges = ObjectStore(router), MappingStore(router, "user_has_pins")
        self.router = router
        self.done: list[tuple[int, int]] = []  # (user, pin)
        self.retried = 0
        self.stop_at: int | None = None
        self.error: BaseException | None = None

    def _retry(self, fn):
        while True:
            try:
                return fn()
            except RetryableError:
                self.retried += 1

    def run(self) -> None:
        try:
            i = 0
            while self.stop_at is None or len(self.done) < self.stop_at:
                shard = SHARDS[i % len(SHARDS)]
                user = ids.encode(shard, "user", 1_000_000 + i % len(SHARDS))
                pin = self._retry(lambda s=shard, i=i: self.objects.create(s, "pin", {"n": i}))
                self._retry(lambda u=user, p=pin, i=i: self.edges.add(u, p, i))
                self.done.append((user, pin))
                i += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


def _forget_writer(cur, shard: int) -> None:
    """Remove the move's state and the writer's rows from a source shard."""
    db = shard_db(shard)
    cur.execute(f"DELETE FROM `{db}`.shard_state")
    cur.execute(f"DELETE FROM `{db}`.pins WHERE JSON_KEYS(data) = JSON_ARRAY('n')")
    cur.execute(f"DELETE FROM `{db}`.user_has_pins WHERE from_id BETWEEN %s AND %s",
                (ids.encode(shard, "user", 1_000_000), ids.encode(shard, "user", 1_000_010)))


def _rows(port: int, shard: int, table: str) -> set[tuple]:
    conn = pymysql.connect(host="127.0.0.1", port=port, user="root")
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT * FROM `{shard_db(shard)}`.`{table}`")
            return set(cur.fetchall())
    finally:
        conn.close()


@pytest.fixture
def moved_map(tmp_path, server_b, repl_pair, router):
    """A map file with the pair's hosts; the pair's copies are dropped after the test."""
    path = tmp_path / "map.json"
    path.write_text(json.dumps(map_with_pair(server_b.port, repl_pair)))
    owner = ids.encode(SHARDS[0], "user", SEED_USER)
    MappingStore(router, "user_has_pins").add_many(
        Edge(owner, ids.encode(SHARDS[0], "pin", 10_000 + k), k) for k in range(2500))
    yield path
    for s in SHARDS:
        repl_pair.master.sql(f"DROP DATABASE IF EXISTS `{shard_db(s)}`")
        router.run_on(router.host_for(s), lambda cur, s=s: _forget_writer(cur, s), s)
    router.run(SHARDS[0], lambda cur: cur.execute(
        f"DELETE FROM `{shard_db(SHARDS[0])}`.user_has_pins WHERE from_id = %s", (owner,)))


def test_move_eight_shards_under_writes_loses_nothing(moved_map, repl_pair, env):
    e = {**env, "FARM_SHARDMAP": str(moved_map)}
    live = Router(ShardMapSource(moved_map, interval=0.2))
    writer = Writer(live)
    workers = start_workers(e, 2)
    try:
        writer.start()
        until(lambda: len(writer.done) >= 20, what="the writer to get going")
        at_start = len(writer.done)
        out = run_farm(e, "shards", "move", f"{SHARDS[0]}-{SHARDS[-1]}", "--to", "PairM/PairS",
                       "--wait", "--rows-per-chunk", "1000", timeout=600)
        assert out.returncode == 0, out.stderr[-1000:] + run_farm(e, "failed").stdout[-3000:]
        summary = json.loads(out.stdout.splitlines()[-1])
        assert len(writer.done) > at_start + 20  # the stores kept writing during the move
        writer.stop_at = len(writer.done) + 30  # and 30 more writes with the new map
        writer.join(timeout=120)
    finally:
        writer.stop_at = 0
        log = stop(workers)
    assert writer.error is None, writer.error
    assert summary["version"] == 2 and summary["rows"]["user_has_pins"] >= 2500, summary
    assert live.shardmap.version == 2 and live.shardmap.master(SHARDS[3]).name == "PairM"
    assert ObjectStore(live).get_many([p for _, p in writer.done]).missing == []
    for user, pin in writer.done:
        assert pin in MappingStore(live, "user_has_pins").page(user, limit=10_000).ids, pin
    written = {(ids.decode(p).shard, ids.decode(p).local) for _, p in writer.done}
    repl_pair.wait_caught_up()
    for s in SHARDS:
        for t in TABLES:
            old, new = _rows(3306, s, t), _rows(repl_pair.master.port, s, t)
            assert old <= new, (s, t, len(old - new))
            extra = new - old  # only the writer's writes after the flip
            if t == "pins":
                assert {(s, r[0]) for r in extra} <= written, (s, t)
            elif t == "user_has_pins":
                assert {r[1] for r in extra} <= {p for _, p in writer.done}, (s, t)
            else:
                assert not extra, (s, t)
            assert _rows(repl_pair.slave.port, s, t) == new, (s, t)
    assert "Traceback" not in log
    print(summary, "writes:", len(writer.done), "retried:", writer.retried)


def _kill_move_at(env: dict, map_path, lo: int, hi: int, step: int, monkeypatch) -> None:
    """``shards move LO-HI --to PairM/PairS`` in a child SIGKILLed just before its ``step``-th
    shard_state write: first each new copy records the next version, then each source is
    frozen, the map flipped, and each source thawed."""
    from tests import faults
    monkeypatch.setenv("FARM_FAULT_MATCH", "frozen = VALUES(frozen)")  # set_state only
    args = {"shardmap": str(map_path), "env": env, "lo": lo, "hi": hi, "to": "PairM/PairS"}
    assert faults.run_killed("move", args, step) == -9
    monkeypatch.delenv("FARM_FAULT_MATCH")


def _current_map(map_path):
    """The shard map the file holds now."""
    router = Router(ShardMapSource(map_path, interval=0))
    router.close()
    return router.shardmap


def _source_states(map_path, shards) -> list[tuple[int, bool]]:
    """``(map_version, frozen)`` each of ``shards`` records on its source server (TestA1)."""
    from sharding import fencing
    router = Router(ShardMapSource(map_path, interval=0))
    try:
        source = router.shardmap.hosts["TestA1"]
        return [router.run_on(source, lambda cur, s=s: fencing.state(cur, s), s)
                for s in shards]
    finally:
        router.close()


def test_a_move_killed_while_freezing_finishes_when_run_again(moved_map, repl_pair, env,
                                                               ledger, monkeypatch):
    """Killed after freezing the first source shard (the map not flipped yet): that shard
    refuses writes until the same move is run again, which resumes the same copy run,
    catches up, flips and thaws; both copies then match exactly."""
    e = {**env, "FARM_SHARDMAP": str(moved_map)}
    lo, hi = SHARDS[0], SHARDS[1]
    workers = start_workers(e, 2)
    try:
        # steps 1-2: the new copies record the next version; 3: the first source frozen
        _kill_move_at(e, moved_map, lo, hi, 4, monkeypatch)
        assert _current_map(moved_map).version == 1
        assert _source_states(moved_map, (lo, hi)) == [(0, True), (0, False)]
        (killed_run,), = ledger.pool.query("SELECT run_id FROM runs WHERE kind = 'shardmove' "
                                           "ORDER BY created_at DESC LIMIT 1")
        out = run_farm(e, "shards", "move", f"{lo}-{hi}", "--to", "PairM/PairS", "--wait",
                       "--rows-per-chunk", "1000", timeout=300)
    finally:
        log = stop(workers)
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads(out.stdout.splitlines()[-1])
    assert summary["run_id"] == killed_run and summary["version"] == 2, summary
    assert _source_states(moved_map, (lo, hi)) == [(2, False), (2, False)]
    repl_pair.wait_caught_up()
    for s in (lo, hi):
        for t in TABLES:
            assert _rows(3306, s, t) == _rows(repl_pair.master.port, s, t), (s, t)
    assert "Traceback" not in log


def test_a_move_killed_between_its_flip_and_its_thaw_is_finished_when_run_again(
        moved_map, repl_pair, env, ledger, monkeypatch):
    """Killed right after the flip, before the first source copy recorded it: the map
    already sends writers to the new pair; running the same move again has both source
    copies record the flipped version and thaws them, so --drop-source can drop them."""
    e = {**env, "FARM_SHARDMAP": str(moved_map)}
    lo, hi = SHARDS[2], SHARDS[3]
    workers = start_workers(e, 2)
    try:
        # 1-2: the new copies record the next version; 3-4: both sources frozen; 5: thaw
        _kill_move_at(e, moved_map, lo, hi, 5, monkeypatch)
    finally:
        log = stop(workers)
    flipped = _current_map(moved_map)
    assert flipped.version == 2 and flipped.master(lo).name == "PairM"
    assert _source_states(moved_map, (lo, hi)) == [(0, True), (0, True)]
    move = ("shards", "move", f"{lo}-{hi}", "--to", "PairM/PairS")
    out = run_farm(e, *move, "--drop-source", "--dry-run", timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    preview = json.loads(out.stdout.splitlines()[-1])
    assert preview["dry_run"] and preview["already_flipped"], preview
    assert preview["would_drop"] == [f"TestA1:{shard_db(s)}" for s in (lo, hi)]
    assert _source_states(moved_map, (lo, hi)) == [(0, True), (0, True)]  # a dry run: as it was
    out = run_farm(e, *move, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads(out.stdout.splitlines()[-1])
    assert summary["already_flipped"] and summary["version"] == 2, summary
    assert summary["sources_recorded"] == [lo, hi] and "dropped" not in summary
    assert _source_states(moved_map, (lo, hi)) == [(2, False), (2, False)]
    assert "Traceback" not in log


def test_a_second_move_of_the_same_shards_is_refused_while_one_runs(moved_map, repl_pair, env,
                                                                    ledger, monkeypatch):
    """Move A is stopped just before it freezes its first source (its copy done); the same
    move started again meanwhile (another terminal) would catch up and copy again after A
    flips, over the writes the new master takes by then: it is refused at once, in one
    line, changing nothing, and A then finishes. Run after A, it finds A's flip done."""
    from tests import faults
    e = {**env, "FARM_SHARDMAP": str(moved_map)}
    lo, hi = SHARDS[4], SHARDS[5]
    move = ("shards", "move", f"{lo}-{hi}", "--to", "PairM/PairS", "--rows-per-chunk", "1000")
    workers = start_workers(e, 2)
    try:
        monkeypatch.setenv("FARM_FAULT_MATCH", "frozen = VALUES(frozen)")  # set_state only
        args = {"shardmap": str(moved_map), "env": e, "lo": lo, "hi": hi, "to": "PairM/PairS"}
        # steps 1-2: the new copies record the next version; 3: the first source frozen
        with faults.frozen("move", args, 3):
            out = run_farm(e, *move, timeout=120)
            assert out.returncode == 1, out.stderr[-2000:]
            lines = out.stderr.strip().splitlines()
            assert len(lines) == 1 and f"shard {lo} is being moved by another" in lines[0], lines
            assert _current_map(moved_map).version == 1
            assert _source_states(moved_map, (lo, hi)) == [(0, False), (0, False)]
        monkeypatch.delenv("FARM_FAULT_MATCH")
        assert _current_map(moved_map).version == 2
        out = run_farm(e, *move, timeout=120)
    finally:
        log = stop(workers)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.splitlines()[-1])["already_flipped"]
    assert _source_states(moved_map, (lo, hi)) == [(2, False), (2, False)]
    assert "Traceback" not in log


def test_a_flip_whose_answer_is_lost_is_recorded_by_the_sources(moved_map, repl_pair, env):
    """The map write lands but raises (its answer lost on the way back): the move looks at
    the map in force, finds its flip there, and has the sources record it. Thawing them
    without it let a writer still routing with the old map write to the old home, where
    nobody reads any more."""
    from tests import faults
    e = {**env, "FARM_SHARDMAP": str(moved_map)}
    lo, hi = SHARDS[6], SHARDS[7]
    args = {"shardmap": str(moved_map), "env": e, "lo": lo, "hi": hi, "to": "PairM/PairS",
            "lose_map_reply": True}
    workers = start_workers(e, 2)
    try:
        faults.steps("move", args)  # runs it once, untouched but for the lost answer: exit 0
    finally:
        log = stop(workers)
    assert _current_map(moved_map).version == 2
    assert _source_states(moved_map, (lo, hi)) == [(2, False), (2, False)]
    assert "Traceback" not in log


def _probe(cur, shard: int) -> int:
    """Add a pin straight to ``shard``'s source copy (no store: the freeze does not stop it),
    as a catch-up would copy it; its local ID."""
    cur.execute(f"INSERT INTO `{shard_db(shard)}`.pins (data) VALUES (JSON_OBJECT('n', -1))")
    return cur.lastrowid


@pytest.mark.parametrize(("step", "caught", "copied"), [
    (1, "the catch-up, with nothing frozen", None),  # the copy run (after it) may copy it
    (3, f"the frozen catch-up of {shard_db(SHARDS[0])}.", False)],
    ids=["unfrozen", "frozen"])  # the same ids in every namespace (xdist compares them)
def test_a_move_that_lost_its_lock_stops_before_it_freezes_or_flips(
        moved_map, repl_pair, env, settings, ledger, router, monkeypatch, step, caught, copied):
    """The server-side thread of the move's lock connection is killed (KILL from another
    connection) while the move is stopped just before its ``step``-th shard_state write: 1,
    the first new copy records the next version (the lock is checked again before the
    catch-up); 3, the first source is frozen (the frozen catch-up checks the lock before each
    range it compares, so it copies nothing more: a pin added to the last shard then is not
    on the new master). Without the lock a second move could run beside it: the move stops
    in one line, the map unflipped and the sources thawed, and running it again finishes
    it."""
    from loaders.capacity.movelock import lock_name
    from tests import faults
    e = {**env, "FARM_SHARDMAP": str(moved_map)}
    lo, hi = SHARDS[0], SHARDS[1]
    move = ["shards", "move", f"{lo}-{hi}", "--to", "PairM/PairS", "--rows-per-chunk", "1000"]
    name = lock_name(settings.control_dsn.database, lo)
    workers = start_workers(e, 2)
    try:
        monkeypatch.setenv("FARM_FAULT_MATCH", "frozen = VALUES(frozen)")  # set_state only
        args = {"shardmap": str(moved_map), "env": e, "argv": move}
        with faults.frozen("farm", args, step, rc=1) as proc:
            (holder,), = ledger.pool.query("SELECT IS_USED_LOCK(%s)", (name,))
            faults.kill(ledger.pool, holder)
            probe = router.run_on(router.host_for(hi), lambda cur: _probe(cur, hi), hi)
        monkeypatch.delenv("FARM_FAULT_MATCH")
        assert _current_map(moved_map).version == 1
        assert _source_states(moved_map, (lo, hi)) == [(0, False), (0, False)]
        lines = [x for x in proc.err.strip().splitlines() if not x.startswith("farm: note:")]
        assert len(lines) == 1 and "lost its locks on the control database" in lines[0], lines
        assert f"before {caught}" in lines[0], lines
        if copied is not None:
            assert (probe in {r[0] for r in _rows(repl_pair.master.port, hi, "pins")}) == copied
        out = run_farm(e, *move, timeout=300)
    finally:
        log = stop(workers)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.splitlines()[-1])["version"] == 2
    assert _source_states(moved_map, (lo, hi)) == [(2, False), (2, False)]
    assert probe in {r[0] for r in _rows(repl_pair.master.port, hi, "pins")}  # run again: there
    assert "Traceback" not in log


def test_a_cancelled_copy_is_told_as_cancelled_and_the_same_move_resumes_it(moved_map, repl_pair,
                                                                             env):
    """Before, a copy run the operator cancelled was told as "ended cancelled: see 'farm
    failed'", which lists nothing worth reading for it."""
    from jobs.runtime import Runtime
    from shardfarm.errors import FatalError
    from shardfarm.settings import Settings
    from workers import capacity
    e = {**env, "FARM_SHARDMAP": str(moved_map)}
    lo, hi = SHARDS[1], SHARDS[2]  # a range no other test moves: its copy run is this one's
    rt = Runtime(Settings.from_env(e))
    copies: list[str] = []

    def cancel(run_id: str) -> str:  # the operator cancels it before any worker takes it
        copies.append(run_id)
        rt.ledger.cancel(run_id)
        return rt.ledger.refresh_status(run_id)
    try:
        with pytest.raises(FatalError) as err:
            capacity.move(rt, lo, hi, "PairM", "PairS", rows_per_range=1000, follow=cancel)
    finally:
        rt.close()
    assert str(err.value) == (f"copy run {copies[0]} was cancelled ('farm cancel'); run the "
                              "same move again to resume it")
    workers = start_workers(e, 2)
    try:
        out = run_farm(e, "shards", "move", f"{lo}-{hi}", "--to", "PairM/PairS", "--wait",
                       "--rows-per-chunk", "1000", timeout=300)
    finally:
        stop(workers)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.splitlines()[-1])["run_id"] == copies[0]
    repl_pair.wait_caught_up()
    for s in (lo, hi):
        for t in TABLES:
            assert _rows(3306, s, t) == _rows(repl_pair.master.port, s, t), (s, t)
