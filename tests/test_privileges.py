"""Least privilege on connections: only the shard writer may send files (LOAD DATA LOCAL),
only the writers may send multi-statements, never on a connection that may send files,
and a rogue server reads nothing.

A tiny fake MySQL server (handshake, OK for any login, then a ``LOCAL INFILE``
request naming a secret file as the answer to every query) plays the
rogue legacy, control or shard server; the real MariaDB proves the writers still
work.
"""

from __future__ import annotations

import json
import socket
import struct
import threading

import pytest
from pymysql.constants import CLIENT

from farmcore.ledger import Ledger
from shardfarm.errors import DatabaseError, FarmError
from shardfarm.mysql.db import connect
from shardfarm.mysql.dsn import DSN, Host
from sharding.mapsource import ShardMapSource
from sharding.router import Router
from sharding.schema import mod_table, shard_table
from tests.conftest import SHARDS_A, make_map_doc

SECRET = b"TOP-SECRET-worker-private-key-1234567890"


def _packet(seq: int, payload: bytes) -> bytes:
    return struct.pack("<I", len(payload))[:3] + bytes([seq & 0xFF]) + payload


def _ok(seq: int) -> bytes:
    return _packet(seq, b"\x00\x00\x00" + struct.pack("<HH", 2, 0))  # status: autocommit


def _greeting() -> bytes:
    caps = (CLIENT.LONG_PASSWORD | CLIENT.PROTOCOL_41 | CLIENT.SECURE_CONNECTION
            | CLIENT.PLUGIN_AUTH | CLIENT.LOCAL_FILES | CLIENT.MULTI_STATEMENTS
            | CLIENT.MULTI_RESULTS | CLIENT.TRANSACTIONS | CLIENT.CONNECT_WITH_DB)
    return (b"\x0a" + b"5.5.5-10.11.0-rogue\x00" + struct.pack("<I", 7) + b"abcdefgh" + b"\x00"
            + struct.pack("<H", caps & 0xFFFF) + bytes([45]) + struct.pack("<H", 2)
            + struct.pack("<H", caps >> 16) + bytes([21]) + b"\x00" * 10 + b"ijklmnopqrst\x00"
            + b"mysql_native_password\x00")


class RogueServer:
    """Accepts any login and answers every query with a LOCAL INFILE request for ``wanted``
    (the answer to ``SET NAMES`` is not read by PyMySQL, so that one gets an OK); records
    each client's capability flags and every byte of file it got."""

    def __init__(self, wanted: str) -> None:
        self.wanted = wanted.encode()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.flags: list[int] = []
        self.received = b""
        self._stop = False
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._session, args=(conn,), daemon=True).start()

    def _session(self, conn: socket.socket) -> None:
        rfile = conn.makefile("rb")

        def read() -> tuple[int, bytes] | None:
            head = rfile.read(4)
            if len(head) < 4:
                return None
            size = int.from_bytes(head[:3], "little")
            return head[3], rfile.read(size)
        try:
            conn.sendall(_packet(0, _greeting()))
            seq, login = read()
            self.flags.append(struct.unpack("<I", login[:4])[0])
            conn.sendall(_ok(seq + 1))
            while (got := read()) is not None:
                seq, payload = got
                if payload[:1] == b"\x01":  # COM_QUIT
                    return
                if payload.startswith(b"\x03SET NAMES"):  # PyMySQL does not read this answer
                    conn.sendall(_ok(seq + 1))
                    continue
                conn.sendall(_packet(seq + 1, b"\xfb" + self.wanted))
                # file packets continue the sequence; a packet numbered 0 is a new command
                while (data := read()) is not None and data[1] and data[0] != 0:
                    self.received += data[1]
                if data is None or data[0] == 0:
                    return
                conn.sendall(_ok(data[0] + 1))
        except (OSError, TypeError):
            return
        finally:
            conn.close()

    def close(self) -> None:
        """Stop accepting."""
        self._stop = True
        self.sock.close()


@pytest.fixture
def rogue(tmp_path):
    secret = tmp_path / "id_rsa"
    secret.write_bytes(SECRET)
    server = RogueServer(str(secret))
    yield server
    server.close()


def _assert_plain(rogue: RogueServer, multi: tuple[int, ...] = ()) -> None:
    """No file was sent, no login allowed one; only the logins numbered in ``multi``
    allowed multi-statements."""
    assert SECRET not in rogue.received and rogue.received == b""
    assert rogue.flags, "the client never logged in"
    for i, flags in enumerate(rogue.flags):
        assert not flags & CLIENT.LOCAL_FILES
        assert bool(flags & CLIENT.MULTI_STATEMENTS) == (i in multi), i


def test_legacy_connection_sends_no_file_to_a_rogue_server(rogue):
    dsn = DSN.parse(f"mysql://reader@127.0.0.1:{rogue.port}/legacy", what="FARM_LEGACY_DSN")
    from loaders.migration.legacy import LegacyReader
    reader = LegacyReader(dsn)
    with pytest.raises(FarmError) as exc:
        reader.query("SELECT 1")
    reader.close()
    _assert_plain(rogue)
    msg = str(exc.value)
    assert "legacy (reader@127.0.0.1" in msg and "local file" in msg and "\n" not in msg
    with pytest.raises(FarmError) as exc:  # the schema and generator helpers' raw connection
        connect(dsn)  # refuses too, at its first statement (the session's time zone)
    assert "local file" in str(exc.value)
    _assert_plain(rogue)


def test_control_connection_sends_no_file_to_a_rogue_server(rogue):
    ledger = Ledger(DSN.parse(f"mysql://ctl@127.0.0.1:{rogue.port}/farm_control",
                              what="FARM_CONTROL_DSN"))
    with pytest.raises(DatabaseError) as exc:
        ledger.latest_run("migrate")
    ledger.close()
    _assert_plain(rogue)
    assert "control (ctl@127.0.0.1" in str(exc.value)


def _rogue_router(rogue: RogueServer, tmp_path) -> Router:
    doc = make_map_doc(rogue.port)
    path = tmp_path / "rogue-map.json"
    path.write_text(json.dumps(doc))
    return Router(ShardMapSource(path))


def test_shard_reads_send_no_file_but_the_writer_does(rogue, tmp_path):
    router = _rogue_router(rogue, tmp_path)
    host = router.shardmap.hosts["TestB1"]
    with pytest.raises(DatabaseError) as exc:
        router.query(host, "SELECT 1")
    assert "TestB1" in str(exc.value) and "local file" in str(exc.value)
    with pytest.raises(DatabaseError):
        router.run_mod(0, lambda cur: cur.execute("SELECT 1"), multi=True)
    from exporters.dump import snapshot
    with pytest.raises(DatabaseError), snapshot(host, SHARDS_A[0]):
        pass
    _assert_plain(rogue, multi=(1,))  # the mod writer's pool: multi-statements, no files
    # the control experiment: the shard writer's connections do send what a server asks for
    with router.connection(host, infile=True):
        pass
    # sent once for each statement the pool runs as it connects (wait_timeout, isolation)
    assert rogue.received == SECRET * 2 and rogue.flags[-1] & CLIENT.LOCAL_FILES
    router.close()


def test_plain_pooled_connections_refuse_load_data_and_multi_statements(router):
    shard = SHARDS_A[0]
    q = shard_table(shard, "user_has_pins")
    host = router.host_for(shard)
    with pytest.raises(DatabaseError):  # 1148/4166: LOCAL INFILE disabled on this connection
        router.run(shard, lambda cur: cur.execute(
            f"LOAD DATA LOCAL INFILE '/etc/hostname' INTO TABLE {q}"))
    with pytest.raises(DatabaseError), router.connection(host) as conn, conn.cursor() as cur:
        cur.execute("SELECT 1; SELECT 2")
    with router.connection(host, multi=True) as conn, conn.cursor() as cur:
        cur.execute("SELECT 1; SELECT 2")
        assert cur.fetchall() == ((1,),) and cur.nextset() and cur.fetchall() == ((2,),)


def test_no_connection_allows_both_files_and_multi_statements(router):
    """A statement smuggled into a batch must never be able to make the client send a file."""
    with pytest.raises(ValueError, match="not both"), \
            router.connection(router.host_for(SHARDS_A[0]), infile=True, multi=True):
        pass


@pytest.mark.parametrize("insert_rows", [1000, 0], ids=["pipelined", "infile"])
def test_the_writers_still_load_data(router, insert_rows, monkeypatch):
    from loaders.migration import writer
    from loaders.migration.build import TargetRows
    monkeypatch.setattr(writer, "INSERT_ROWS", insert_rows)
    shard, bucket = SHARDS_A[0], 3
    rows = TargetRows()
    rows.mappings[(shard, "pin_has_comments")] = [(4242, 4343, 7), (4242, 4344, 8)]
    rows.lookups[(bucket, "username_to_user")] = [("priv-test-user", 4242)]
    writer.write_shards(router, None, rows)
    writer.write_mod(router, rows)
    q = shard_table(shard, "pin_has_comments")
    got = router.run(shard, lambda cur: (cur.execute(
        f"SELECT to_id FROM {q} WHERE from_id = 4242 ORDER BY to_id"), cur.fetchall())[1])
    assert got == ((4343,), (4344,))
    router.run(shard, lambda cur: cur.execute(f"DELETE FROM {q} WHERE from_id = 4242"))
    m = mod_table(bucket, "username_to_user")
    router.run_mod(bucket, lambda cur: cur.execute(
        f"DELETE FROM {m} WHERE username = 'priv-test-user'"))


def test_host_from_dsn_carries_tls():
    dsn = DSN.parse("mysql://u:pw@db:3306/c?ssl_ca=/ca.pem", what="FARM_CONTROL_DSN")
    host = Host.from_dsn("control", dsn)
    assert host.tls_args() == {"ssl_ca": "/ca.pem", "ssl_verify_cert": True,
                               "ssl_verify_identity": True}
    assert "pw" not in repr(host) and "ca.pem" not in repr(host)
