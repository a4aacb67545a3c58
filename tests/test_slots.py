"""Object slots have one owner: a local ID below 2**35 is a legacy ID's own,
the shard allocates from 2**35 up, and no write replaces an object row it does not own.

Each test builds a tiny legacy database by hand, runs the migration's chunks in this
process (the real handler, real MariaDB on both servers) and inspects the target.
"""

from __future__ import annotations

import json
import os

import pymysql
import pytest

from jobs.runtime import Runtime
from loaders.migration import migrate as migration
from loaders.migration import verify as verifier
from loaders.migration import writer
from loaders.migration.build import TargetRows
from loaders.migration.claims import SlotChangedError
from loaders.migration.legacy_schema import create_legacy_schema
from sharding import ids
from sharding.mapsource import ShardMapSource
from sharding.modshard import bucket_of, legacy_key
from sharding.objects import ObjectStore
from sharding.router import Router
from sharding.schema import mod_table, shard_table
from tests.conftest import SHARDS_B
from tests.migratekit import checksums, quarantine_rows, run_inline, truncate_target

BIG = 2**40 + 7  # a legacy board ID too large to be a local ID
T0 = "2014-01-02 03:04:05"


def _kw(dsn) -> dict:
    return {"host": dsn.host, "port": dsn.port, "user": dsn.user, "password": dsn.password,
            "database": dsn.database}


@pytest.fixture
def rt(settings, router, ledger, server_b):
    """An empty target, an empty legacy database with one user, and a runtime."""
    truncate_target(server_b.port)
    create_legacy_schema(settings.legacy_dsn, drop=True)
    legacy(settings, "INSERT INTO users VALUES (1, 'alice', 'a@x.com', 'Alice', %s)", T0)
    runtime = Runtime(settings)
    yield runtime
    runtime.close()


def legacy(settings, sql: str, *params) -> None:
    """One statement on the legacy database."""
    conn = pymysql.connect(**_kw(settings.legacy_dsn), autocommit=True)
    with conn.cursor() as cur:
        cur.execute(sql, params)
    conn.close()


def add_boards(settings, *legacy_ids: int) -> None:
    """Boards of user 1, each created a second after the previous one."""
    for i, b in enumerate(legacy_ids):
        legacy(settings, "INSERT INTO boards VALUES (%s, 1, %s, NULL, %s + INTERVAL %s SECOND)",
               b, f"board {b}", T0, i + 1)


def migrate(rt, settings, chunk_rows: int = 50_000) -> str:
    """A whole migration, every chunk run here in order; returns the run ID."""
    params, chunks = migration.plan(settings, rt.router, rt.ledger, chunk_rows)
    run_id = rt.ledger.create_run("migrate", "none", {**params, "handler": migration.HANDLER},
                                  chunks)
    assert run_inline(rt, run_id, range(len(chunks))) == ["done"] * len(chunks)
    return run_id


def verify(rt, settings, of_run: str) -> list[dict]:
    """``farm verify`` of ``of_run``, run here; its mismatches."""
    p = rt.ledger.run(of_run)["params"]
    _, chunks = migration.plan(settings, rt.router, rt.ledger, p["chunk_rows"])
    params = {**p, "of_run": of_run, "handler": verifier.HANDLER}
    vid = rt.ledger.create_run("verify", "none", params, chunks)
    assert run_inline(rt, vid, range(len(chunks))) == ["done"] * len(chunks)
    return rt.ledger.mismatches.of_run(vid, limit=100)[1]


def new_id(router, type_name: str, legacy_id: int) -> int | None:
    """``legacy_id_map``'s new ID of a legacy object (read by hand)."""
    b = bucket_of(legacy_key(type_name, legacy_id), router.shardmap.buckets)
    rows = router.query(router.shardmap.mod_master(b),
                        f"SELECT new_id FROM {mod_table(b, 'legacy_id_map')} "
                        "WHERE type_id = %s AND legacy_id = %s",
                        (ids.TYPES[type_name], legacy_id))
    return rows[0][0] if rows else None


def slot(router, new: int) -> tuple[dict, int] | None:
    """The stored ``(data, active)`` of an object ID's slot."""
    d = ids.decode(new)
    q = shard_table(d.shard, "boards")
    rows = router.query(router.host_for(d.shard), f"SELECT data, active FROM {q} "
                        "WHERE local_id = %s", (d.local,), d.shard)
    return (json.loads(rows[0][0]), rows[0][1]) if rows else None


@pytest.mark.slow
def test_a_new_small_legacy_id_never_lands_on_an_allocated_board(rt, settings, router):
    """The reproduced bug: a big-ID board got local 12899 from the first run; board 12899,
    added later, then replaced it. Now allocation starts at 2**35: both survive."""
    add_boards(settings, 12898, BIG)
    migrate(rt, settings)
    add_boards(settings, 12899)
    second = migrate(rt, settings)
    assert quarantine_rows(_kw(settings.control_dsn), second) == []
    boards = {b: new_id(router, "board", b) for b in (12898, 12899, BIG)}
    assert None not in boards.values() and len(set(boards.values())) == 3
    assert ids.decode(boards[BIG]).local >= 2**35
    for b, new in boards.items():
        data, active = slot(router, new)
        assert (data["legacy_id"], data["name"], active) == (b, f"board {b}", 1)
    assert verify(rt, settings, second) == []


@pytest.mark.slow
def test_application_objects_never_collide_with_later_legacy_rows(rt, settings, router):
    """An object the application creates takes a slot no legacy ID can ever want."""
    add_boards(settings, 5)
    migrate(rt, settings)
    user = new_id(router, "user", 1)
    store = ObjectStore(router)
    app_id = store.create(ids.decode(user).shard, "board", {"name": "made by the app"})
    later = ids.decode(app_id).local  # the legacy database grows into that number
    add_boards(settings, later)
    run_id = migrate(rt, settings)
    assert store.get(app_id).data == {"name": "made by the app"}
    migrated = new_id(router, "board", later)
    assert migrated is not None and migrated != app_id
    assert slot(router, migrated)[0]["legacy_id"] == later
    assert later >= 2**35
    assert verify(rt, settings, run_id) == []


@pytest.mark.slow
def test_a_taken_slot_is_quarantined_and_left_alone(rt, settings, router, server_b):
    """A hand-made collision: the slot of legacy board 8 holds another object. Board 8 is
    quarantined ``local_id_taken`` with everything it would write; the row is untouched,
    and a re-run changes nothing (a row replaced by itself is fine)."""
    add_boards(settings, 7)
    migrate(rt, settings)
    user = new_id(router, "user", 1)
    shard = ids.decode(user).shard
    intruder = {"legacy_id": 999, "name": "hand-made"}
    router.run(shard, lambda cur: cur.execute(
        f"INSERT INTO {shard_table(shard, 'boards')} VALUES (8, %s, 1)",
        (json.dumps(intruder),)))
    add_boards(settings, 8, 9)
    first = migrate(rt, settings)
    assert quarantine_rows(_kw(settings.control_dsn), first) == [
        ("boards", "8", "local_id_taken")]
    taken = ids.encode(shard, "board", 8)
    assert slot(router, taken) == (intruder, 1)
    assert new_id(router, "board", 8) is None
    assert not router.query(router.host_for(shard), "SELECT 1 FROM "
                            f"{shard_table(shard, 'user_has_boards')} WHERE to_id = %s",
                            (taken,), shard)
    assert slot(router, new_id(router, "board", 9))[0]["legacy_id"] == 9
    assert slot(router, new_id(router, "board", 7))[0]["legacy_id"] == 7
    before = checksums(server_b.port)
    again = migrate(rt, settings)
    assert quarantine_rows(_kw(settings.control_dsn), again) == [
        ("boards", "8", "local_id_taken")]
    assert checksums(server_b.port) == before


@pytest.mark.slow
def test_verify_reports_two_claims_on_one_slot(rt, settings, router):
    """Two legacy IDs mapped to one new ID (the bug's end state) is an object mismatch,
    not only a mapping row's sequence."""
    add_boards(settings, 12899, BIG)
    run_id = migrate(rt, settings)
    small, big = new_id(router, "board", 12899), new_id(router, "board", BIG)
    s, b = ids.decode(small), ids.decode(big)
    q = shard_table(s.shard, "boards")

    def corrupt(cur) -> None:
        cur.execute(f"UPDATE {q} AS t JOIN {q} AS o ON o.local_id = %s SET t.data = o.data "
                    "WHERE t.local_id = %s", (b.local, s.local))
        cur.execute(f"DELETE FROM {q} WHERE local_id = %s", (b.local,))
    router.run(s.shard, corrupt)
    bucket = bucket_of(legacy_key("board", BIG), router.shardmap.buckets)
    router.run_mod(bucket, lambda cur: cur.execute(
        f"UPDATE {mod_table(bucket, 'legacy_id_map')} SET new_id = %s "
        "WHERE type_id = 2 AND legacy_id = %s", (small, BIG)))
    problems = verify(rt, settings, run_id)
    claimed = {(m["legacy_key"], m["target"]) for m in problems if "claimed" in m["problem"]}
    assert claimed == {("12899", "boards"), (str(BIG), "boards")}


@pytest.mark.slow
def test_each_chunk_allocates_with_its_own_router(rt, settings, router, map_path, tmp_path,
                                                  monkeypatch):
    """A process's later chunk of the same run routes big-ID allocation with that chunk's
    router, never with a router an earlier chunk brought (whose map may be stale)."""
    monkeypatch.setenv("FARM_CONNECT_TIMEOUT", "1")
    add_boards(settings, BIG, BIG + 1)
    stale_path = tmp_path / "stale.json"
    doc = json.loads(map_path.read_text())
    stale_path.write_text(json.dumps(doc))
    stale = Router(ShardMapSource(stale_path, interval=0))
    params, chunks = migration.plan(settings, router, rt.ledger, 1)
    # every table has a chunk (a re-run must visit deleted keys); only these three hold rows
    assert [(c.kind, c.rows > 0) for c in chunks][:3] == [("users", True), ("boards", True),
                                                         ("boards", True)]
    assert not any(c.rows for c in chunks[3:])
    run_id = rt.ledger.create_run("migrate", "none", {**params, "handler": migration.HANDLER},
                                  chunks)
    rt.router = stale
    assert run_inline(rt, run_id, (0, 1)) == ["done", "done"]
    # the stale router's map now sends mod buckets to a server that does not answer
    doc["hosts"]["Gone"] = {"host": "127.0.0.1", "port": 9, "user": "root", "password": ""}
    doc["mod"]["ranges"][0]["master"] = "Gone"
    doc["version"] += 1
    stale_path.write_text(json.dumps(doc))
    st = os.stat(stale_path)
    os.utime(stale_path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    rt.router = router
    try:
        assert run_inline(rt, run_id, (2,)) == ["done"]
    finally:
        del rt.router  # the session's router is not the runtime's to close
        stale.close()
    assert len({new_id(router, "board", b) for b in (BIG, BIG + 1)} - {None}) == 2


@pytest.mark.parametrize("insert_rows", [1000, 0], ids=["insert", "infile"])
@pytest.mark.parametrize("appeared", ["own", "foreign"])
def test_a_slot_filled_between_survey_and_write(router, appeared, insert_rows, monkeypatch):
    """A row lands in a slot the survey saw empty (a predecessor of the same chunk, or a
    hand edit): the writer replaces its own row, and refuses (retryable) to touch another,
    whether the rows go as an INSERT or as a file."""
    monkeypatch.setattr(writer, "INSERT_ROWS", insert_rows)
    shard, local = SHARDS_B[0] + 6, 4321
    q = shard_table(shard, "pins")
    router.run(shard, lambda cur: cur.execute(f"DELETE FROM {q} WHERE local_id IN (4321, 4322)"))
    rows = TargetRows()
    rows.objects[(shard, "pins")] = [(local, json.dumps({"legacy_id": local, "v": "new"}), local),
                                     (4322, json.dumps({"legacy_id": 4322, "v": "new"}), 4322)]
    there = {"legacy_id": local if appeared == "own" else 77, "v": "old"}
    router.run(shard, lambda cur: cur.execute(
        f"INSERT INTO {q} VALUES (%s, %s, 1)", (local, json.dumps(there))))
    stored = f"SELECT local_id, data FROM {q} WHERE local_id IN (4321, 4322) ORDER BY local_id"
    if appeared == "own":
        writer.write_shards(router, None, rows, held={})
        got = router.query(router.host_for(shard), stored, (), shard)
        assert [json.loads(d)["v"] for _, d in got] == ["new", "new"]
    else:
        with pytest.raises(SlotChangedError):
            writer.write_shards(router, None, rows, held={})
        got = router.query(router.host_for(shard), stored, (), shard)
        assert [(n, json.loads(d)) for n, d in got] == [(local, there)]  # all rolled back
    router.run(shard, lambda cur: cur.execute(f"DELETE FROM {q} WHERE local_id IN (4321, 4322)"))
