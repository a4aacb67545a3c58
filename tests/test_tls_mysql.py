"""TLS to MySQL end to end: a private mariadbd that accepts only TLS, a CA and a server
certificate made here with ``openssl``; DSN and shard map TLS parameters are honoured,
verification catches the wrong CA and the wrong host name, in one line."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pymysql
import pytest

from farmcore import control_schema
from farmcore.ledger import Ledger
from loaders.migration import binlog
from loaders.migration.feed import Feed
from shardfarm.errors import PermanentDatabaseError
from shardfarm.mysql.db import connect, ensure_database
from shardfarm.mysql.dsn import DSN
from sharding.mapsource import ShardMapSource
from sharding.router import Router
from tests.servers import PrivateMariaDB


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def _ca(where: Path, name: str) -> tuple[Path, Path]:
    cert, key = where / f"{name}.pem", where / f"{name}.key"
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-keyout",
             str(key), "-out", str(cert), "-subj", f"/CN={name}")
    return cert, key


def _server_cert(where: Path, ca: tuple[Path, Path]) -> tuple[Path, Path]:
    cert, key, csr, ext = (where / "server.pem", where / "server.key", where / "server.csr",
                           where / "san.ext")
    ext.write_text("subjectAltName=IP:127.0.0.1\n")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr),
             "-subj", "/CN=127.0.0.1")
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]),
             "-CAcreateserial", "-out", str(cert), "-days", "1", "-extfile", str(ext))
    return cert, key


def _tls_alive(port: int, ca: Path) -> str | None:
    """``None`` when the server answers over TLS verified by ``ca``, else the reason."""
    try:
        pymysql.connect(host="127.0.0.1", port=port, user="root", connect_timeout=2,
                        ssl_ca=str(ca)).close()
        return None
    except pymysql.MySQLError as exc:
        return str(exc)


@pytest.fixture(scope="module")
def tls_server():
    """``(port, ca, other_ca)``: a mariadbd requiring TLS, the CA of its certificate and an
    unrelated CA."""
    base = Path(tempfile.mkdtemp(prefix="farm-tls-"))
    ca = _ca(base, "farm-test-ca")
    other = _ca(base, "other-ca")
    cert, key = _server_cert(base, ca)
    server = PrivateMariaDB.launch(
        {"innodb-buffer-pool-size": "32M", "ssl-ca": str(ca[0]), "ssl-cert": str(cert),
         "ssl-key": str(key), "require-secure-transport": "ON",
         "server-id": "1", "log-bin": "mariadb-bin", "binlog-format": "ROW"},  # farm sync
        prefix="farm-tls-", alive=lambda port: _tls_alive(port, ca[0]), timeout=30)
    yield server.port, ca[0], other[0]
    server.stop()
    shutil.rmtree(base, ignore_errors=True)


def _cipher(conn: pymysql.Connection) -> str:
    with conn.cursor() as cur:
        cur.execute("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
        return cur.fetchone()[1]


def _dsn(port: int, query: str, host: str = "127.0.0.1") -> DSN:
    return DSN.parse(f"mysql://root@{host}:{port}/mysql?{query}", what="FARM_LEGACY_DSN")


@pytest.mark.slow
def test_wrong_ca_is_refused_in_one_line_and_not_retried(tls_server):
    port, ca, other = tls_server
    conn = connect(_dsn(port, f"ssl_ca={ca}&ssl_verify=1"))
    assert _cipher(conn)  # the right CA: encrypted and verified
    conn.close()
    t0 = time.monotonic()
    with pytest.raises(PermanentDatabaseError) as exc:
        connect(_dsn(port, f"ssl_ca={other}&ssl_verify=1"))
    assert time.monotonic() - t0 < 5
    msg = str(exc.value)
    assert msg.startswith(f"TLS with MySQL legacy (root@127.0.0.1:{port}/mysql) failed")
    assert "certificate verify failed" in msg and "FARM_LEGACY_DSN" in msg and "\n" not in msg
    conn = connect(_dsn(port, f"ssl_ca={other}&ssl_verify=0"))  # encrypted, not verified
    assert _cipher(conn)
    conn.close()


def test_host_name_is_verified(tls_server):
    port, ca, _ = tls_server
    with pytest.raises(PermanentDatabaseError, match="Hostname mismatch"):
        connect(_dsn(port, f"ssl_ca={ca}&ssl_verify=1", host="localhost"))


def _tls_router(port: int, ca: Path, tmp_path: Path) -> Router:
    host = {"host": "127.0.0.1", "port": port, "user": "root", "password": "",
            "ssl_ca": str(ca), "ssl_verify": 1}
    doc = {"version": 1, "hosts": {"TlsA": host},
           "shards": [{"range": [0, 0], "master": "TlsA", "slave": "TlsA"}],
           "mod": {"buckets": 1, "ranges": [{"range": [0, 0], "master": "TlsA",
                                             "slave": "TlsA"}]}}
    path = tmp_path / f"tls-map-{ca.stem}.json"
    path.write_text(json.dumps(doc))
    return Router(ShardMapSource(path))


def test_shard_map_host_over_verified_tls(tls_server, tmp_path):
    port, ca, other = tls_server
    router = _tls_router(port, ca, tmp_path)
    rows = router.query(router.shardmap.hosts["TlsA"], "SHOW SESSION STATUS LIKE 'Ssl_cipher'")
    assert rows[0][1]
    router.close()
    router = _tls_router(port, other, tmp_path)
    with pytest.raises(PermanentDatabaseError, match="TLS with MySQL TlsA"):
        router.query(router.shardmap.hosts["TlsA"], "SELECT 1")
    router.close()


def test_control_database_over_verified_tls(tls_server):
    """The ledger's pool (control database) honours FARM_CONTROL_DSN's TLS parameters."""
    port, ca, other = tls_server
    good = DSN.parse(f"mysql://root@127.0.0.1:{port}/farm_control_tls?ssl_ca={ca}",
                     what="FARM_CONTROL_DSN")
    ensure_database(good)
    control_schema.ensure(good)
    ledger = Ledger(good)
    try:
        assert ledger.runs() == []
        with ledger.pool.connection() as conn:
            assert _cipher(conn)
    finally:
        ledger.close()
    bad = DSN.parse(f"mysql://root@127.0.0.1:{port}/farm_control_tls?ssl_ca={other}",
                    what="FARM_CONTROL_DSN")
    ledger = Ledger(bad)
    try:
        with pytest.raises(PermanentDatabaseError, match="certificate verify failed"):
            ledger.runs()
    finally:
        ledger.close()


def test_connections_without_tls_settings_share_one_preferred_context(tls_server):
    """No TLS asked for: PyMySQL's PREFERRED mode (encrypted when the server offers it,
    unverified) with one TLS context shared by every such connection, not one built (the
    system's CA store loaded) per connection; asking for TLS still builds its own, verified."""
    import ssl

    from shardfarm.mysql.connect import Where, open_connection
    from shardfarm.mysql.dsn import tls_args
    port, ca, _ = tls_server
    where = Where("mysql", "127.0.0.1", port, "root")
    conns = [open_connection(where, ""), open_connection(where, ""),
             open_connection(where, "", tls=tls_args({"ssl_ca": str(ca)}))]
    try:
        plain, again, verified = conns
        assert plain.ctx is again.ctx and verified.ctx is not plain.ctx
        assert plain.ctx.verify_mode == ssl.CERT_NONE
        assert verified.ctx.verify_mode == ssl.CERT_REQUIRED
        assert _cipher(plain) and _cipher(verified)  # both encrypted
    finally:
        for c in conns:
            c.close()


def test_sync_follows_the_binlog_over_verified_tls(tls_server):
    """``farm sync``'s binlog stream keeps the DSN's TLS settings: the server's certificate is
    verified (without them, PyMySQL's opportunistic TLS took any certificate)."""
    port, ca, other = tls_server
    wrong = _dsn(port, f"ssl_ca={other}&ssl_verify=1")
    with pytest.raises(pymysql.err.OperationalError, match="certificate verify failed"):
        next(binlog.stream(wrong, "", {"users": ("id",)}, heartbeat=0.5))
    feed = Feed(wrong, "")  # farm sync's reader process: one line, not retried
    try:
        with pytest.raises(PermanentDatabaseError) as exc:
            feed.take(_Keys(), 10)
    finally:
        feed.close()
    assert "certificate verify failed" in str(exc.value) and "\n" not in str(exc.value)
    assert f"legacy (root@127.0.0.1:{port}/mysql)" in str(exc.value)
    assert "FARM_LEGACY_DSN" in str(exc.value)
    conn = pymysql.connect(host="127.0.0.1", port=port, user="root", ssl_ca=str(ca),
                           autocommit=True)
    with conn.cursor() as cur:
        cur.execute("CREATE DATABASE IF NOT EXISTS tls_legacy")
        cur.execute("CREATE TABLE IF NOT EXISTS tls_legacy.users (id BIGINT UNSIGNED PRIMARY "
                    "KEY, username VARCHAR(64) NULL, email VARCHAR(255) NULL, full_name "
                    "VARCHAR(255) NULL, created_at DATETIME NULL)")
        cur.execute("SELECT @@gtid_binlog_pos")
        start = cur.fetchone()[0]
        cur.execute("INSERT INTO tls_legacy.users VALUES (7, 'ana', NULL, NULL, NULL)")
    dsn = DSN.parse(f"mysql://root@127.0.0.1:{port}/tls_legacy?ssl_ca={ca}&ssl_verify=1")
    got = []
    try:
        for item in binlog.stream(dsn, start, {"users": ("id", "username")}, heartbeat=0.5):
            if isinstance(item, binlog.Mark):
                if item.idle:
                    break
                continue
            got.append(item.after)
    finally:
        with conn.cursor() as cur:
            cur.execute("DROP DATABASE tls_legacy")
        conn.close()
    assert got == [{"id": 7, "username": "ana"}]


class _Keys:
    """A batch that only counts (``Feed.take``'s argument)."""

    def __init__(self) -> None:
        self.n = 0

    def add(self, table: str, before: dict | None, after: dict | None) -> None:
        self.n += 1

    def rows(self) -> int:
        return self.n
