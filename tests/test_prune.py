"""Pruning the ledger ('farm runs prune'): what goes, what stays, bounded batches, the CLI;
and the ledger's size per chunk row ('farm runs', 'farm status')."""

import json
from functools import partial

import pymysql
import pytest

from farmcore import prune
from farmcore.ledger import ChunkSpec
from scripts.cmd_runs import KEEP_LATEST
from shardfarm.errors import ShardFrozenError, UsageError
from sharding import fencing
from sharding.schema import mod_table, shard_table
from tests.conftest import SHARDS_A, SHARDS_B, TEST_BUCKETS, ns_db, run_farm


def sql(settings, statement, args=()):
    """Run one statement on the control database (the test's own view, not the ledger's)."""
    d = settings.control_dsn
    conn = pymysql.connect(host=d.host, port=d.port, user=d.user, password=d.password or "",
                           database=d.database, autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute(statement, args)
            return cur.fetchall()
    finally:
        conn.close()


def make_run(ledger, settings, *, days_ago, states, status=None, kind="test"):
    """A run whose chunks are in ``states`` and which ended ``days_ago`` days ago (ended runs
    get a quarantined row and a verify finding too)."""
    run_id = ledger.create_run(kind, "farm", {}, [ChunkSpec("k", {"i": i})
                                                     for i in range(len(states))])
    for i, state in enumerate(states):
        sql(settings, "UPDATE chunks SET state = %s, rows_written = 10 WHERE run_id = %s "
            "AND chunk_id = %s", (state, run_id, i))
    ledger.refresh_status(run_id)
    sql(settings, "UPDATE runs SET finished_at = NOW(3) - INTERVAL %s DAY, status = "
        "COALESCE(%s, status) WHERE run_id = %s", (days_ago, status, run_id))
    sql(settings, "INSERT INTO quarantine (run_id, legacy_table, legacy_key, reason, chunk_id) "
        "VALUES (%s, 'pins', '7', 'orphan', 0)", (run_id,))
    sql(settings, "INSERT INTO verify_mismatches (run_id, chunk_id, legacy_table, legacy_key, "
        "target, problem) VALUES (%s, 0, 'pins', '7', 'pins', 'missing')", (run_id,))
    return run_id


def rows_of(settings, run_id):
    return {t: sql(settings, f"SELECT COUNT(*) FROM {t} WHERE run_id = %s", (run_id,))[0][0]
            for t in ("runs", "chunks", "quarantine", "verify_mismatches")}


@pytest.fixture
def made(ledger, settings):
    old_done = make_run(ledger, settings, days_ago=40, states=["done"] * 5)
    old_failed = make_run(ledger, settings, days_ago=40, states=["done", "failed"])
    recent = make_run(ledger, settings, days_ago=2, states=["done"] * 3)
    # ended by its status long ago, but a chunk was given back (pending): not finished
    stale = make_run(ledger, settings, days_ago=40, states=["done", "pending"], status="done")
    yield {"old_done": old_done, "old_failed": old_failed, "recent": recent, "stale": stale}
    ledger.set_paused(stale, True)  # no later test's worker runs its pending chunk


def test_prune_removes_old_done_runs_only_and_archives_their_summary(ledger, settings, made):
    report = prune.prune(ledger.pool, 30 * 86400)
    assert rows_of(settings, made["old_done"]) == {"runs": 0, "chunks": 0, "quarantine": 0,
                                                  "verify_mismatches": 0}
    for kept in ("old_failed", "recent", "stale"):
        assert rows_of(settings, made[kept])["chunks"] > 0, kept
        assert rows_of(settings, made[kept])["runs"] == 1, kept
    assert report.runs >= 1 and report.chunks >= 5 and not report.dry_run
    archived = sql(settings, "SELECT status, total_chunks, chunks_done, chunks_failed, "
                   "rows_written FROM runs_archive WHERE run_id = %s", (made["old_done"],))
    assert archived == (("done", 5, 5, 0, 50),)
    prune.prune(ledger.pool, 30 * 86400, include_failed=True)
    assert rows_of(settings, made["old_failed"])["runs"] == 0
    assert rows_of(settings, made["stale"])["chunks"] == 2  # never an unfinished run
    assert rows_of(settings, made["recent"])["chunks"] == 3


def test_the_newest_run_of_a_kept_kind_stays_whatever_its_age(ledger, settings):
    """'farm runs prune --older-than 1s' (1w meant) pruned the migrate run 'farm sync'
    follows and 'farm quarantine' shows, with its quarantined rows: the newest run of a
    kind the CLI keeps (``KEEP_LATEST``: migrate) now stays; older ones of it go."""
    assert KEEP_LATEST == ("migrate",)
    older = make_run(ledger, settings, days_ago=50, states=["done"], kind="keepme")
    newest = make_run(ledger, settings, days_ago=40, states=["done"], kind="keepme")
    other = make_run(ledger, settings, days_ago=40, states=["done"], kind="other")
    assert prune.prune(ledger.pool, 30 * 86400, dry_run=True,
                       keep_latest=("keepme",)).runs >= 2
    prune.prune(ledger.pool, 30 * 86400, keep_latest=("keepme",))
    assert rows_of(settings, older)["runs"] == rows_of(settings, other)["runs"] == 0
    assert rows_of(settings, newest) == {"runs": 1, "chunks": 1, "quarantine": 1,
                                         "verify_mismatches": 1}
    prune.prune(ledger.pool, 30 * 86400)  # not kept: it goes
    assert rows_of(settings, newest)["runs"] == 0


def test_the_run_sync_follows_stays_whatever_its_age(ledger, settings):
    """A newer migrate run started (not followed yet): the one 'farm sync' follows, named by
    its checkpoint, must stay too, with its quarantined rows."""
    followed = make_run(ledger, settings, days_ago=40, states=["done"], kind="keepme")
    saved = sql(settings, "SELECT run_id FROM sync_state WHERE name = 'sync'")
    sql(settings, "INSERT INTO sync_state (name, run_id) VALUES ('sync', %s) ON DUPLICATE KEY "
        "UPDATE run_id = VALUES(run_id)", (followed,))
    try:
        prune.prune(ledger.pool, 30 * 86400)
        assert rows_of(settings, followed)["quarantine"] == 1
    finally:
        if saved:
            sql(settings, "UPDATE sync_state SET run_id = %s WHERE name = 'sync'", saved[0])
        else:
            sql(settings, "DELETE FROM sync_state WHERE name = 'sync'")
    prune.prune(ledger.pool, 30 * 86400)  # followed no more: it goes
    assert rows_of(settings, followed)["runs"] == 0


def test_a_cancelled_run_is_pruned_like_a_done_one_a_failed_one_is_not(ledger, settings):
    """A run 'farm cancel' ended was ended on purpose: pruned without --include-failed (before,
    as a ``failed`` run, only with it), and archived as ``cancelled``."""
    cancelled = make_run(ledger, settings, days_ago=40, states=["done", "pending"])
    young = make_run(ledger, settings, days_ago=2, states=["done", "pending"])
    failed = make_run(ledger, settings, days_ago=40, states=["done", "failed"])
    assert ledger.cancel(cancelled) == 1 and ledger.cancel(young) == 1
    assert prune.prune(ledger.pool, 30 * 86400, dry_run=True).runs >= 1
    assert rows_of(settings, cancelled)["chunks"] == 2  # a dry run counts, keeps
    prune.prune(ledger.pool, 30 * 86400)
    assert rows_of(settings, cancelled) == {"runs": 0, "chunks": 0, "quarantine": 0,
                                            "verify_mismatches": 0}
    assert sql(settings, "SELECT status, chunks_done, chunks_failed FROM runs_archive WHERE "
               "run_id = %s", (cancelled,)) == (("cancelled", 1, 1),)
    assert rows_of(settings, young)["chunks"] == 2  # ended 2 days ago: not yet
    assert rows_of(settings, failed)["chunks"] == 2  # only with --include-failed
    prune.prune(ledger.pool, 30 * 86400, include_failed=True)
    assert rows_of(settings, failed)["runs"] == 0


def test_a_cancelled_run_is_kept_while_a_chunk_of_it_is_still_leased(ledger, settings):
    """Cancel leaves a running chunk's lease in place (its worker is fenced out at its next
    renewal and may record quarantined rows until then): prune waits for the lease to end."""
    run_id = make_run(ledger, settings, days_ago=40, states=["done", "pending"])
    sql(settings, "UPDATE chunks SET state = 'running', lease_expires = NOW(3) + INTERVAL 1 HOUR "
        "WHERE run_id = %s AND chunk_id = 1", (run_id,))
    assert ledger.cancel(run_id) == 1
    sql(settings, "UPDATE runs SET finished_at = NOW(3) - INTERVAL 40 DAY WHERE run_id = %s",
        (run_id,))
    prune.prune(ledger.pool, 30 * 86400)
    assert rows_of(settings, run_id)["chunks"] == 2
    sql(settings, "UPDATE chunks SET lease_expires = NOW(3) - INTERVAL 1 SECOND WHERE run_id = %s",
        (run_id,))
    prune.prune(ledger.pool, 30 * 86400)
    assert rows_of(settings, run_id)["runs"] == 0


def test_dry_run_counts_and_removes_nothing(ledger, settings, made):
    report = prune.prune(ledger.pool, 30 * 86400, dry_run=True)
    assert report.dry_run and report.runs >= 1 and report.batches == 0
    assert rows_of(settings, made["old_done"]) == {"runs": 1, "chunks": 5, "quarantine": 1,
                                                  "verify_mismatches": 1}


def test_every_delete_is_bounded_by_the_batch(ledger, settings):
    run_id = make_run(ledger, settings, days_ago=60, states=["done"] * 23)
    seen = []

    def after(rid, table, n):
        seen.append((rid, table, n, rows_of(settings, rid)[table]))
    prune.prune(ledger.pool, 30 * 86400, batch=10, on_batch=after)
    chunk_batches = [(n, left) for rid, table, n, left in seen
                     if rid == run_id and table == "chunks"]
    assert chunk_batches == [(10, 13), (10, 3), (3, 0)]  # bounded, and committed each time
    assert rows_of(settings, run_id)["runs"] == 0


FENCED = [("db", SHARDS_A[0]), ("db", SHARDS_B[1]), ("mod", 0), ("mod", TEST_BUCKETS - 1)]


def fence_tables(router):
    """(master host, fences table) of a shard on each server and two mod buckets."""
    m = router.shardmap
    return [(m.master(n), shard_table(n, "chunk_fences")) if kind == "db" else
            (m.mod_master(n), mod_table(n, "chunk_fences")) for kind, n in FENCED]


def fences_of(router, run_id):
    """The run's fence rows in each of ``fence_tables``, read with plain SQL."""
    return [router.query(host, f"SELECT COUNT(*) FROM {q} WHERE run_id = %s", (run_id,))[0][0]
            for host, q in fence_tables(router)]


@pytest.fixture
def fenced(router, made):
    """Two fence rows (chunks 0 and 1) of every made run in each of ``fence_tables``; any
    left are deleted afterwards."""
    tables = fence_tables(router)

    def each(statement, args):
        for host, q in tables:
            router.run_on(host, lambda cur, q=q: cur.execute(statement.format(q=q), args))
    for run_id in made.values():
        each("INSERT INTO {q} (run_id, chunk_id, fence) VALUES (%s, 0, 3), (%s, 1, 3)",
             (run_id, run_id))
    yield made
    each(f"DELETE FROM {{q}} WHERE run_id IN ({','.join(['%s'] * len(made))})",
         tuple(made.values()))


def test_prune_deletes_the_fence_rows_of_the_runs_it_prunes_only(ledger, settings, router,
                                                                  fenced):
    forget = partial(fencing.forget, router)
    counted = prune.prune(ledger.pool, 30 * 86400, dry_run=True, fences=forget)
    assert counted.fences >= 2 * len(FENCED) and fences_of(router, fenced["old_done"]) == [2] * 4
    report = prune.prune(ledger.pool, 30 * 86400, fences=forget)
    assert report.fences == counted.fences and report.runs == counted.runs
    assert fences_of(router, fenced["old_done"]) == [0] * 4
    for kept in ("recent", "stale", "old_failed"):  # a run kept keeps its fences
        assert fences_of(router, fenced[kept]) == [2] * 4, kept
    assert rows_of(settings, fenced["old_done"])["runs"] == 0
    assert fences_left(settings, fenced["old_done"]) == 0


def fences_left(settings, run_id):
    """Whether the archive says the pruned run's fences are still on the shards."""
    return sql(settings, "SELECT fences_left FROM runs_archive WHERE run_id = %s",
               (run_id,))[0][0]


def test_every_run_and_every_group_is_reached_in_small_batches(ledger, router, fenced,
                                                              monkeypatch):
    monkeypatch.setattr(fencing, "RUNS_PER_STATEMENT", 1)
    monkeypatch.setattr(fencing, "GROUP", 3)
    monkeypatch.setattr(prune, "FENCE_BATCH", 1)
    report = prune.prune(ledger.pool, 30 * 86400, include_failed=True,
                         fences=partial(fencing.forget, router))
    assert report.runs >= 2 and report.fences >= 2 * 2 * len(FENCED)
    for gone in ("old_done", "old_failed"):
        assert fences_of(router, fenced[gone]) == [0] * 4, gone


def test_a_run_given_back_while_others_are_pruned_keeps_its_rows_and_fences(
        ledger, settings, router, fenced):
    sql(settings, "UPDATE runs SET finished_at = NOW(3) - INTERVAL 39 DAY WHERE run_id = %s",
        (fenced["old_failed"],))  # pruned after old_done, which ended a day before it

    def retry_lands(run_id, table, n):  # 'farm retry-failed' lands while old_done goes
        if run_id == fenced["old_done"]:
            sql(settings, "UPDATE chunks SET state = 'pending' WHERE run_id = %s AND "
                "chunk_id = 1", (fenced["old_failed"],))
    prune.prune(ledger.pool, 30 * 86400, include_failed=True, on_batch=retry_lands,
                fences=partial(fencing.forget, router))
    assert rows_of(settings, fenced["old_done"])["runs"] == 0
    assert rows_of(settings, fenced["old_failed"]) == {"runs": 1, "chunks": 2, "quarantine": 1,
                                                      "verify_mismatches": 1}
    assert fences_of(router, fenced["old_failed"]) == [2] * 4
    ledger.set_paused(fenced["old_failed"], True)  # no later test's worker runs it


def test_a_run_pruned_young_keeps_its_fences_until_a_day_after_it_ended(ledger, settings,
                                                                         router, fenced):
    young = fenced["recent"]
    sql(settings, "UPDATE runs SET finished_at = NOW(3) - INTERVAL 12 HOUR WHERE run_id = %s",
        (young,))
    prune.prune(ledger.pool, 3600, fences=partial(fencing.forget, router))
    assert rows_of(settings, young)["runs"] == 0  # the ledger goes at the age asked
    assert fences_of(router, young) == [2] * 4 and fences_left(settings, young) == 1
    sql(settings, "UPDATE runs_archive SET finished_at = NOW(3) - INTERVAL 25 HOUR "
        "WHERE run_id = %s", (young,))  # a day has passed
    report = prune.prune(ledger.pool, 30 * 86400, fences=partial(fencing.forget, router))
    assert fences_of(router, young) == [0] * 4 and fences_left(settings, young) == 0
    assert report.fences >= 2 * len(FENCED)


def test_a_run_the_ledger_still_holds_keeps_its_fences_though_archived(ledger, settings,
                                                                       router, fenced):
    run = fenced["stale"]  # archived by a prune that died, then given back: a chunk pending
    sql(settings, "INSERT INTO runs_archive (run_id, kind, status, total_chunks, chunks_done, "
        "chunks_failed, rows_written, created_at, finished_at) SELECT run_id, kind, status, "
        "total_chunks, 1, 0, 10, created_at, finished_at FROM runs WHERE run_id = %s", (run,))
    prune.prune(ledger.pool, 30 * 86400, fences=partial(fencing.forget, router))
    assert fences_of(router, run) == [2] * 4 and fences_left(settings, run) == 1


def test_a_retry_of_a_run_being_pruned_is_refused(ledger, settings, router, fenced,
                                                 monkeypatch):
    tried = []
    delete = prune._delete_run

    def retry_then_delete(pool, run_id, *rest):  # 'farm retry-failed' once it is marked
        if run_id == fenced["old_failed"]:
            tried.append(ledger.reset_failed(run_id))
        delete(pool, run_id, *rest)
    monkeypatch.setattr(prune, "_delete_run", retry_then_delete)
    prune.prune(ledger.pool, 30 * 86400, include_failed=True,
                fences=partial(fencing.forget, router))
    assert tried == [0]  # refused: nothing of it can be claimed and written any more
    assert rows_of(settings, fenced["old_failed"])["runs"] == 0
    assert fences_of(router, fenced["old_failed"]) == [0] * 4


def test_a_retry_just_before_the_mark_keeps_the_run(ledger, settings, router, fenced,
                                                   monkeypatch):
    archive = prune._archive

    def archive_then_retry(pool, run_id, cond, args):  # lands between archive and mark
        archive(pool, run_id, cond, args)
        if run_id == fenced["old_failed"]:
            ledger.reset_failed(run_id)
    monkeypatch.setattr(prune, "_archive", archive_then_retry)
    prune.prune(ledger.pool, 30 * 86400, include_failed=True,
                fences=partial(fencing.forget, router))
    assert rows_of(settings, fenced["old_failed"])["chunks"] == 2
    assert fences_of(router, fenced["old_failed"]) == [2] * 4  # the ledger holds it
    ledger.set_paused(fenced["old_failed"], True)  # no later test's worker runs it


def test_a_run_that_ended_again_is_archived_anew_and_keeps_its_fences_a_day(
        ledger, settings, router, fenced):
    run = fenced["old_failed"]  # archived by a prune that died, given back, ended 2h ago
    sql(settings, "INSERT INTO runs_archive (run_id, kind, status, total_chunks, chunks_done, "
        "chunks_failed, rows_written, created_at, finished_at) SELECT run_id, kind, status, "
        "total_chunks, 1, 1, 10, created_at, finished_at FROM runs WHERE run_id = %s", (run,))
    sql(settings, "UPDATE runs SET finished_at = NOW(3) - INTERVAL 2 HOUR WHERE run_id = %s",
        (run,))
    prune.prune(ledger.pool, 3600, include_failed=True, fences=partial(fencing.forget, router))
    assert rows_of(settings, run)["runs"] == 0
    assert fences_of(router, run) == [2] * 4 and fences_left(settings, run) == 1
    ended = sql(settings, "SELECT finished_at > NOW(3) - INTERVAL 3 HOUR FROM runs_archive "
                "WHERE run_id = %s", (run,))
    assert ended == ((1,),)


def test_a_run_left_half_pruned_stays_so_and_the_next_prune_finishes_it(
        ledger, settings, router, fenced):
    run = fenced["old_done"]  # archived and marked by a prune that died before its rows went
    sql(settings, "INSERT INTO runs_archive (run_id, kind, status, total_chunks, chunks_done, "
        "chunks_failed, rows_written, created_at, finished_at) SELECT run_id, kind, status, "
        "total_chunks, 5, 0, 50, created_at, finished_at FROM runs WHERE run_id = %s", (run,))
    sql(settings, "UPDATE runs SET status = 'pruning' WHERE run_id = %s", (run,))
    ledger.refresh_status(run)  # 'farm status' or a waiter meanwhile: the mark stays
    assert sql(settings, "SELECT status FROM runs WHERE run_id = %s", (run,)) == (("pruning",),)
    assert ledger.reset_failed(run) == 0
    prune.prune(ledger.pool, 30 * 86400, fences=partial(fencing.forget, router))
    assert rows_of(settings, run) == {"runs": 0, "chunks": 0, "quarantine": 0,
                                      "verify_mismatches": 0}
    assert fences_of(router, run) == [0] * 4 and fences_left(settings, run) == 0


def test_a_shard_frozen_for_a_move_fails_the_prune_and_the_next_one_finishes(
        ledger, settings, router, fenced):
    shard = SHARDS_B[0]
    q = shard_table(shard, "shard_state")
    host = router.shardmap.master(shard)
    before = router.query(host, f"SELECT map_version, frozen FROM {q} WHERE id = 1")
    router.run_on(host, lambda cur: cur.execute(
        f"INSERT INTO {q} (id, map_version, frozen) VALUES (1, 0, 1) "
        "ON DUPLICATE KEY UPDATE frozen = 1"))
    try:
        with pytest.raises(ShardFrozenError, match=f"fence rows of .*shard {shard} is frozen.*"
                           "the next prune deletes their fences"):
            prune.prune(ledger.pool, 30 * 86400, fences=partial(fencing.forget, router))
        assert rows_of(settings, fenced["old_done"])["runs"] == 0
        assert fences_left(settings, fenced["old_done"]) == 1
    finally:
        router.run_on(host, lambda cur: cur.execute(
            f"DELETE FROM {q} WHERE id = 1") if not before else cur.execute(
            f"UPDATE {q} SET map_version = %s, frozen = %s WHERE id = 1", before[0]))
    prune.prune(ledger.pool, 30 * 86400, fences=partial(fencing.forget, router))
    assert fences_of(router, fenced["old_done"]) == [0] * 4
    assert fences_left(settings, fenced["old_done"]) == 0


@pytest.mark.parametrize("bad", ["30", "0d", "abc", "-3d", "30 days", ""])
def test_a_bad_age_is_a_usage_error(bad):
    with pytest.raises(UsageError, match="--older-than"):
        prune.parse_age(bad)


def test_ages_in_every_unit():
    assert [prune.parse_age(a) for a in ("45s", "90m", "12h", "30d", "2w")] == [
        45, 5400, 43200, 2592000, 1209600]


@pytest.mark.slow  # five farm subprocesses
def test_the_cli_prunes_reports_sizes_and_refuses_a_bad_age(env, ledger, settings, router,
                                                             made):
    out = run_farm(env, "runs", "prune", "--older-than", "30x")
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "--older-than" in out.stderr
    assert "Traceback" not in out.stderr
    out = run_farm(env, "runs", "prune", "--older-than", "30d", "--dry-run")
    assert out.returncode == 0 and json.loads(out.stdout)["dry_run"] is True
    assert json.loads(out.stdout)["complete"] is True
    assert rows_of(settings, made["old_done"])["runs"] == 1
    host, q = fence_tables(router)[1]
    router.run_on(host, lambda cur: cur.execute(
        f"INSERT INTO {q} (run_id, chunk_id, fence) VALUES (%s, 0, 3)", (made["old_done"],)))
    out = run_farm(env, "runs", "prune", "--older-than", "30d", "--batch", "2")
    doc = json.loads(out.stdout)
    assert out.returncode == 0 and doc["runs"] >= 1 and doc["batches"] >= 3
    assert doc["fences"] >= 1 and fences_of(router, made["old_done"])[1] == 0
    assert doc["complete"] is True
    missing = {**env, "FARM_CONTROL_DSN": env["FARM_CONTROL_DSN"].rsplit("/", 1)[0] + "/"
               + ns_db("farm_control_absent")}
    out = run_farm(missing, "runs", "prune", "--older-than", "30d")  # what went: nothing
    assert out.returncode == 1 and json.loads(out.stdout)["complete"] is False, out
    assert out.stderr.startswith("farm: error: MySQL error 1049"), out.stderr
    assert rows_of(settings, made["old_done"])["runs"] == 0
    out = run_farm(env, "runs", "--limit", "3")
    assert out.returncode == 0 and "bytes per chunk row" in out.stdout.splitlines()[-1]
    doc = json.loads(run_farm(env, "status", "--json").stdout)
    assert doc["ledger"]["chunk_rows"] >= 0 and "chunks" in doc["ledger"]["tables"]


def test_the_schema_upgrade_runs_again_on_an_existing_control_database(ledger, settings):
    from farmcore import control_schema
    control_schema.ensure(settings.control_dsn)  # the session's database has them already
    control_schema.ensure(settings.control_dsn)
    cols = {r[0] for r in sql(settings, "SELECT COLUMN_NAME FROM information_schema.COLUMNS "
                              "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'runs'")}
    assert {"chunks_done", "chunks_failed", "rows_written"} <= cols
    keys = {r[2] for r in sql(settings, "SHOW INDEX FROM chunks")}
    assert "by_state_any" in keys
    archive = {r[0] for r in sql(settings, "SELECT COLUMN_NAME FROM information_schema.COLUMNS "
                                 "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = "
                                 "'runs_archive'")}
    assert "fences_left" in archive
    assert "by_fences" in {r[2] for r in sql(settings, "SHOW INDEX FROM runs_archive")}


def test_a_dry_run_counts_the_fences_the_prune_deletes_of_a_run_left_half_pruned(
        ledger, settings, router, fenced):
    """A run a prune left half pruned (archived, marked) that ended 12 hours ago keeps its
    fences until a day after it ended; the dry run counted them as going."""
    run = fenced["recent"]
    sql(settings, "UPDATE runs SET finished_at = NOW(3) - INTERVAL 12 HOUR WHERE run_id = %s",
        (run,))
    sql(settings, "INSERT INTO runs_archive (run_id, kind, status, total_chunks, chunks_done, "
        "chunks_failed, rows_written, created_at, finished_at) SELECT run_id, kind, status, "
        "total_chunks, 3, 0, 30, created_at, finished_at FROM runs WHERE run_id = %s", (run,))
    sql(settings, "UPDATE runs SET status = 'pruning' WHERE run_id = %s", (run,))
    forget = partial(fencing.forget, router)
    counted = prune.prune(ledger.pool, 30 * 86400, dry_run=True, fences=forget)
    report = prune.prune(ledger.pool, 30 * 86400, fences=forget)
    assert rows_of(settings, run)["runs"] == 0 and fences_of(router, run) == [2] * 4
    assert counted.runs == report.runs and counted.fences == report.fences
