"""A migration into a target that holds nothing of a table skips reading what it holds.

``migrate.first_load``: a chunk's first attempt, in the latest migrate run, of a table the
run's plan found absent from the target. Every other attempt reads the target as before:
these tests kill a first attempt, or plan a run before another, and change the legacy data
in between, so that only a read of the target can take out what is stale.
"""

from functools import partial

import pymysql
import pytest

from jobs.runtime import Runtime
from loaders.migration import migrate as migration
from loaders.migration import present, writer
from loaders.migration.build import TargetRows
from loaders.migration.spec import ORDER
from sharding import ids
from sharding.schema import mod_db, shard_db
from tests.migratekit import (
    checksums,
    dsn_kwargs,
    generate_legacy,
    killed,
    run_inline,
    truncate_target,
)


@pytest.fixture(scope="module")
def legacy_db(farm_env, settings, server_b, router, ledger):
    """A generated legacy database and an empty target; the migrate runs earlier tests
    left running or parked are cancelled (they would keep every plan from finding a
    table fresh); the target emptied after."""
    _end_migrate_runs(ledger)
    generate_legacy(farm_env, settings, server_b.port, 120, 5)
    yield
    truncate_target(server_b.port)


@pytest.fixture
def rt(settings, legacy_db, server_b):
    """A runtime on an empty target; its migrate runs are ended after the test."""
    r = Runtime(settings.with_(redis_url=settings.redis_url))
    truncate_target(server_b.port)
    yield r
    _end_migrate_runs(r.ledger)
    r.close()


def _end_migrate_runs(ledger) -> None:
    """Cancel every migrate run still running or paused."""
    for run_id in ledger.runs(limit=1000, active_only=True, kind="migrate"):
        ledger.cancel(run_id)
        ledger.refresh_status(run_id)


def _plan(settings, rt) -> tuple[dict, list]:
    """A plan of chunks of several slices (pins too)."""
    params, chunks = migration.plan(settings, rt.router, rt.ledger, 900, 300)
    params["handler"] = migration.HANDLER
    return params, chunks


@pytest.mark.slow
def test_a_plan_names_the_tables_the_target_holds_nothing_of(rt, server_b):
    """Any row of a table (an inactive object, a ``legacy_id_map`` row of its type, a link
    table's mapping row) takes it off the list; a migrate run at work empties the list."""
    assert migration.fresh_tables(rt.router, rt.ledger) == list(ORDER)
    shard, bucket = max(rt.router.shardmap.shards()), rt.router.shardmap.buckets - 1
    rt.router.run(shard, lambda cur: cur.execute(
        f"INSERT INTO `{shard_db(shard)}`.`comments` (local_id, data, active) "
        "VALUES (5, '{}', 0)"))
    rt.router.run_mod(bucket, lambda cur: cur.execute(
        f"INSERT INTO `{mod_db(bucket)}`.`legacy_id_map` (type_id, legacy_id, new_id) "
        "VALUES (%s, 7, 1)", (ids.TYPES["board"],)))
    rt.router.run(shard, lambda cur: cur.execute(
        f"INSERT INTO `{shard_db(shard)}`.`user_likes_pins` (from_id, to_id, sequence) "
        "VALUES (1, 2, 3)"))
    assert migration.fresh_tables(rt.router, rt.ledger) == ["users", "pins", "follows"]
    truncate_target(server_b.port)
    assert migration.fresh_tables(rt.router, rt.ledger) == list(ORDER)
    params, chunks = _plan(rt.settings, rt)
    rt.ledger.create_run("migrate", "none", params, chunks)
    assert migration.fresh_tables(rt.router, rt.ledger) == []


@pytest.mark.slow
def test_a_first_load_reads_nothing_and_writes_what_a_reading_one_does(rt, server_b,
                                                                       monkeypatch):
    """A fresh run's chunks never read what the target holds (the reads fail if called),
    and leave exactly what the same chunks leave when they read it."""
    params, chunks = _plan(rt.settings, rt)
    assert params["fresh"] == list(ORDER)
    reread = rt.ledger.create_run("migrate", "none", {**params, "fresh": []}, chunks)
    assert set(run_inline(rt, reread, range(len(chunks)))) == {"done"}
    reading = checksums(server_b.port)
    truncate_target(server_b.port)

    def unread(*args, **kwargs):
        raise AssertionError("a first load read the target")
    monkeypatch.setattr(present, "held_objects", unread)
    monkeypatch.setattr(present, "held_links", unread)
    fresh = rt.ledger.create_run("migrate", "none", params, chunks)
    assert set(run_inline(rt, fresh, range(len(chunks)))) == {"done"}
    assert checksums(server_b.port) == reading


@pytest.mark.slow
def test_a_first_load_of_several_slices_writes_each_shard_once(rt, server_b, monkeypatch):
    """A pins chunk of several slices reading the target (not fresh) writes each slice's
    objects as it goes, then the mapping rows; the same chunk in a fresh run writes its
    shards in one call, at its end, objects and mapping rows together (one transaction a
    group of shards, not one a slice)."""
    params, chunks = _plan(rt.settings, rt)
    pin_chunk = next(i for i, c in enumerate(chunks)
                     if c.kind == "pins" and len(c.args.get("slices", [])) >= 2)
    slices = len(chunks[pin_chunk].args["slices"])
    calls = _count_shard_writes(monkeypatch)
    for fresh in (False, True):
        truncate_target(server_b.port)
        run_id = rt.ledger.create_run("migrate", "none",
                                      params if fresh else {**params, "fresh": []}, chunks)
        assert run_inline(rt, run_id, range(pin_chunk)) == ["done"] * pin_chunk
        calls.clear()
        assert run_inline(rt, run_id, [pin_chunk]) == ["done"]
        assert calls == ([{"objects", "mappings"}] if fresh
                         else [{"objects"}] * slices + [{"mappings"}])


def _count_shard_writes(monkeypatch) -> list[set[str]]:
    """``writer.write_shards`` counted: for each call with rows, which of objects and
    mapping rows it carries."""
    calls: list[set[str]] = []
    real = writer.write_shards

    def counted(router, token, rows, **kw):
        kinds = {k for k in ("objects", "mappings") if getattr(rows, k)}
        if kinds:
            calls.append(kinds)
        real(router, token, rows, **kw)
    monkeypatch.setattr(writer, "write_shards", counted)
    return calls


def test_objects_a_few_a_shard_table_are_thin():
    """``thin``: ``writer.INSERT_ROWS`` objects a shard table on average or fewer (a slice
    over thousands of shards), not more (the same slice over 16 shards)."""
    def objects(tables: int, rows: int) -> TargetRows:
        out = TargetRows()
        for shard in range(tables):
            out.objects[(shard, "pins")] = [(i, "{}", i) for i in range(rows)]
        return out
    assert migration.thin(objects(4096, 25))
    assert migration.thin(objects(3, writer.INSERT_ROWS))
    assert not migration.thin(objects(3, writer.INSERT_ROWS + 1))
    assert not migration.thin(objects(16, 6250))


@pytest.mark.slow
def test_a_killed_first_attempts_successor_reads_what_it_left(rt, settings, monkeypatch):
    """A fresh run's pins chunk (several slices, written once at its end) is killed once
    the objects of one shard table are written; one of those pins is then made invalid in
    the legacy data. The second attempt (fence 2) reads the target, finds the pin's
    object, and retires it."""
    params, chunks = _plan(settings, rt)
    run_id = rt.ledger.create_run("migrate", "none", params, chunks)
    pin_chunk = next(i for i, c in enumerate(chunks)
                     if c.kind == "pins" and len(c.args.get("slices", [])) >= 2)
    assert run_inline(rt, run_id, range(pin_chunk)) == ["done"] * pin_chunk
    written: list = []
    killed(rt, run_id, pin_chunk, partial(_die_after_one_table, written), monkeypatch)
    pin = _small_pin(written[0])
    assert _active_pin_slots(rt.router, pin) == 1
    with _invalid_pin(settings, pin):
        assert set(run_inline(rt, run_id, range(pin_chunk, len(chunks)))) == {"done"}
        assert rt.ledger.chunk(run_id, pin_chunk)["attempts"] == 2
        assert _active_pin_slots(rt.router, pin) == 0


def _die_after_one_table(written: list, real):
    """A ``write_shards`` that writes the objects of the first shard table it is given
    (kept in ``written``) and is then killed."""
    def write(router, token, rows, **kw):
        first = next(iter(rows.objects))
        one = TargetRows()
        one.objects[first] = rows.objects[first]
        real(router, token, one, **kw)
        written.append(one)
        raise KeyboardInterrupt("worker killed")
    return write


@pytest.mark.slow
def test_a_run_planned_before_the_latest_reads_the_target(rt, settings):
    """Run A is planned on an empty target, then run B, which loads everything; a pin is
    made invalid in the legacy data. A's pins chunks, though each is on its first claim,
    read the target (B wrote after A's plan) and retire the pin."""
    params, chunks = _plan(settings, rt)
    older = rt.ledger.create_run("migrate", "none", params, chunks)
    fresh = rt.ledger.create_run("migrate", "none", params, chunks)
    assert set(run_inline(rt, fresh, range(len(chunks)))) == {"done"}
    pin = _loaded_pin(rt.router)
    with _invalid_pin(settings, pin):
        pins = [i for i, c in enumerate(chunks) if c.kind == "pins"]
        assert run_inline(rt, older, pins) == ["done"] * len(pins)
        assert _active_pin_slots(rt.router, pin) == 0


def _small_pin(rows) -> int:
    """A legacy ID below 2**35 among the pin objects of ``rows``."""
    return next(r[2] for objs in rows.objects.values() for r in objs if 0 < r[2] < 1 << 35)


def _loaded_pin(router) -> int:
    """The legacy ID of an active pin object whose local ID it is (below 2**35)."""
    s = min(router.shardmap.shards())
    return int(router.run(s, lambda cur: (cur.execute(
        f"SELECT MIN(local_id) FROM `{shard_db(s)}`.`pins` WHERE active = 1 AND local_id < %s",
        (1 << 35,)), cur.fetchone())[1])[0])


def _active_pin_slots(router, pin: int) -> int:
    """Active pin objects at local ID ``pin`` on any shard."""
    return sum(router.run(s, lambda cur, s=s: (cur.execute(
        f"SELECT COUNT(*) FROM `{shard_db(s)}`.`pins` WHERE local_id = %s AND active = 1",
        (pin,)), cur.fetchone())[1])[0] for s in router.shardmap.shards())


class _invalid_pin:
    """Within: legacy pin ``pin`` has no ``created_at`` (invalid: quarantined); put back after."""

    def __init__(self, settings, pin: int) -> None:
        self.conn = pymysql.connect(**dsn_kwargs(settings.legacy_dsn), autocommit=True)
        self.pin = pin

    def __enter__(self) -> None:
        with self.conn.cursor() as cur:
            cur.execute("SELECT created_at FROM pins WHERE id = %s", (self.pin,))
            self.was = cur.fetchone()[0]
            cur.execute("UPDATE pins SET created_at = NULL WHERE id = %s", (self.pin,))

    def __exit__(self, *exc) -> None:
        with self.conn.cursor() as cur:
            cur.execute("UPDATE pins SET created_at = %s WHERE id = %s", (self.was, self.pin))
        self.conn.close()
