"""Destructive commands (scripts.confirm) on 'farm legacy generate --replace': --dry-run
says exactly what would go and leaves it; a terminal is asked and 'n' removes nothing;
--yes and scripts (no terminal) go ahead. Rows are counted by SQL of the test's own."""

import json

import pymysql
import pytest

from tests.conftest import ns_db, run_farm
from tests.ttykit import Tty, in_tty

DB = ns_db("legacy_confirm_test")
TABLES = ("users", "boards", "pins", "comments", "follows", "likes")


def _counts() -> dict[str, int]:
    conn = pymysql.connect(host="127.0.0.1", port=3306, user="root")
    try:
        with conn.cursor() as cur:
            out = {}
            for t in TABLES:
                cur.execute(f"SELECT COUNT(*) FROM `{DB}`.`{t}`")
                out[t] = cur.fetchone()[0]
            return out
    finally:
        conn.close()


@pytest.fixture
def legacy_env(farm_env):
    e = {**farm_env, "FARM_LEGACY_DSN": f"mysql://root@127.0.0.1:3306/{DB}"}
    out = run_farm(e, "legacy", "generate", "--users", "20", "--seed", "3", "--replace")
    assert out.returncode == 0, out.stderr
    yield e
    conn = pymysql.connect(host="127.0.0.1", port=3306, user="root", autocommit=True)
    with conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS `{DB}`")
    conn.close()


def test_dry_run_says_what_would_go_and_leaves_it(legacy_env):
    before = _counts()
    out = run_farm(legacy_env, "legacy", "generate", "--users", "5", "--replace", "--dry-run")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith("dry run: nothing removed")
    assert f"drop the legacy tables of database '{DB}' on 127.0.0.1:3306: " \
           f"{sum(before.values()):,} rows (users {before['users']:,}," in lines[1]
    assert json.loads(lines[-1])["would_remove"]["tables"] == before
    assert _counts() == before
    code, shown = in_tty(legacy_env, "legacy", "generate", "--users", "5", "--replace",
                         "--dry-run")
    assert code == 0 and "dry run: nothing removed" in shown and "{" not in shown
    assert _counts() == before


def test_a_terminal_is_asked_and_no_removes_nothing(legacy_env):
    before = _counts()
    tty = Tty(legacy_env, "legacy", "generate", "--users", "5", "--replace")
    tty.expect("Remove all of this? [y/N]")
    assert f"users {before['users']:,}" in tty.plain
    tty.send("n\n")
    assert tty.wait() == 1
    assert "not confirmed: nothing was removed" in tty.plain
    assert _counts() == before
    tty = Tty(legacy_env, "legacy", "generate", "--users", "5", "--seed", "4", "--replace")
    tty.expect("Remove all of this? [y/N]")
    tty.send("y\n")
    assert tty.wait() == 0 and _counts()["users"] != before["users"]


def test_yes_and_scripts_are_not_asked(legacy_env):
    code, shown = in_tty(legacy_env, "legacy", "generate", "--users", "7", "--replace", "--yes")
    assert code == 0 and "Remove all" not in shown and _counts()["users"] > 0
    out = run_farm(legacy_env, "legacy", "generate", "--users", "6", "--replace")  # no tty
    assert out.returncode == 0 and "Remove all" not in out.stderr


def test_dry_run_needs_the_flag_it_previews(legacy_env):
    out = run_farm(legacy_env, "legacy", "generate", "--users", "5", "--dry-run")
    assert out.returncode == 2 and "--dry-run goes with --replace" in out.stderr


def test_a_move_that_drops_its_source_is_asked_before_it_starts(farm_env, ledger):
    """``shards move --drop-source``: a terminal is asked before anything is copied, 'n'
    starts no run; a script without --yes is refused in one line (exit 2)."""
    def moves() -> int:
        return ledger.pool.query("SELECT COUNT(*) FROM runs WHERE kind = 'shardmove'")[0][0]
    before = moves()
    tty = Tty(farm_env, "shards", "move", "0-1", "--to", "TestB1/TestB2", "--drop-source")
    tty.expect("Move, then drop them? [y/N]")
    assert "drop the source copies of shards 0-1 after the move" in tty.plain
    tty.send("n\n")
    assert tty.wait() == 1 and "not confirmed: nothing was removed" in tty.plain
    out = run_farm(farm_env, "shards", "move", "0-1", "--to", "TestB1/TestB2", "--drop-source")
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    assert "without --yes" in out.stderr
    assert moves() == before
