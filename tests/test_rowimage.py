"""Reduced row images read straight from binlog bytes (``rowimage``), against what
``pymysqlreplication`` decodes of the same events, on a private ROW-binlog mariadbd: every
legacy column type, NULLs, long and multi-byte text, zero and real dates, the largest
unsigned IDs, multi-row events; and the events read the library's way (a partial row
image holding every followed column, a table laid out otherwise) still come out right.
A binary log sync cannot follow whole (compressed, MINIMAL images) is refused, by the
server's setting and by an image a session wrote partial."""

from __future__ import annotations

import random

import pytest
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import HeartbeatLogEvent
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

from loaders.migration import binlog, rowimage
from loaders.migration.legacy import LegacyReader
from loaders.migration.legacy_schema import LEGACY_DDL
from shardfarm.errors import ConfigError
from shardfarm.mysql.dsn import DSN
from tests.servers import PrivateMariaDB

WANTED = {"users": ("id", "username", "created_at"), "pins": ("id", "user_id", "board_id",
                                                                "created_at"),
          "likes": ("user_id", "pin_id", "created_at")}
# the legacy schema's column order, written out here (not imported from the code checked)
ORDER = {"users": ("id", "username", "email", "full_name", "created_at"),
         "pins": ("id", "user_id", "board_id", "details", "link", "image_url", "created_at"),
         "likes": ("user_id", "pin_id", "created_at")}


@pytest.fixture(scope="module")
def server():
    s = PrivateMariaDB.start_binlog(server_id=21)
    s.sql("CREATE DATABASE legacy")
    for table in ("users", "pins", "likes"):
        s.sql(LEGACY_DDL[table].replace("CREATE TABLE IF NOT EXISTS ", "CREATE TABLE legacy.")
              + " DEFAULT CHARSET=utf8mb4")
    s.sql("CREATE TABLE legacy.other (id BIGINT UNSIGNED PRIMARY KEY, note TEXT)")
    s.start_at = s.sql("SELECT @@gtid_binlog_pos")[0][0]
    yield s
    s.stop()


def _write(server: PrivateMariaDB) -> None:
    """Every kind of value and event the legacy tables can log."""
    rng = random.Random(5)
    conn = server.connect(database="legacy")
    with conn.cursor() as cur:
        cur.execute("SET SESSION sql_mode = ''")  # zero dates allowed
        users = [(i, f"user{i}" if i % 5 else None, "ü@x.org", "Zoë " * rng.randint(0, 80),
                  "2021-03-04 05:06:07" if i % 3 else None) for i in range(1, 40)]
        users += [(2**64 - 1, "名前" * 20, None, "x" * 300, "0000-00-00 00:00:00"),
                  (2**35, "", "", "", "9999-12-31 23:59:59")]
        cur.executemany("INSERT INTO users VALUES (%s, %s, %s, %s, %s)", users)  # multi-row
        cur.execute("INSERT INTO pins VALUES (7, 1, 2, %s, %s, NULL, '2020-01-01 00:00:00')",
                    ("d" * 60000, "http://l/" + "é" * 600))
        cur.execute("INSERT INTO pins VALUES (8, NULL, NULL, NULL, NULL, NULL, NULL)")
        cur.execute("UPDATE users SET username = CONCAT(username, 'x'), created_at = NOW() "
                    "WHERE id < 10")
        cur.execute("UPDATE pins SET board_id = 3, details = 'short' WHERE id = 7")
        cur.execute("INSERT INTO likes VALUES (1, 7, NULL), (%s, %s, NOW())",
                    (2**64 - 1, 2**64 - 2))
        cur.execute("DELETE FROM likes WHERE user_id = 1")
        cur.execute("INSERT INTO other VALUES (1, 'not followed')")
        cur.execute("SET SESSION binlog_row_image = 'NOBLOB'")  # partial images (no text
        cur.execute("UPDATE pins SET board_id = 4 WHERE id = 7")  # column), read the
        cur.execute("DELETE FROM pins WHERE id = 8")               # library's way
    conn.close()


def _by_library(server: PrivateMariaDB) -> list[tuple]:
    """Every row change as the library decodes it, named by column order and reduced."""
    reader = BinLogStreamReader(
        connection_settings={"host": "127.0.0.1", "port": server.port, "user": "root",
                             "passwd": ""}, server_id=9001, blocking=True, is_mariadb=True,
        auto_position=server.start_at, slave_heartbeat=0.5, only_schemas=["legacy"],
        only_events=[WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent, HeartbeatLogEvent])
    out: list[tuple] = []

    def reduce(table: str, values: dict | None) -> dict | None:
        if values is None:
            return None
        vals = list(values.values())
        named = {ORDER[table][i]: (v + 2**64 if isinstance(v, int) and v < 0 else v)
                 for i, v in enumerate(vals)}
        return {c: named[c] for c in WANTED[table] if c in named}
    try:
        for ev in reader:
            if isinstance(ev, HeartbeatLogEvent):
                break
            if ev.table not in WANTED:
                continue
            for row in ev.rows:
                if isinstance(ev, UpdateRowsEvent):
                    before, after = row["before_values"], row["after_values"]
                else:
                    before = row["values"] if isinstance(ev, DeleteRowsEvent) else None
                    after = row["values"] if isinstance(ev, WriteRowsEvent) else None
                out.append((ev.table, reduce(ev.table, before), reduce(ev.table, after)))
    finally:
        reader.close()
    return out


def _by_stream(server: PrivateMariaDB, monkeypatch) -> tuple[list[tuple], list[bool]]:
    """Every row change as ``binlog.stream`` gives it, and per rows event whether it was
    read from its bytes here (else by the library)."""
    fast: list[bool] = []
    real = rowimage.reduced_rows

    def counting(ev, wanted):
        got = real(ev, wanted)
        fast.append(got is not None)
        return got
    monkeypatch.setattr(rowimage, "reduced_rows", counting)
    out: list[tuple] = []
    dsn = DSN.parse(f"mysql://root@127.0.0.1:{server.port}/legacy")
    for item in binlog.stream(dsn, server.start_at, WANTED, heartbeat=0.5):
        if isinstance(item, binlog.Mark):
            if item.idle:
                break
            continue
        out.append((item.table, item.before, item.after))
    return out, fast


def test_reduced_images_match_the_librarys_decoding(server, monkeypatch):
    _write(server)
    expected = _by_library(server)
    got, fast = _by_stream(server, monkeypatch)
    assert got == expected
    assert len(expected) == 41 + 2 + 9 + 1 + 2 + 1 + 1 + 1
    # every event of full images was read here; the two of NOBLOB ones the library's way
    assert fast.count(False) == 2 and fast[-2:] == [False, False] and len(fast) >= 8
    names = {r[2]["username"] for r in got if r[0] == "users" and r[2]}
    assert "名前" * 20 in names and None in names
    dates = [r[2]["created_at"] for r in got if r[0] == "users" and r[2] and r[1] is None]
    assert dates[-2] is None and str(dates[-1]) == "9999-12-31 23:59:59"  # zero date: None


def test_an_image_a_session_wrote_minimal_stops_the_stream_in_one_line(server, monkeypatch):
    """A session's MINIMAL update logs the key alone before and the changed column alone
    after: the library gives the other columns as ``None``. The stream stops there."""
    conn = server.connect(database="legacy")
    with conn.cursor() as cur:
        cur.execute("INSERT INTO users VALUES (90, 'before', NULL, NULL, NOW())")
        cur.execute("SET SESSION binlog_row_image = 'MINIMAL'")
        cur.execute("UPDATE users SET username = 'after' WHERE id = 90")
    conn.close()
    with pytest.raises(binlog.PartialImageError) as info:
        _by_stream(server, monkeypatch)
    text = str(info.value)
    assert "users without id, username, created_at" in text and "binlog_row_image=MINIMAL" in text
    assert "FULL or NOBLOB" in text and "\n" not in text


@pytest.mark.parametrize("metadata", ["NO_LOG", "FULL"])
def test_latin1_text_comes_out_as_written_whether_its_charset_is_logged_or_not(server,
                                                                                metadata):
    """A latin1 legacy table: with no character set logged (MariaDB's default) the bytes
    are not UTF-8 and are read as Latin-1; with it logged the library decodes them. A
    partial (NOBLOB) image of a row with such text, which the library decodes whole,
    does not stop the stream either."""
    was = server.sql("SELECT @@binlog_row_metadata")[0][0]
    db = f"latin_{metadata.lower()}"
    server.sql(f"CREATE DATABASE {db}")
    for table in ("users", "pins"):
        server.sql(LEGACY_DDL[table].replace("CREATE TABLE IF NOT EXISTS ",
                                             f"CREATE TABLE {db}.") + " DEFAULT CHARSET=latin1")
    start = server.sql("SELECT @@gtid_binlog_pos")[0][0]
    server.sql(f"SET GLOBAL binlog_row_metadata = {metadata}")
    try:
        conn = server.connect(database=db)
        with conn.cursor() as cur:
            cur.execute("INSERT INTO users VALUES (1, 'José', NULL, NULL, NULL)")
            cur.execute("UPDATE users SET username = 'Josè' WHERE id = 1")
            cur.execute("INSERT INTO pins VALUES (1, 1, 1, 'd', 'café', NULL, NULL)")
            cur.execute("SET SESSION binlog_row_image = 'NOBLOB'")  # a partial image: the
            cur.execute("UPDATE pins SET board_id = 2 WHERE id = 1")  # library decodes it
        conn.commit()
        conn.close()
        dsn = DSN.parse(f"mysql://root@127.0.0.1:{server.port}/{db}")
        got = []
        wanted = {"users": ("id", "username"), "pins": ("id", "board_id")}
        for item in binlog.stream(dsn, start, wanted, heartbeat=0.5):
            if isinstance(item, binlog.Mark):
                if item.idle:
                    break
                continue
            got.append((item.before, item.after))
    finally:
        server.sql(f"SET GLOBAL binlog_row_metadata = {was}")
    assert got == [(None, {"id": 1, "username": "José"}),
                   ({"id": 1, "username": "José"}, {"id": 1, "username": "Josè"}),
                   (None, {"id": 1, "board_id": 1}),
                   ({"id": 1, "board_id": 1}, {"id": 1, "board_id": 2})]


@pytest.mark.parametrize(("variable", "value", "says"), [
    ("log_bin_compress", "ON", "log_bin_compress=ON"),
    ("binlog_row_image", "MINIMAL", "binlog_row_image=MINIMAL")])
def test_a_binlog_sync_cannot_follow_whole_is_refused(server, variable, value, says):
    """Compressed row events (the library skips them: changes lost) and MINIMAL images
    (no key in an update's after image) are refused in one line that says what to set."""
    was = server.sql(f"SELECT @@{variable}")[0][0]
    server.sql(f"SET GLOBAL {variable} = {value}")
    reader = LegacyReader(DSN.parse(f"mysql://root@127.0.0.1:{server.port}/legacy"))
    try:
        binlog.check_server(reader)
    except ConfigError as exc:
        assert says in str(exc) and "SET GLOBAL" in str(exc) and "\n" not in str(exc)
    else:
        pytest.fail("not refused")
    finally:
        reader.close()
        server.sql(f"SET GLOBAL {variable} = '{was}'" if not str(was).isdigit()
                   else f"SET GLOBAL {variable} = {was}")
    reader = LegacyReader(DSN.parse(f"mysql://root@127.0.0.1:{server.port}/legacy"))
    try:
        binlog.check_server(reader)  # restored: followed again
    finally:
        reader.close()
