"""Bad legacy rows meet the migration: each is quarantined with a reason that says what to
fix, never dropped, never fatal to its chunk, and a re-run after the fix loads it.

Each test builds a tiny legacy database by hand and runs the migration's chunks in this
process (the real handler, real MariaDB on both servers).
"""

from __future__ import annotations

import pytest

from loaders.migration.legacy_schema import create_legacy_schema
from sharding.schema import LOOKUP_KEY_CHARS
from tests.migratekit import truncate_target
from tests.test_slots import legacy, migrate, new_id, verify

T0 = "2014-01-02 03:04:05"


@pytest.fixture
def rt(settings, router, ledger, server_b):
    """An empty target, an empty legacy database and a runtime."""
    from jobs.runtime import Runtime
    truncate_target(server_b.port)
    create_legacy_schema(settings.legacy_dsn, drop=True)
    runtime = Runtime(settings)
    yield runtime
    runtime.close()


def quarantined(rt, run_id: str) -> dict[tuple[str, str], tuple[str, str]]:
    """``(table, legacy key) -> (reason, detail)`` of a run's quarantine."""
    return {(r["legacy_table"], r["legacy_key"]): (r["reason"], r["detail"])
            for r in rt.ledger.quarantine.rows(run_id)}


def _board_verdict_alone(settings, board: int):
    """The verdict on a board judged by a process that never read its owner's chunk (the
    owner fetched as a parent only, by its judged columns)."""
    from loaders.migration.legacy import LegacyReader
    from loaders.migration.migrate import judge_chunk
    from loaders.migration.present import Selection
    reader = LegacyReader(settings.legacy_dsn)
    try:
        params = {"open_shards": [0]}
        _, judged = judge_chunk(reader, params, "boards", 0, -1, sel=Selection(board, board))
    finally:
        reader.close()
    return judged[0][1]


@pytest.mark.slow
def test_an_email_too_long_once_lower_cased_is_quarantined_not_fatal(rt, settings, router):
    """"İ".lower() is two characters: a 255-character legacy email holding one no longer
    fits ``email_to_user``. That failed the whole users chunk for good (error 1406, every
    user of the chunk without its lookups); now that user is quarantined saying what to
    fix (sizes, not the address), its board with it, the rest of the chunk lands, and a
    re-run after the fix loads both."""
    email = "\u0130" * 5 + "x" * 240 + "@ex.com"  # 252 characters, 257 lower-cased
    assert len(email) <= 255 < len(email.lower())
    legacy(settings, "INSERT INTO users VALUES (1, 'alice', 'a@x.com', 'Alice', %s)", T0)
    legacy(settings, "INSERT INTO users VALUES (2, 'turk', %s, 'T', %s)", email, T0)
    legacy(settings, "INSERT INTO boards VALUES (5, 2, 'b', NULL, %s)", T0)
    first = migrate(rt, settings)
    bad = quarantined(rt, first)
    assert set(bad) == {("users", "2"), ("boards", "5")}
    reason, detail = bad[("users", "2")]
    assert reason == "email_too_long"
    assert f"{len(email.lower())} characters" in detail and str(LOOKUP_KEY_CHARS) in detail
    assert "x" * 20 not in detail
    assert bad[("boards", "5")] == ("owner_quarantined", "user_id=2 (email_too_long)")
    assert _board_verdict_alone(settings, 5).reason == "owner_quarantined"
    assert new_id(router, "user", 1) is not None and new_id(router, "user", 2) is None
    assert verify(rt, settings, first) == []
    legacy(settings, "UPDATE users SET email = 'turk@ex.com' WHERE id = 2")
    second = migrate(rt, settings)
    assert quarantined(rt, second) == {}
    assert new_id(router, "user", 2) is not None and new_id(router, "board", 5) is not None
    assert verify(rt, settings, second) == []


def _run_chunks(rt, settings, order: list[str], between=None) -> str:
    """A new migration run whose chunks (one per table) run here in ``order`` of kinds,
    ``between()`` called after the first; returns the run ID."""
    from jobs import lifecycle
    from loaders.migration import migrate as migration
    params, chunks = migration.plan(settings, rt.router, rt.ledger, 50_000)
    run_id = rt.ledger.create_run("migrate", "none", {**params, "handler": migration.HANDLER},
                                  chunks)
    index = {c.kind: i for i, c in enumerate(chunks)}
    for n, kind in enumerate(order):
        assert lifecycle.execute(rt, run_id, index[kind]) == "done"
        if n == 0 and between is not None:
            between()
    return run_id


@pytest.mark.slow
@pytest.mark.parametrize("broken_first", [False, True], ids=["broken-since", "fixed-since"])
def test_a_chunk_judges_its_own_rows_as_it_reads_them(rt, settings, router, broken_first):
    """A worker's boards chunk judged user 1 as a parent; the user's row then changed before
    the same worker ran the users chunk. That chunk judged the row it read by the verdict
    remembered from before: a user whose username is NULL now was loaded (a document
    without a username), or one fixed since was quarantined as ``null_username`` though
    the row in hand has one. Now a chunk's own rows are judged as read."""
    name = None if broken_first else "alice"
    legacy(settings, "INSERT INTO users VALUES (1, %s, 'a@x.com', 'Alice', %s)", name, T0)
    legacy(settings, "INSERT INTO boards VALUES (5, 1, 'b', NULL, %s)", T0)
    run_id = _run_chunks(rt, settings, ["boards", "users"], lambda: legacy(
        settings, "UPDATE users SET username = %s WHERE id = 1",
        "alice" if broken_first else None))
    bad = quarantined(rt, run_id)
    if broken_first:  # fixed since: the user loads (its board waits for a re-run)
        assert ("users", "1") not in bad and new_id(router, "user", 1) is not None
    else:
        assert bad[("users", "1")] == ("null_username", "")
        assert new_id(router, "user", 1) is None


def _expire(settings, run_id: str, chunk: int) -> None:
    """End a dead attempt's lease now (what its expiry does, without waiting for it)."""
    legacy_ctl = settings.control_dsn
    import pymysql
    conn = pymysql.connect(host=legacy_ctl.host, port=legacy_ctl.port, user=legacy_ctl.user,
                           password=legacy_ctl.password, database=legacy_ctl.database,
                           autocommit=True)
    with conn.cursor() as cur:
        cur.execute("UPDATE chunks SET lease_expires = NOW(3) - INTERVAL 1 SECOND "
                    "WHERE run_id = %s AND chunk_id = %s", (run_id, chunk))
    conn.close()


@pytest.mark.slow
def test_a_retried_chunk_takes_rows_it_loads_now_out_of_the_quarantine(rt, settings, router,
                                                                      monkeypatch):
    """A boards chunk quarantined board 5 (``missing_owner``) and died before the ledger
    marked it done; its user was added before the retry, which loaded the board. The
    quarantine still listed it (a retry only added and updated rows): ``farm quarantine``
    named a row that is in the target, beside a summary that did not count it. Now a
    chunk's record replaces the rows its earlier attempts recorded."""
    from farmcore.quarantine import Quarantine
    from jobs import lifecycle
    from loaders.migration import migrate as migration
    legacy(settings, "INSERT INTO users VALUES (1, 'alice', 'a@x.com', 'Alice', %s)", T0)
    legacy(settings, "INSERT INTO boards VALUES (4, 1, 'kept', NULL, %s)", T0)
    legacy(settings, "INSERT INTO boards VALUES (5, 9, 'orphan', NULL, %s)", T0)
    legacy(settings, "INSERT INTO boards VALUES (6, 1, 'zero', NULL, '0000-00-00')")
    params, chunks = migration.plan(settings, rt.router, rt.ledger, 50_000)
    run_id = rt.ledger.create_run("migrate", "none", {**params, "handler": migration.HANDLER},
                                  chunks)
    boards = next(i for i, c in enumerate(chunks) if c.kind == "boards")
    real = Quarantine.record

    def record_then_die(self, lease, rows) -> None:
        real(self, lease, rows)
        raise KeyboardInterrupt  # like SIGKILL: the attempt records nothing more
    monkeypatch.setattr(Quarantine, "record", record_then_die)
    with pytest.raises(KeyboardInterrupt):
        lifecycle.execute(rt, run_id, boards)
    monkeypatch.setattr(Quarantine, "record", real)
    migration._states.clear()  # the killed worker's memory dies with it
    assert set(quarantined(rt, run_id)) == {("boards", "5"), ("boards", "6")}
    legacy(settings, "INSERT INTO users VALUES (9, 'bob', 'b@x.com', 'Bob', %s)", T0)
    _expire(settings, run_id, boards)
    assert lifecycle.execute(rt, run_id, boards) == "done"
    assert rt.ledger.chunk(run_id, boards)["attempts"] == 2
    assert quarantined(rt, run_id) == {("boards", "6"): ("zero_created_at",
                                                         "0000-00-00 00:00:00")}
    assert rt.ledger.chunk(run_id, boards)["rows_quarantined"] == 1
    assert new_id(router, "board", 5) is not None


@pytest.mark.slow
def test_verify_reports_two_users_whose_usernames_lower_case_alike(rt, settings, router):
    """'kelvin' and '\u212aelvin' (a Kelvin sign) are two usernames to the legacy
    database's unique key but one lookup key once lower-cased: one user of the two is
    migrated unreachable by name, and verify passed. Now verify names that user, and
    renaming it in the legacy database and re-running makes verify pass."""
    legacy(settings, "INSERT INTO users VALUES (4, 'kelvin', 'k@x.com', 'K', %s)", T0)
    legacy(settings, "INSERT INTO users VALUES (5, '\u212aelvin', 'k2@x.com', 'K2', %s)", T0)
    first = migrate(rt, settings)
    named = {4: new_id(router, "user", 4), 5: new_id(router, "user", 5)}
    loser = max(named, key=named.get)  # the lookup keeps the smaller new ID
    problems = verify(rt, settings, first)
    assert [(p["legacy_key"], p["target"]) for p in problems] == [
        (str(loser), "username_to_user")]
    assert "rename one" in problems[0]["problem"]
    legacy(settings, "UPDATE users SET username = 'kelvin2' WHERE id = %s", loser)
    assert verify(rt, settings, migrate(rt, settings)) == []
