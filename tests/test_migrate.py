"""Migration of a generated legacy database into the two-server test map.

The target is checked by ``tests.contract_checker``, written from CONTRACTS.md
without importing the loader.
"""

import itertools
import json
import os
from functools import partial

import pymysql
import pytest
import redis

from jobs.runtime import Runtime
from loaders.migration import migrate as migration
from sharding.ids import MAX_LOCAL
from tests.conftest import run_farm
from tests.contract_checker import check_migration
from tests.farmkit import start_workers, stop
from tests.migratekit import (
    checksums,
    die_at_second_slice,
    dsn_kwargs,
    killed,
    last_json,
    quarantine_rows,
    run_inline,
    truncate_target,
)

USERS = 250


@pytest.fixture(scope="module")
def migrated(farm_env, settings, router, ledger, server_b, map_path):
    """Generate legacy data, migrate it with two real workers; yield the summary."""
    redis.Redis.from_url(settings.redis_url).flushdb()
    truncate_target(server_b.port)
    out = run_farm(farm_env, "legacy", "generate", "--users", str(USERS), "--seed", "11",
                   "--replace")
    assert out.returncode == 0, out.stderr
    generated = last_json(out.stdout)
    workers = start_workers({**farm_env, "FARM_LEASE_SECONDS": "10"}, 2)
    try:
        # chunks of two or three slices (the second full run below is not sliced, and must
        # find nothing to change)
        out = run_farm(farm_env, "migrate", "--chunk-size", "700", "--slice-size", "300",
                       "--wait", timeout=600)
        assert out.returncode == 0, out.stderr + out.stdout + run_farm(farm_env, "failed").stdout
        yield {"summary": last_json(out.stdout), "generated": generated, "workers": workers}
    finally:
        stop(workers)


@pytest.mark.slow
def test_summary_matches_generator_expectation(migrated):
    s, g = migrated["summary"], migrated["generated"]
    assert s["status"] == "done" and s["failed_chunks"] == 0
    assert s["loaded"] == g["expected"]["loaded"]
    assert s["quarantined"] == g["expected"]["quarantined"]
    assert set(s["loaded"]) == {"users", "boards", "pins", "comments", "follows", "likes"}


def test_target_matches_contract(migrated, settings, map_path):
    problems = check_migration(dsn_kwargs(settings.legacy_dsn), json.loads(map_path.read_text()),
                               quarantine_rows(dsn_kwargs(settings.control_dsn),
                                               migrated["summary"]["run_id"]))
    assert problems == []


@pytest.mark.slow
def test_verify_passes(migrated, farm_env):
    out = run_farm(farm_env, "verify", timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    doc = last_json(out.stdout)
    assert doc["mismatches"] == 0 and doc["checked"] == migrated["summary"]["loaded"]


def test_quarantine_lists_reasons(migrated, farm_env):
    out = run_farm(farm_env, "quarantine", "--json")
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(rows) == sum(migrated["summary"]["quarantined"].values())
    reasons = {(r["legacy_table"], r["reason"]) for r in rows}
    assert ("users", "null_username") in reasons and ("pins", "board_quarantined") in reasons
    assert all(r["legacy_key"] for r in rows)


@pytest.mark.slow
def test_second_full_run_changes_nothing(migrated, farm_env, server_b):
    before = checksums(server_b.port)
    out = run_farm(farm_env, "migrate", "--chunk-size", "1500", "--wait", timeout=600)
    assert out.returncode == 0, out.stderr
    again = last_json(out.stdout)
    assert again["loaded"] == migrated["summary"]["loaded"]
    assert checksums(server_b.port) == before


@pytest.mark.slow
def test_verify_reports_corruption_with_legacy_key(migrated, farm_env, settings, router):
    conn = pymysql.connect(**dsn_kwargs(settings.legacy_dsn))
    with conn.cursor() as cur:
        cur.execute("SELECT id FROM pins WHERE id < (1 << 35) ORDER BY id LIMIT 2")
        tampered = [r[0] for r in cur.fetchall()]
    conn.close()
    from sharding.shardmap import ShardMap
    shardmap = router.shardmap
    assert isinstance(shardmap, ShardMap)
    hits = 0
    for pin_legacy in tampered:
        for s in shardmap.shards():
            n = router.run(s, lambda cur, s=s, p=pin_legacy: cur.execute(
                f"UPDATE `db{s:05d}`.`pins` SET data = JSON_SET(data, '$.details', 'tampered') "
                "WHERE local_id = %s AND JSON_VALUE(data, '$.legacy_id') = %s", (p, p)))
            hits += n
    assert hits == 2
    try:
        out = run_farm(farm_env, "verify", "--show", "1", timeout=600)
        assert out.returncode == 1
        shown = [p for p in tampered
                 if f"mismatch pins {p} pins: data differs: details" in out.stdout]
        assert len(shown) == 1, out.stdout  # one shown, then where to find the rest
        vid = json.loads(out.stdout.strip().splitlines()[-1])["run_id"]
        assert f"and 1 more mismatch(es): 'farm mismatches --run {vid}'" in out.stdout
        listed = run_farm(farm_env, "mismatches", "--run", vid)
        assert listed.returncode == 0, listed.stderr
        assert all(f"mismatch pins {p} pins: data differs: details" in listed.stdout
                   for p in tampered)
        again = run_farm(farm_env, "resume", vid, "--wait")  # a finished verify, followed
        assert again.returncode == 1, again.stderr  # its mismatches still fail it
        doc = json.loads(again.stdout.strip().splitlines()[-1])
        assert doc["status"] == "done" and doc["mismatches"] == 2 and "loaded" not in doc
    finally:
        run_farm(farm_env, "migrate", "--wait", timeout=600)  # repair by re-running
    assert run_farm(farm_env, "verify", timeout=600).returncode == 0


@pytest.mark.slow
@pytest.mark.parametrize("sliced", [False, True], ids=["half-way", "between-slices"])
def test_chunk_killed_then_rerun_matches_a_clean_run(migrated, settings, server_b, router,
                                                     monkeypatch, sliced):
    """A pins chunk killed half way through its first shard write, or (in slices) once its
    first slice's shard rows are written and before any of its mod-bucket rows (written
    once, at the end of the chunk, with its mapping rows): its second attempt leaves what a
    clean run does."""
    rt = Runtime(settings.with_(redis_url=settings.redis_url))
    try:
        params, chunks, pin_chunk = _plan(settings, rt, 900, 300) if sliced else \
            _plan(settings, rt, 700)
        # The reference: the same chunks, in the same order, never killed. (Local IDs of
        # legacy IDs >= 2**35 come from AUTO_INCREMENT in allocation order, so a run that
        # allocates in another order, e.g. with parallel workers, may number them otherwise.)
        _fresh_run(rt, params, chunks, server_b.port)
        clean = checksums(server_b.port)
        truncate_target(server_b.port)
        run_id = rt.ledger.create_run("migrate", "none", params, chunks)
        written: list = []
        killed(rt, run_id, pin_chunk, partial(die_at_second_slice, written) if sliced
                else _die_half_way, monkeypatch)
        if sliced:
            _assert_only_objects_written(router, written[0])
        run_inline(rt, run_id, range(len(chunks)))
        assert rt.ledger.chunk(run_id, pin_chunk)["attempts"] == 2
        assert rt.ledger.refresh_status(run_id) == "done"
        assert checksums(server_b.port) == clean
    finally:
        rt.close()


def _die_half_way(real):
    """A ``write_shards`` killed half way through the first table it writes."""
    def write(router, token, rows, **kw):
        first = next(iter(rows.objects))
        half = type(rows)()
        half.objects[first] = rows.objects[first][: len(rows.objects[first]) // 2]
        real(router, token, half, **kw)
        raise KeyboardInterrupt("worker killed")
    return write


def _assert_only_objects_written(router, rows) -> None:
    """The objects of a chunk's first slice (``rows``) are written; none of the chunk's
    mapping rows and ``legacy_id_map`` rows is (they wait for its end; a legacy ID of
    2**35 or more is recorded when it is allocated)."""
    (shard, name), objects = next(iter(rows.objects.items()))
    assert _count(router.run, shard, f"`db{shard:05d}`.`{name}`", "local_id",
                  [r[0] for r in objects]) == len(objects)
    assert not rows.mappings and not rows.lookups
    for s in router.shardmap.shards():
        assert _rows(router.run, s, f"`db{s:05d}`.`board_has_pins`") == 0
    for b in range(router.shardmap.buckets):
        assert _rows(router.run_mod, b, f"`mod{b:05d}`.`legacy_id_map`",
                     "legacy_id < (1 << 35)") == 0


@pytest.mark.slow
def test_a_moved_pin_loses_its_old_board_row_though_its_chunk_is_killed_after_its_slice(
        migrated, settings, server_b, router, monkeypatch):
    """A pin moved (in the legacy data) to another board of the same owner, and the chunk
    re-loading it is killed after the pin's slice: the old board row went with that slice
    (a removal left for the chunk's end would die with the process, and the re-run, finding
    the new document in place, would never know the old board), and stays gone."""
    rt = Runtime(settings.with_(redis_url=settings.redis_url))
    legacy = pymysql.connect(**dsn_kwargs(settings.legacy_dsn), autocommit=True)
    moved = None
    try:
        params, chunks, pin_chunk = _plan(settings, rt, 900, 300)
        _fresh_run(rt, params, chunks, server_b.port)
        pin, old, new = moved = _movable_pin(router, legacy, chunks[pin_chunk].args["slices"][0])
        assert _boards_of_pin(router, pin) == {old}
        with legacy.cursor() as cur:
            cur.execute("UPDATE pins SET board_id = %s WHERE id = %s", (new, pin))
        run_id = rt.ledger.create_run("migrate", "none", params, chunks)
        killed(rt, run_id, pin_chunk, partial(die_at_second_slice, []), monkeypatch)
        assert _boards_of_pin(router, pin) == set()  # gone with its slice (the new row
        #                                              waits for the chunk's end)
        run_inline(rt, run_id, range(len(chunks)))
        assert rt.ledger.refresh_status(run_id) == "done"
        assert _boards_of_pin(router, pin) == {new}
    finally:
        if moved:
            with legacy.cursor() as cur:
                cur.execute("UPDATE pins SET board_id = %s WHERE id = %s", (moved[1], moved[0]))
            truncate_target(server_b.port)
        legacy.close()
        rt.close()


def _plan(settings, rt, chunk_rows: int, slice_rows: int | None = None) -> tuple:
    """A migration's params and chunks, and the index of a pins chunk (of two slices or more
    when ``slice_rows`` is given)."""
    params, chunks = migration.plan(settings, rt.router, rt.ledger, chunk_rows,
                                    slice_rows or chunk_rows)
    params["handler"] = migration.HANDLER
    pin_chunk = next(i for i, c in enumerate(chunks) if c.kind == "pins" and (
        slice_rows is None or len(c.args.get("slices", [])) >= 2))
    return params, chunks, pin_chunk


def _fresh_run(rt, params: dict, chunks: list, port_b: int) -> None:
    """Every chunk of a new run, in order, on an empty target."""
    truncate_target(port_b)
    run_inline(rt, rt.ledger.create_run("migrate", "none", params, chunks), range(len(chunks)))


def _movable_pin(router, legacy, first_slice: list[int]) -> tuple[int, int, int]:
    """A migrated pin of ``first_slice`` (legacy IDs below 2**35), its board, and another
    migrated board of the same owner: ``(pin, board, other board)``."""
    with legacy.cursor() as cur:
        cur.execute("SELECT p.id, p.board_id, b2.id FROM pins p "
                    "JOIN boards b1 ON b1.id = p.board_id "
                    "JOIN boards b2 ON b2.user_id = b1.user_id AND b2.id <> b1.id "
                    "WHERE p.id BETWEEN %s AND %s AND p.id < (1 << 35) AND b2.id < (1 << 35) "
                    "ORDER BY p.id, b2.id", first_slice)
        candidates = cur.fetchall()
    for pin, board, other in candidates:
        if _boards_of_pin(router, pin) == {board} and _count_active_boards(router, other):
            return pin, board, other
    raise AssertionError("no pin of the first slice can move to another migrated board")


def _boards_of_pin(router, pin: int) -> set[int]:
    """Legacy IDs (local IDs) of the boards whose ``board_has_pins`` rows name the pin."""
    out: set[int] = set()
    for s in router.shardmap.shards():
        q = f"`db{s:05d}`.`board_has_pins`"
        rows = router.run(s, lambda cur, q=q: (cur.execute(
            f"SELECT from_id FROM {q} WHERE (to_id & %s) = %s", (MAX_LOCAL, pin)),
            cur.fetchall())[1])
        out |= {int(r[0]) & MAX_LOCAL for r in rows}
    return out


def _count_active_boards(router, board: int) -> int:
    """Active board slots at local ID ``board`` on any shard."""
    return sum(router.run(s, lambda cur, s=s: (cur.execute(
        f"SELECT COUNT(*) FROM `db{s:05d}`.`boards` WHERE local_id = %s AND active = 1",
        (board,)), cur.fetchone())[1])[0] for s in router.shardmap.shards())


def _rows(run, where: int, table: str, cond: str = "TRUE") -> int:
    """Rows of ``table`` (on shard or bucket ``where``) meeting ``cond``."""
    return run(where, lambda cur: (cur.execute(f"SELECT COUNT(*) FROM {table} WHERE {cond}"),
                                   cur.fetchone())[1])[0]


def _count(run, where: int, table: str, col: str, keys: list) -> int:
    """Rows of ``table`` whose ``col`` is one of ``keys`` (on shard or bucket ``where``)."""
    marks = ",".join(["%s"] * len(keys))
    return run(where, lambda cur: (cur.execute(
        f"SELECT COUNT(*) FROM {table} WHERE {col} IN ({marks})", keys), cur.fetchone())[1])[0]


def test_sweep_temp_deletes_only_old_load_files(tmp_path, monkeypatch):
    """A worker SIGKILLed during LOAD DATA leaves its temp file; the next supervisor on the
    machine deletes such files once they are old, and nothing else."""
    import os
    import time

    from shardfarm.mysql import infile
    monkeypatch.setattr(infile, "TMP", str(tmp_path))
    old, fresh, other = (tmp_path / n for n in ("farm-a.tsv", "farm-b.tsv", "mine-c.tsv"))
    for p in (old, fresh, other):
        p.write_text("1\t2\t3\n")
    past = time.time() - 7200
    os.utime(old, (past, past))
    os.utime(other, (past, past))
    assert infile.sweep_temp(3600) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["farm-b.tsv", "mine-c.tsv"]


def test_sweep_temp_deletes_the_fresh_file_of_a_killed_writer(tmp_path, monkeypatch):
    """A file named after a process that ended goes at once; a running one's stays."""
    import signal
    import subprocess

    from shardfarm.mysql import infile
    monkeypatch.setattr(infile, "TMP", str(tmp_path))
    with infile.temp_tsv("1\t2\t3\n") as mine:
        assert os.path.basename(mine).startswith(f"farm-{os.getpid()}-")
        child = subprocess.Popen(["sleep", "60"])
        dead = tmp_path / f"farm-{child.pid}-x.tsv"
        dead.write_text("1\t2\t3\n")
        assert infile.sweep_temp(3600) == 0  # both writers run
        child.send_signal(signal.SIGKILL)
        child.wait()
        assert infile.sweep_temp(3600) == 1
        assert sorted(p.name for p in tmp_path.iterdir()) == [os.path.basename(mine)]


def test_slices_group_into_chunks_of_at_most_chunk_rows():
    """The planner's slices: consecutive, every key in one, a chunk's covering its range."""
    from loaders.migration.migrate import chunk_args, covering, selections, sliced
    ranges = covering([(5, 9, 3), (12, 20, 3), (21, 30, 3), (31, 40, 8), (41, 50, 2)])
    parts = sliced(ranges, 6)
    assert [[n for _, _, n in p] for p in parts] == [[3, 3], [3], [8], [2]]
    args = [chunk_args("pins", p) for p in parts]
    assert args[0] == {"table": "pins", "lo": 0, "hi": 20, "slices": [[0, 11], [12, 20]]}
    assert args[1] == {"table": "pins", "lo": 21, "hi": 30}  # one slice: no "slices"
    assert args[-1]["hi"] == (1 << 64) - 1
    # every key in exactly one slice, in order, and the slices of a chunk cover its range
    flat = [s for a in args for s in (a.get("slices") or [[a["lo"], a["hi"]]])]
    assert all(b[0] == a[1] + 1 for a, b in itertools.pairwise(flat))
    assert [(s.lo, s.hi) for s in selections(**{k: v for k, v in args[0].items()
                                                 if k != "table"})] == [(0, 11), (12, 20)]
    assert [(s.lo, s.hi) for s in selections(21, 30, None)] == [(21, 30)]
