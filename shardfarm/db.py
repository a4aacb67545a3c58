"""Plain connections to the single-server databases: control and legacy (not the shards)."""

from __future__ import annotations

import pymysql

from shardfarm.dsn import DSN
from sharding.pool import translate


def connect(dsn: DSN, *, database: bool = True, **extra: object) -> pymysql.Connection:
    """Connect to ``dsn`` (utf8mb4, autocommit); errors name the server, never the password."""
    try:
        return pymysql.connect(charset="utf8mb4", autocommit=True, connect_timeout=5,
                               local_infile=True,
                               database=dsn.database if database else None,
                               **dsn.connect_args(), **extra)
    except pymysql.MySQLError as exc:
        raise translate(exc, f"{dsn.host}:{dsn.port}", None) from None


def _on_server(dsn: DSN, sql: str) -> None:
    """Run one statement on the DSN's server, outside any database."""
    conn = connect(dsn, database=False)
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
    finally:
        conn.close()


def ensure_database(dsn: DSN) -> None:
    """Create the DSN's database if it does not exist."""
    _on_server(dsn, f"CREATE DATABASE IF NOT EXISTS `{dsn.database}` CHARACTER SET utf8mb4")


def drop_database(dsn: DSN) -> None:
    """Drop the DSN's database if it exists (``farm demo --clean``, tests)."""
    _on_server(dsn, f"DROP DATABASE IF EXISTS `{dsn.database}`")
