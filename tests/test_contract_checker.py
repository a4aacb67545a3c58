"""The independent contract checker accepts a hand-built correct target and catches mutations.

The legacy side is a tiny ``legacy_chk_test`` database on the machine's MariaDB; the target
(shards 65500-65501 and mod buckets 0-3) lives on a private mariadbd, so the fixed
``modNNNNN`` names never clash with other users of the shared server. Every target row here
is written by hand with plain SQL; nothing of the code under test is used.
"""

from __future__ import annotations

import calendar
import datetime as dt
import hashlib
import json

import pymysql
import pytest

from tests.conftest import ns_db
from tests.contract_checker import check_migration
from tests.servers import PrivateMariaDB

S0, S1 = 65500, 65501
BUCKETS = 4
LEGACY_DB = ns_db("legacy_chk_test")
BIG = 2**35 + 5  # a legacy id too large to be a local id (2**35 and up are allocated)
BIG_LOCAL = 2**35 + 7  # the local id the shard allocated to it


def nid(shard: int, type_id: int, local: int) -> int:
    """A 64-bit id by hand: shard << 46 | type << 36 | local."""
    return (shard << 46) | (type_id << 36) | local


def bucket(key: str) -> int:
    """Mod bucket by hand: md5 of the UTF-8 key modulo the buckets."""
    return int(hashlib.md5(key.encode("utf-8")).hexdigest(), 16) % BUCKETS


def t(day: int, hour: int = 0) -> dt.datetime:
    """A legacy UTC time in January 2013."""
    return dt.datetime(2013, 1, day, hour, 4, 5)


def iso(when: dt.datetime) -> str:
    """ISO-8601 UTC."""
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def secs(when: dt.datetime) -> int:
    """Unix seconds of a UTC time."""
    return calendar.timegm(when.timetuple())


TRICKY = 'quote " and \' \n newline \x00 nul 🌸'
ZERO = "0000-00-00 00:00:00"

# ------------------------------------------------------------------ legacy rows
LEGACY_ROWS = {
    "users": [(1, "Alice", "alice@x.com", "Alice A", t(1)),
              (2, "bob", "ALICE@x.com", None, t(2)),
              (3, None, "nobody@x.com", "no username", t(3)),          # bad: no username
              (4, "Zoë🌸", None, TRICKY, t(4)),
              (BIG, "big", "big@x.com", "Big", t(5))],
    "boards": [(10, 1, "Recipes", None, t(6)),
               (11, 3, "orphan owner", "x", t(6)),                   # owner not migrated
               (12, 2, "zero date", "x", ZERO)],                      # bad: zero date
    "pins": [(100, 1, 10, TRICKY, "http://a", None, t(7)),
             (101, 2, 10, None, None, "http://img", t(8)),
             (102, 1, 11, "on a bad board", None, None, t(9))],      # board not migrated
    "comments": [(1000, 100, 2, "nice 🌸 \"pin\"", t(10))],
    "follows": [(2, 10, t(11)), (4, 12, t(11))],                       # (4, 12): bad board
    "likes": [(4, 100, t(12)), (BIG, 101, t(12, 5)), (3, 100, t(12))],  # (3, 100): bad user
}
QUARANTINE = [("users", "3", "username missing"), ("boards", "11", "owner"),
              ("boards", "12", "created_at"), ("pins", "102", "board"),
              ("follows", "4:12", "board"), ("likes", "3:100", "user")]

LEGACY_DDL = [
    """CREATE TABLE users (id BIGINT UNSIGNED PRIMARY KEY, username VARCHAR(64) NULL UNIQUE,
       email VARCHAR(255) NULL, full_name VARCHAR(255) NULL, created_at DATETIME NULL)""",
    """CREATE TABLE boards (id BIGINT UNSIGNED PRIMARY KEY, user_id BIGINT UNSIGNED NULL,
       name VARCHAR(255) NULL, description TEXT NULL, created_at DATETIME NULL)""",
    """CREATE TABLE pins (id BIGINT UNSIGNED PRIMARY KEY, user_id BIGINT UNSIGNED NULL,
       board_id BIGINT UNSIGNED NULL, details TEXT NULL, link VARCHAR(2048) NULL,
       image_url VARCHAR(2048) NULL, created_at DATETIME NULL)""",
    """CREATE TABLE comments (id BIGINT UNSIGNED PRIMARY KEY, pin_id BIGINT UNSIGNED NULL,
       user_id BIGINT UNSIGNED NULL, body TEXT NULL, created_at DATETIME NULL)""",
    """CREATE TABLE follows (user_id BIGINT UNSIGNED, board_id BIGINT UNSIGNED,
       created_at DATETIME NULL, PRIMARY KEY (user_id, board_id))""",
    """CREATE TABLE likes (user_id BIGINT UNSIGNED, pin_id BIGINT UNSIGNED,
       created_at DATETIME NULL, PRIMARY KEY (user_id, pin_id))""",
]

# ------------------------------------------------------------------ target rows
U1, U2, U4, UBIG = nid(S0, 3, 1), nid(S1, 3, 2), nid(S0, 3, 4), nid(S1, 3, BIG_LOCAL)
B10, P100, P101, C1000 = nid(S0, 2, 10), nid(S0, 1, 100), nid(S0, 1, 101), nid(S0, 4, 1000)

OBJECTS = {  # table -> [(shard, local_id, data)]
    "users": [
        (S0, 1, {"legacy_id": 1, "username": "Alice", "email": "alice@x.com",
                 "full_name": "Alice A", "created_at": iso(t(1))}),
        (S1, 2, {"legacy_id": 2, "username": "bob", "email": "ALICE@x.com",
                 "full_name": None, "created_at": iso(t(2))}),
        (S0, 4, {"legacy_id": 4, "username": "Zoë🌸", "email": None,
                 "full_name": TRICKY, "created_at": iso(t(4))}),
        (S1, BIG_LOCAL, {"legacy_id": BIG, "username": "big", "email": "big@x.com",
                 "full_name": "Big", "created_at": iso(t(5))})],
    "boards": [(S0, 10, {"legacy_id": 10, "user_id": U1, "name": "Recipes",
                         "description": None, "created_at": iso(t(6))})],
    "pins": [
        (S0, 100, {"legacy_id": 100, "user_id": U1, "board_id": B10, "details": TRICKY,
                   "link": "http://a", "image_url": None, "created_at": iso(t(7))}),
        (S0, 101, {"legacy_id": 101, "user_id": U2, "board_id": B10, "details": None,
                   "link": None, "image_url": "http://img", "created_at": iso(t(8))})],
    "comments": [(S0, 1000, {"legacy_id": 1000, "pin_id": P100, "user_id": U2,
                             "body": "nice 🌸 \"pin\"", "created_at": iso(t(10))})],
}
MAPPINGS = {  # table -> [(shard, from_id, to_id, sequence)]
    "user_has_boards": [(S0, U1, B10, secs(t(6)))],
    "user_has_pins": [(S0, U1, P100, secs(t(7))), (S1, U2, P101, secs(t(8)))],
    "board_has_pins": [(S0, B10, P100, secs(t(7))), (S0, B10, P101, secs(t(8)))],
    "user_follows_boards": [(S1, U2, B10, secs(t(11)))],
    "user_likes_pins": [(S0, U4, P100, secs(t(12))), (S1, UBIG, P101, secs(t(12, 5)))],
    "pin_has_comments": [(S0, P100, C1000, secs(t(10)))],
}
REVERSE = {  # filled only by the tests that need them
    "pin_owned_by_board": [(S0, P100, B10, secs(t(7))), (S0, P101, B10, secs(t(8)))],
    "board_followedby_users": [(S0, B10, U2, secs(t(11)))],
    "pin_liked_by_users": [(S0, P100, U4, secs(t(12))), (S0, P101, UBIG, secs(t(12, 5)))],
}
ID_MAP = [(3, 1, U1), (3, 2, U2), (3, 4, U4), (3, BIG, UBIG), (2, 10, B10),
          (1, 100, P100), (1, 101, P101), (4, 1000, C1000)]
NAMES = {1: "pin", 2: "board", 3: "user", 4: "comment"}
USERNAMES = [("alice", U1), ("bob", U2), ("zoë🌸", U4), ("big", UBIG)]
EMAILS = [("alice@x.com", U2), ("big@x.com", UBIG)]  # either Alice or bob may own alice@

OBJECT_DDL = """CREATE TABLE `{db}`.`{t}` (local_id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT
    PRIMARY KEY, data JSON, active TINYINT(1) NOT NULL DEFAULT 1) DEFAULT CHARSET=utf8mb4"""
MAPPING_DDL = """CREATE TABLE `{db}`.`{t}` (from_id BIGINT UNSIGNED NOT NULL,
    to_id BIGINT UNSIGNED NOT NULL, sequence BIGINT NOT NULL, PRIMARY KEY (from_id, to_id),
    KEY seq (from_id, sequence, to_id))"""
HOTSPOT_DDL = """CREATE TABLE `{db}`.board_followedby_user_shard (board_id BIGINT UNSIGNED,
    shard INT, PRIMARY KEY (board_id, shard))"""
MOD_DDL = [
    """CREATE TABLE `{db}`.legacy_id_map (type_id INT NOT NULL, legacy_id BIGINT UNSIGNED
       NOT NULL, new_id BIGINT UNSIGNED NOT NULL, PRIMARY KEY (type_id, legacy_id))""",
    """CREATE TABLE `{db}`.username_to_user (username VARCHAR(255) CHARACTER SET utf8mb4
       COLLATE utf8mb4_bin PRIMARY KEY, user_id BIGINT UNSIGNED NOT NULL)""",
    """CREATE TABLE `{db}`.email_to_user (email VARCHAR(255) CHARACTER SET utf8mb4
       COLLATE utf8mb4_bin PRIMARY KEY, user_id BIGINT UNSIGNED NOT NULL)""",
]


def connect(port: int, **kw) -> pymysql.connections.Connection:
    """Root connection to a local server."""
    return pymysql.connect(host="127.0.0.1", port=port, user="root", password="",
                           charset="utf8mb4", autocommit=True, **kw)


def run(port: int, *statements: str | tuple[str, tuple]) -> None:
    """Execute statements (plain, or ``(sql, args)``) on a server."""
    conn = connect(port)
    with conn.cursor() as cur:
        for st in statements:
            cur.execute(*st) if isinstance(st, tuple) else cur.execute(st)
    conn.close()


def build_target(port: int, reverse: bool = False) -> None:
    """(Re)create the whole correct target by hand."""
    stmts: list = []
    for s in (S0, S1):
        db = f"db{s:05d}"
        stmts += [f"DROP DATABASE IF EXISTS {db}", f"CREATE DATABASE {db} CHARACTER SET utf8mb4"]
        stmts += [OBJECT_DDL.format(db=db, t=tb) for tb in OBJECTS]
        stmts += [MAPPING_DDL.format(db=db, t=tb) for tb in [*MAPPINGS, *REVERSE]]
        stmts.append(HOTSPOT_DDL.format(db=db))
    for b in range(BUCKETS):
        db = f"mod{b:05d}"
        stmts += [f"DROP DATABASE IF EXISTS {db}", f"CREATE DATABASE {db} CHARACTER SET utf8mb4"]
        stmts += [ddl.format(db=db) for ddl in MOD_DDL]
    for table, rows in OBJECTS.items():
        stmts += [(f"INSERT INTO db{s:05d}.{table} (local_id, data, active) VALUES (%s, %s, 1)",
                   (local, json.dumps(data, ensure_ascii=False))) for s, local, data in rows]
    for table, rows in [*MAPPINGS.items(), *(REVERSE.items() if reverse else [])]:
        stmts += [(f"INSERT INTO db{s:05d}.{table} VALUES (%s, %s, %s)", (f, to, seq))
                  for s, f, to, seq in rows]
    stmts += [(f"INSERT INTO mod{bucket(f'{NAMES[ty]}:{lid}'):05d}.legacy_id_map "
               "VALUES (%s, %s, %s)", (ty, lid, new)) for ty, lid, new in ID_MAP]
    stmts += [(f"INSERT INTO mod{bucket(k):05d}.username_to_user VALUES (%s, %s)", (k, u))
              for k, u in USERNAMES]
    stmts += [(f"INSERT INTO mod{bucket(k):05d}.email_to_user VALUES (%s, %s)", (k, u))
              for k, u in EMAILS]
    run(port, *stmts)


@pytest.fixture(scope="module")
def server():
    """A private mariadbd holding the whole target."""
    srv = PrivateMariaDB.start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def legacy() -> dict:
    """The tiny legacy database on the shared server, as PyMySQL kwargs."""
    stmts: list = ["SET SESSION sql_mode = ''", f"DROP DATABASE IF EXISTS {LEGACY_DB}",
                   f"CREATE DATABASE {LEGACY_DB} CHARACTER SET utf8mb4", f"USE {LEGACY_DB}",
                   *LEGACY_DDL]
    for table, rows in LEGACY_ROWS.items():
        marks = ", ".join(["%s"] * len(rows[0]))
        stmts += [(f"INSERT INTO {table} VALUES ({marks})", row) for row in rows]
    run(3306, *stmts)
    yield {"host": "127.0.0.1", "port": 3306, "user": "root", "password": "",
           "database": LEGACY_DB}
    run(3306, f"DROP DATABASE IF EXISTS {LEGACY_DB}")


@pytest.fixture
def shardmap(server) -> dict:
    """A freshly built correct target and its shard map (two host names, one server)."""
    build_target(server.port)
    host = {"host": "127.0.0.1", "port": server.port, "user": "root", "password": ""}
    return {"version": 1, "hosts": {"ChkA": host, "ChkB": dict(host)},
            "shards": [{"range": [S0, S0], "master": "ChkA", "slave": "ChkB"},
                       {"range": [S1, S1], "master": "ChkB", "slave": "ChkA"}],
            "open": [[S0, S1]],
            "mod": {"buckets": BUCKETS,
                    "ranges": [{"range": [0, BUCKETS - 1], "master": "ChkB", "slave": "ChkA"}]}}


def test_correct_target_passes(legacy, shardmap):
    assert check_migration(legacy, shardmap, QUARANTINE) == []


def test_filled_reverse_tables_pass(legacy, shardmap, server):
    build_target(server.port, reverse=True)
    assert check_migration(legacy, shardmap) == []


def test_hot_board_rows_may_live_on_listed_shards(legacy, shardmap, server):
    build_target(server.port, reverse=True)
    run(server.port, f"DELETE FROM db{S0}.board_followedby_users",
        f"INSERT INTO db{S1}.board_followedby_users VALUES ({B10}, {U2}, {secs(t(11))})")
    assert check_migration(legacy, shardmap)  # not listed in the directory yet
    run(server.port, f"INSERT INTO db{S0}.board_followedby_user_shard VALUES ({B10}, {S1})")
    assert check_migration(legacy, shardmap) == []


def user_key_bucket(key: str) -> str:
    """The mod database of a lookup key."""
    return f"mod{bucket(key):05d}"


def id_bucket(type_name: str, legacy_id: int) -> str:
    """The mod database of a legacy id."""
    return f"mod{bucket(f'{type_name}:{legacy_id}'):05d}"


MUTATIONS = {
    "drop a mapping row": [f"DELETE FROM db{S0}.board_has_pins WHERE to_id = {P101}"],
    "extra mapping row": [f"INSERT INTO db{S0}.board_has_pins VALUES ({B10}, {C1000}, 1)"],
    "wrong sequence": [f"UPDATE db{S1}.user_likes_pins SET sequence = sequence + 1"],
    "mapping row on the wrong shard": [
        f"DELETE FROM db{S1}.user_follows_boards",
        f"INSERT INTO db{S0}.user_follows_boards VALUES ({U2}, {B10}, {secs(t(11))})"],
    "change a data field": [
        f"UPDATE db{S0}.users SET data = JSON_SET(data, '$.full_name', 'x') WHERE local_id = 4"],
    "extra data key": [
        f"UPDATE db{S0}.pins SET data = JSON_SET(data, '$.extra', 1) WHERE local_id = 100"],
    "legacy_id as a string": [
        f"UPDATE db{S0}.boards SET data = JSON_SET(data, '$.legacy_id', '10')"],
    "inactive object": [f"UPDATE db{S0}.comments SET active = 0"],
    "board on the wrong shard": [
        f"INSERT INTO db{S1}.boards SELECT * FROM db{S0}.boards",
        f"DELETE FROM db{S0}.boards",
        f"UPDATE {id_bucket('board', 10)}.legacy_id_map SET new_id = {nid(S1, 2, 10)} "
        "WHERE type_id = 2"],
    "extra object row": [f"INSERT INTO db{S1}.pins VALUES (999, '{{}}', 1)"],
    "duplicate object row": [
        f"INSERT INTO db{S1}.users SELECT 9, data, 1 FROM db{S0}.users WHERE local_id = 1"],
    "drop a legacy_id_map row": [
        f"DELETE FROM {id_bucket('pin', 101)}.legacy_id_map WHERE type_id = 1 "
        "AND legacy_id = 101"],
    "id map row for a bad object": [
        f"INSERT INTO {id_bucket('pin', 102)}.legacy_id_map VALUES (1, 102, {nid(S0, 1, 102)})"],
    "wrong local id": [
        f"UPDATE {id_bucket('user', 1)}.legacy_id_map SET new_id = {nid(S0, 3, 2)} "
        "WHERE type_id = 3 AND legacy_id = 1"],
    "wrong username key": [
        f"UPDATE {user_key_bucket('alice')}.username_to_user SET username = 'Alice' "
        "WHERE username = 'alice'"],
    "username names the wrong user": [
        f"UPDATE {user_key_bucket('bob')}.username_to_user SET user_id = {U1}"],
    "missing email": [f"DELETE FROM {user_key_bucket('big@x.com')}.email_to_user "
                      "WHERE email = 'big@x.com'"],
    "allocated local id in the legacy half": [  # every reference moved along with it
        f"UPDATE db{S1}.users SET local_id = 7 WHERE local_id = {BIG_LOCAL}",
        f"UPDATE {id_bucket('user', BIG)}.legacy_id_map SET new_id = {nid(S1, 3, 7)} "
        f"WHERE type_id = 3 AND legacy_id = {BIG}",
        f"UPDATE {user_key_bucket('big')}.username_to_user SET user_id = {nid(S1, 3, 7)} "
        "WHERE username = 'big'",
        f"UPDATE {user_key_bucket('big@x.com')}.email_to_user SET user_id = {nid(S1, 3, 7)} "
        "WHERE email = 'big@x.com'",
        f"UPDATE db{S1}.user_likes_pins SET from_id = {nid(S1, 3, 7)} WHERE from_id = {UBIG}"],
    "extra email": [f"INSERT INTO {user_key_bucket('zoë@x.com')}.email_to_user "
                    f"VALUES ('zoë@x.com', {U4})"],
}


@pytest.mark.parametrize("mutation", MUTATIONS)
def test_each_mutation_is_caught(legacy, shardmap, server, mutation):
    run(server.port, *MUTATIONS[mutation])
    problems = check_migration(legacy, shardmap)
    assert problems, f"{mutation} went unnoticed"


def test_bad_reverse_table_is_caught(legacy, shardmap, server):
    build_target(server.port, reverse=True)
    run(server.port, f"DELETE FROM db{S0}.pin_liked_by_users WHERE from_id = {P101}")
    assert check_migration(legacy, shardmap)


@pytest.mark.parametrize("rows", [QUARANTINE[1:], [*QUARANTINE, ("pins", "100", "oops")],
                                  [*QUARANTINE[:-1], ("likes", "3:100", "")]])
def test_quarantine_mismatch_is_caught(legacy, shardmap, rows):
    assert check_migration(legacy, shardmap, rows)
