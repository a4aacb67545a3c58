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
from tests.test_slots import _kw, legacy, migrate, new_id, verify

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
