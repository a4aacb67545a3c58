"""Errors say what to fix: the connection, user, server and database they are about, the
setting to check, and nothing secret (no password, no bind value); an unreachable server
is given up on within FARM_CONNECT_TIMEOUT."""

from __future__ import annotations

import json
import socket
import threading
import time

import pymysql
import pytest

from farmcore.ledger import Ledger
from shardfarm.errors import DatabaseError, PermanentDatabaseError, UnreachableError, first_line
from shardfarm.mysql.db import connect
from shardfarm.mysql.dsn import DSN
from sharding.mapsource import ShardMapSource
from sharding.router import Router
from tests.conftest import SHARDS_B, make_map_doc, run_farm
from tests.servers import free_port

USER, PASSWORD = "farm_err_user", "S3cret-Pw-42"


@pytest.mark.parametrize("code,text,kept", [
    (1049, "Unknown database 'db_nope'", "'db_nope'"),
    (1045, "Access denied for user 'bob'@'10.0.0.9' (using password: YES)", "'bob'@'10.0.0.9'"),
    (1146, "Table 'db00001.users' doesn't exist", "'db00001.users'"),
    (1054, "Unknown column 'lcoal_id' in 'field list'", "'lcoal_id'"),
])
def test_identifiers_are_kept(code, text, kept):
    from shardfarm.mysql.connect import scrub
    assert kept in scrub(code, text)


@pytest.mark.parametrize("code,text,secret", [
    (1062, "Duplicate entry 'alice@example.com' for key 'email'", "alice@example.com"),
    (1366, "Incorrect integer value: 'hunter2' for column 'x' at row 1", "hunter2"),
    (1264, "Out of range value for column 'x' at row 1 near '99999'", "99999"),
    (1064, "You have an error in your SQL syntax near 'hunter2' at line 1", "hunter2"),
    (None, "something 'hunter2'", "hunter2"),
    (9999, "a code nobody knows 'hunter2'\nsecond line", "hunter2"),
])
def test_data_values_are_scrubbed(code, text, secret):
    from shardfarm.mysql.connect import scrub
    out = scrub(code, text)
    assert secret not in out and "'?'" in out and "\n" not in out


@pytest.fixture(scope="module")
def limited_user(server_b):
    """A user on the private server that may only read one database."""
    admin = pymysql.connect(host="127.0.0.1", port=server_b.port, user="root", autocommit=True)
    with admin.cursor() as cur:
        cur.execute("CREATE DATABASE IF NOT EXISTS farm_err_db")
        cur.execute("CREATE TABLE IF NOT EXISTS farm_err_db.t (id INT PRIMARY KEY)")
        cur.execute(f"CREATE USER IF NOT EXISTS '{USER}'@'%' IDENTIFIED BY '{PASSWORD}'")
        cur.execute(f"GRANT SELECT ON farm_err_db.* TO '{USER}'@'%'")
    yield server_b.port
    with admin.cursor() as cur:
        cur.execute(f"DROP USER IF EXISTS '{USER}'@'%'")
        cur.execute("DROP DATABASE IF EXISTS farm_err_db")
    admin.close()


def _legacy(port: int, password: str, database: str) -> DSN:
    return DSN.parse(f"mysql://{USER}:{password}@127.0.0.1:{port}/{database}",
                     what="FARM_LEGACY_DSN")


def _error(fn) -> str:
    with pytest.raises(DatabaseError) as exc:
        fn()
    msg = str(exc.value)
    assert "\n" not in msg and PASSWORD not in msg and "wrong-pw" not in msg
    return msg


def test_access_denied_names_user_server_and_variable(limited_user):
    port = limited_user
    msg = _error(lambda: connect(_legacy(port, "wrong-pw", "farm_err_db")))
    assert f"legacy ({USER}@127.0.0.1:{port}/farm_err_db)" in msg
    assert f"Access denied for user '{USER}'" in msg and "check FARM_LEGACY_DSN" in msg


def test_database_the_user_may_not_open_is_named(limited_user):
    msg = _error(lambda: connect(_legacy(limited_user, PASSWORD, "farm_err_other")))
    assert "1044" in msg and "'farm_err_other'" in msg and f"'{USER}'" in msg


def test_command_denied_names_the_table(limited_user):
    from loaders.migration.legacy import LegacyReader
    reader = LegacyReader(_legacy(limited_user, PASSWORD, "farm_err_db"))
    msg = _error(lambda: reader.query("INSERT INTO t (id) VALUES (%s)", (424242,)))
    reader.close()
    assert "1142" in msg and "INSERT command denied" in msg and f"'{USER}'" in msg
    assert "farm_err_db" in msg and "424242" not in msg


def test_unknown_control_database_is_named(server_b):
    ledger = Ledger(DSN.parse(f"mysql://root@127.0.0.1:{server_b.port}/farm_err_nodb",
                              what="FARM_CONTROL_DSN"))
    msg = _error(lambda: ledger.latest_run("migrate"))
    ledger.close()
    assert "Unknown database 'farm_err_nodb'" in msg
    assert msg.endswith("(run 'farm shards init', or check FARM_CONTROL_DSN)"), msg
    assert f"control (root@127.0.0.1:{server_b.port}/farm_err_nodb)" in msg


def test_an_unknown_legacy_database_is_a_setting_not_shards_init(server_b):
    """'farm shards init' makes the farm's databases, never the legacy source."""
    from loaders.migration.legacy import LegacyReader
    dsn = DSN.parse(f"mysql://root@127.0.0.1:{server_b.port}/farm_err_nolegacy",
                    what="FARM_LEGACY_DSN")
    reader = LegacyReader(dsn)
    msg = _error(lambda: reader.query("SELECT 1"))
    reader.close()
    assert "Unknown database 'farm_err_nolegacy'" in msg and "shards init" not in msg
    assert msg.endswith("(check FARM_LEGACY_DSN)"), msg


def test_a_legacy_database_without_the_legacy_tables_names_the_setting(server_b):
    """Before, 'farm migrate' against a legacy database without its tables said only
    "Table 'x.users' doesn't exist": nothing named what to fix."""
    from loaders.migration.legacy import LegacyReader
    name = "farm_err_emptylegacy"
    admin = pymysql.connect(host="127.0.0.1", port=server_b.port, user="root", autocommit=True)
    try:
        admin.cursor().execute(f"CREATE DATABASE IF NOT EXISTS {name}")
        reader = LegacyReader(DSN.parse(f"mysql://root@127.0.0.1:{server_b.port}/{name}",
                                        what="FARM_LEGACY_DSN"))
        msg = _error(lambda: reader.query("SELECT id FROM users"))
        reader.close()
    finally:
        admin.cursor().execute(f"DROP DATABASE IF EXISTS {name}")
        admin.close()
    assert f"Table '{name}.users' doesn't exist" in msg and "shards init" not in msg
    assert msg.endswith("(check FARM_LEGACY_DSN: the database it names lacks this legacy "
                        "table)"), msg


def test_missing_table_on_a_shard_names_host_server_shard_and_table(router):
    shard = SHARDS_B[0]
    q = f"`db{shard:05d}`.`no_such_table`"  # a name outside the vocabulary, on purpose
    msg = _error(lambda: router.run(shard, lambda cur: cur.execute(f"SELECT * FROM {q}")))
    port = router.host_for(shard).port
    assert f"TestB1 (root@127.0.0.1:{port}), shard {shard}" in msg
    assert f"db{shard:05d}.no_such_table" in msg
    assert msg.endswith("(run 'farm shards init', or check host TestB1 in the shard map "
                        "(FARM_SHARDMAP))"), msg


# -- unreachable servers: given up on within FARM_CONNECT_TIMEOUT --------------------------
@pytest.fixture
def silent_port():
    """A port that accepts TCP connections and never says a word (a stalled server, or a
    middlebox that answers for an unroutable address)."""
    sock = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                held.append(sock.accept()[0])
            except OSError:
                return
    threading.Thread(target=accept, daemon=True).start()
    yield sock.getsockname()[1]
    stop.set()
    sock.close()
    for s in held:
        s.close()


def _router_with_b_at(port: int, tmp_path) -> Router:
    doc = make_map_doc(port)
    doc["hosts"]["TestB1"]["password"] = "s3cret-map-pw"
    path = tmp_path / "m.json"
    path.write_text(json.dumps(doc))
    return Router(ShardMapSource(path))


@pytest.mark.slow
def test_silent_shard_server_is_given_up_on_within_the_budget(silent_port, tmp_path,
                                                              monkeypatch):
    monkeypatch.setenv("FARM_CONNECT_TIMEOUT", "2")
    r = _router_with_b_at(silent_port, tmp_path)
    t0 = time.monotonic()
    with pytest.raises(UnreachableError) as exc:
        r.run(SHARDS_B[0], lambda cur: cur.execute("SELECT 1"))
    assert time.monotonic() - t0 < 5
    msg = str(exc.value)
    assert f"TestB1 (root@127.0.0.1:{silent_port})" in msg and "2 s" in msg
    assert "FARM_SHARDMAP" in msg and "s3cret-map-pw" not in msg


def test_refused_connection_is_retried_only_within_the_budget(tmp_path, monkeypatch):
    monkeypatch.setenv("FARM_CONNECT_TIMEOUT", "2")
    port = free_port()
    r = _router_with_b_at(port, tmp_path)
    t0 = time.monotonic()
    with pytest.raises(UnreachableError) as exc:
        r.run(SHARDS_B[0], lambda cur: cur.execute("SELECT 1"))
    assert time.monotonic() - t0 < 5
    assert f"127.0.0.1:{port}" in str(exc.value) and "refused" in str(exc.value)


@pytest.mark.slow
def test_cli_gives_up_on_a_silent_control_server_within_15_s(farm_env, silent_port):
    """The default budget (10 s): before, the ledger retried for 60 s, each try waiting for
    a handshake that never came."""
    env = {**farm_env, "FARM_CONTROL_DSN": f"mysql://root:topsecret@127.0.0.1:{silent_port}/c"}
    env.pop("FARM_CONNECT_TIMEOUT", None)
    for command in (("status",), ("shards", "init")):
        t0 = time.monotonic()
        out = run_farm(env, *command, timeout=60)
        assert time.monotonic() - t0 < 15, command
        assert out.returncode == 1, out.stderr
        assert "Traceback" not in out.stderr and "topsecret" not in out.stderr + out.stdout
        last = out.stderr.strip().splitlines()[-1]
        assert last.startswith("farm: error: cannot reach MySQL control (root@127.0.0.1:"), last
        assert "FARM_CONNECT_TIMEOUT=10 s" in last and "check FARM_CONTROL_DSN" in last


@pytest.mark.slow
def test_cli_gives_up_on_an_unroutable_control_host(farm_env):
    env = {**farm_env, "FARM_CONTROL_DSN": "mysql://root:topsecret@10.255.255.1:3306/c",
           "FARM_CONNECT_TIMEOUT": "3"}
    t0 = time.monotonic()
    out = run_farm(env, "status", timeout=60)
    assert time.monotonic() - t0 < 15
    assert out.returncode == 1 and "Traceback" not in out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert "cannot reach MySQL control (root@10.255.255.1:3306/c)" in last
    assert "check FARM_CONTROL_DSN" in last and "topsecret" not in out.stderr


def test_permanent_errors_are_not_retried(server_b):
    dsn = DSN.parse(f"mysql://root@127.0.0.1:{server_b.port}/farm_err_nodb2",
                    what="FARM_LEGACY_DSN")
    from loaders.migration.legacy import LegacyReader
    reader = LegacyReader(dsn)
    t0 = time.monotonic()
    with pytest.raises(PermanentDatabaseError):
        reader.query("SELECT 1")
    assert time.monotonic() - t0 < 2
    reader.close()


def test_a_quoted_cause_keeps_a_long_paths_advice_and_stays_one_bounded_line():
    """A cause naming two deep paths kept its advice (before, 300 characters cut it to
    "move it away or export elsewh"); it stays one line, bounded."""
    deep = "/srv/exports/" + "nested/" * 40
    said = f"export path {deep}dt=2026-01-01 is a file where a directory belongs: move it away"
    assert first_line(ValueError(f"{said}\nsecond line")) == said
    assert len(first_line(ValueError("x" * 50_000))) == 1000
    assert first_line(ValueError()) == "ValueError"
