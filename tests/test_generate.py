"""The synthetic legacy database: deterministic, skewed, unicode-safe, with bad rows."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time

import pymysql
import pytest
from click.testing import CliRunner

from demo.legacygen.generate import build, classify, generate
from loaders.migration.legacy_schema import LEGACY_TABLES, create_legacy_schema
from shardfarm.mysql.db import connect, drop_database
from shardfarm.mysql.dsn import DSN
from tests.conftest import ROOT, ns_db, run_farm

DSN_TEST = DSN.parse(f"mysql://root@127.0.0.1:3306/{ns_db('legacy_gen_test')}")
USERS, SEED = 1000, 1
ORDER = {"follows": "user_id, board_id", "likes": "user_id, pin_id"}
OK = "created_at IS NOT NULL AND CAST(created_at AS CHAR) <> '0000-00-00 00:00:00'"
KINDS = {
    "users": ["null_username"],
    "boards": ["missing_owner", "owner_quarantined"],
    "pins": ["missing_pinner", "missing_board", "pinner_quarantined", "board_quarantined"],
    "comments": ["missing_pin", "missing_user", "pin_quarantined", "user_quarantined"],
    "follows": ["missing_user", "missing_board", "user_quarantined", "board_quarantined"],
    "likes": ["missing_user", "missing_pin", "user_quarantined", "pin_quarantined"],
}
_state: dict = {}


def _query(sql: str, params: tuple = ()) -> list[tuple]:
    conn = connect(DSN_TEST)
    try:
        with conn.cursor() as cur:
            cur.execute(sql, params)
            return list(cur.fetchall())
    finally:
        conn.close()


def _digest() -> str:
    """A hash of every table's rows in primary-key order."""
    h = hashlib.sha256()
    for table in LEGACY_TABLES:
        for row in _query(f"SELECT * FROM `{table}` ORDER BY {ORDER.get(table, 'id')}"):
            h.update(repr(row).encode())
    return h.hexdigest()


def _generate(users: int, seed: int) -> dict:
    start = time.monotonic()
    report = generate(DSN_TEST, users, seed)
    _state.update(current=(users, seed), report=report, seconds=time.monotonic() - start)
    return report


@pytest.fixture(scope="module", autouse=True)
def _drop_at_end():
    yield
    drop_database(DSN_TEST)


@pytest.fixture
def seeded() -> dict:
    """The database holds the data set of (USERS, SEED); its report."""
    if _state.get("current") != (USERS, SEED):
        _generate(USERS, SEED)
    return _state["report"]


def test_schema_is_idempotent_and_drop_empties():
    create_legacy_schema(DSN_TEST, drop=True)
    _state.pop("current", None)
    _query("INSERT INTO users (id, username) VALUES (1, 'x')")
    create_legacy_schema(DSN_TEST)
    assert _query("SELECT COUNT(*) FROM users") == [(1,)]
    create_legacy_schema(DSN_TEST, drop=True)
    assert _query("SELECT COUNT(*) FROM users") == [(0,)]
    keys = _query("SELECT table_name, GROUP_CONCAT(column_name ORDER BY seq_in_index) "
                  "FROM information_schema.statistics WHERE table_schema = %s "
                  "AND index_name = 'PRIMARY' GROUP BY table_name", (DSN_TEST.database,))
    assert dict(keys) == {"users": "id", "boards": "id", "pins": "id", "comments": "id",
                          "follows": "user_id,board_id", "likes": "user_id,pin_id"}


def test_thousand_users_is_fast_and_about_forty_rows_each(seeded):
    assert _state["seconds"] < 20
    total = sum(seeded["rows"].values())
    assert 30 * USERS <= total <= 50 * USERS
    for table, n in seeded["rows"].items():
        assert _query(f"SELECT COUNT(*) FROM `{table}`") == [(n,)]


@pytest.mark.slow
def test_same_seed_same_bytes_other_seed_differs():
    _generate(300, 7)
    first = _digest()
    _generate(300, 7)
    assert _digest() == first
    _generate(300, 8)
    assert _digest() != first


def test_build_ignores_python_hash_seed():
    code = ("import hashlib; from demo.legacygen.generate import build; "
            "print(hashlib.sha256(repr(build(200, 3).tables).encode()).hexdigest())")
    out = {subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, text=True,
                          capture_output=True, env={**os.environ, "PYTHONHASHSEED": s}).stdout
           for s in ("1", "2")}
    assert len(out) == 1


def test_every_kind_of_bad_row_is_present(seeded):
    for table, kinds in KINDS.items():
        for kind in [*kinds, "null_created_at", "zero_created_at"]:
            assert seeded["bad"].get(f"{table}.{kind}", 0) > 0, f"{table}.{kind}"
        assert seeded["expected"]["quarantined"][table] < 0.1 * seeded["rows"][table]
    assert _query("SELECT COUNT(*) FROM users WHERE username IS NULL")[0][0] > 0
    for table in LEGACY_TABLES:
        zero = _query(f"SELECT COUNT(*) FROM `{table}` "
                      "WHERE CAST(created_at AS CHAR) = '0000-00-00 00:00:00'")
        assert zero[0][0] > 0, table


def test_orphans_at_every_reference(seeded):
    refs = [("boards", "user_id", "users"), ("pins", "user_id", "users"),
            ("pins", "board_id", "boards"), ("comments", "pin_id", "pins"),
            ("comments", "user_id", "users"), ("follows", "user_id", "users"),
            ("follows", "board_id", "boards"), ("likes", "user_id", "users"),
            ("likes", "pin_id", "pins")]
    for child, col, parent in refs:
        n = _query(f"SELECT COUNT(*) FROM `{child}` c LEFT JOIN `{parent}` p "
                   f"ON p.id = c.{col} WHERE p.id IS NULL")[0][0]
        assert n > 0, f"{child}.{col}"


def test_rows_under_a_quarantined_parent(seeded):
    bad_boards = ("SELECT b.id FROM boards b JOIN users u ON u.id = b.user_id "
                  "WHERE u.username IS NULL")
    pins = f"SELECT id FROM pins WHERE board_id IN ({bad_boards})"
    assert _query(f"SELECT COUNT(*) FROM ({pins}) p")[0][0] > 0
    assert _query(f"SELECT COUNT(*) FROM comments WHERE pin_id IN ({pins})")[0][0] > 0
    assert _query(f"SELECT COUNT(*) FROM follows WHERE board_id IN ({bad_boards})")[0][0] > 0


def test_expected_outcome_agrees_with_sql(seeded):
    gu = f"SELECT id FROM users WHERE username IS NOT NULL AND {OK}"
    gb = f"SELECT id FROM boards WHERE {OK} AND user_id IN ({gu})"
    gp = f"SELECT id FROM pins WHERE {OK} AND user_id IN ({gu}) AND board_id IN ({gb})"
    good = {"users": gu, "boards": gb, "pins": gp,
            "comments": f"SELECT id FROM comments WHERE {OK} AND pin_id IN ({gp}) "
                        f"AND user_id IN ({gu})",
            "follows": f"SELECT 1 FROM follows WHERE {OK} AND user_id IN ({gu}) "
                       f"AND board_id IN ({gb})",
            "likes": f"SELECT 1 FROM likes WHERE {OK} AND user_id IN ({gu}) "
                     f"AND pin_id IN ({gp})"}
    for table, sql in good.items():
        assert _query(f"SELECT COUNT(*) FROM ({sql}) g")[0][0] == \
            seeded["expected"]["loaded"][table], table


def test_ids_sparse_and_large(seeded):
    for table in ("users", "boards", "pins", "comments"):
        lo, hi, big = _query(f"SELECT MIN(id), MAX(id), SUM(id >= 1 << 36) "
                                f"FROM `{table}`")[0]
        assert big > 0 and hi >= 2**36, table
        dense = _query(f"SELECT COUNT(*) FROM `{table}` WHERE id < 1 << 36")[0][0]
        low_max = _query(f"SELECT MAX(id) FROM `{table}` WHERE id < 1 << 36")[0][0]
        assert low_max - lo + 1 > dense * 1.1, f"{table} ids are dense"


def test_hot_boards_and_same_second_bursts(seeded):
    counts = sorted(n for _, n in _query("SELECT board_id, COUNT(*) FROM follows "
                                         "GROUP BY board_id"))
    assert counts[-1] >= 200 and counts[-1] >= 20 * counts[len(counts) // 2]
    assert seeded["followers_per_board"]["max"] == counts[-1]
    for table in LEGACY_TABLES:
        burst = _query(f"SELECT COUNT(*) c FROM `{table}` WHERE {OK} "
                       "GROUP BY created_at ORDER BY c DESC LIMIT 1")[0][0]
        assert burst >= 3, table


def test_group_boards_and_shared_emails(seeded):
    assert _query("SELECT COUNT(*) FROM pins p JOIN boards b ON b.id = p.board_id "
                  "WHERE p.user_id <> b.user_id")[0][0] > 0
    shared = _query("SELECT LOWER(email), COUNT(*) c FROM users WHERE email IS NOT NULL "
                    "GROUP BY LOWER(email) HAVING c > 1")
    assert shared
    assert _query("SELECT COUNT(*) FROM users WHERE email IS NULL")[0][0] > 0
    assert _query("SELECT COUNT(*) FROM users WHERE BINARY email <> LOWER(email)")[0][0] > 0


def test_unicode_and_nul_round_trip(seeded):
    data = build(USERS, SEED)
    stored = _query("SELECT id, username, email, full_name FROM users ORDER BY id")
    assert stored == [tuple(r[:4]) for r in data.tables["users"]]
    details = _query("SELECT id, details, link, image_url FROM pins ORDER BY id")
    assert details == [(r[0], r[3], r[4], r[5]) for r in data.tables["pins"]]
    texts = [v for row in stored + details for v in row[1:] if isinstance(v, str)]
    assert any("\x00" in v for v in texts)
    assert any(any(ord(c) > 0xFFFF for c in v) for v in texts)
    assert any("\\" in v for v in texts) and any("\n" in v for v in texts)
    assert any(v != v.lower() for v in (r[1] for r in stored) if v)
    assert any(not v.isascii() for v in (r[1] for r in stored) if v)


def test_classify_keys_match_report(seeded):
    bad = classify(build(USERS, SEED))
    assert {t: len(v) for t, v in bad.items()} == seeded["expected"]["quarantined"]


def test_cli_prints_one_json_line():
    result = CliRunner().invoke(_legacy_group(), ["generate", "--users", "40", "--seed", "2",
                                                  "--replace", "--legacy-dsn", DSN_TEST.url()])
    _state.pop("current", None)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output.strip().splitlines()[-1])
    assert doc["users"] == 40 and doc["seconds"] >= 0
    assert doc["rows"]["users"] == _query("SELECT COUNT(*) FROM users")[0][0]


def _total_rows() -> int:
    return sum(_query(f"SELECT COUNT(*) FROM `{t}`")[0][0] for t in LEGACY_TABLES)


@pytest.mark.slow
def test_cli_refuses_a_legacy_database_with_rows_unless_replace(seeded, farm_env):
    env = {**farm_env, "FARM_LEGACY_DSN": DSN_TEST.url()}
    total, before = _total_rows(), _digest()
    assert total > 0
    out = run_farm(env, "legacy", "generate", "--users", "30", "--seed", "9")
    assert out.returncode == 1 and out.stdout == ""
    line, = out.stderr.strip().splitlines()
    assert line.startswith("farm: error: ") and "Traceback" not in out.stderr
    assert f"database '{DSN_TEST.database}' on 127.0.0.1:3306 holds {total:,} rows" in line
    assert "--replace" in line
    assert _digest() == before  # nothing dropped or written
    out = run_farm(env, "legacy", "generate", "--users", "30", "--seed", "9", "--replace")
    _state.pop("current", None)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1])["rows"]["users"] == \
        _query("SELECT COUNT(*) FROM users")[0][0]
    assert _digest() != before


def test_cli_generates_into_an_empty_database_without_replace(farm_env):
    env = {**farm_env, "FARM_LEGACY_DSN": DSN_TEST.url()}
    create_legacy_schema(DSN_TEST, drop=True)  # tables there, but empty
    _state.pop("current", None)
    out = run_farm(env, "legacy", "generate", "--users", "30", "--seed", "9")
    assert out.returncode == 0, out.stderr
    assert _total_rows() == sum(json.loads(out.stdout.strip().splitlines()[-1])["rows"].values())


def _legacy_group():
    from scripts.cmd_legacy import legacy_group
    return legacy_group


def test_unreachable_database_is_a_farm_error():
    from shardfarm.errors import FarmError
    bad = DSN.parse("mysql://root:secret@127.0.0.1:1/legacy_gen_test")
    with pytest.raises(FarmError) as info:
        generate(bad, 5)
    assert "secret" not in str(info.value)
    assert not isinstance(info.value, pymysql.MySQLError)


@pytest.mark.parametrize("replace", [(), ("--replace", "--yes")])
def test_a_farm_database_is_never_taken_for_the_legacy_one(farm_env, router, replace):
    """A legacy DSN naming a shard (a slip of the database name) had the shard's object
    tables dropped and made legacy tables, and an empty shard without even --replace:
    the farm's own databases are refused, in one line, and left as they were."""
    from tests.conftest import SHARDS_A
    shard = f"db{SHARDS_A[0]:05d}"
    before = _create_users(shard)
    env = {**farm_env, "FARM_LEGACY_DSN": f"mysql://root@127.0.0.1:3306/{shard}"}
    out = run_farm(env, "legacy", "generate", "--users", "3", *replace)
    assert out.returncode == 1, (out.returncode, out.stderr)
    assert out.stderr.splitlines() == [
        f"farm: error: database '{shard}' on 127.0.0.1:3306 is one of the farm's own databases "
        "(it holds chunk_fences, shard_state), not a legacy one: nothing was generated; point "
        "FARM_LEGACY_DSN (or --legacy-dsn) at the legacy database"]
    assert _create_users(shard) == before


def _create_users(database: str) -> str:
    conn = pymysql.connect(host="127.0.0.1", port=3306, user="root", database=database)
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW CREATE TABLE users")
            return cur.fetchone()[1]
    finally:
        conn.close()
