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


def ensure_database(dsn: DSN) -> None:
    """Create the DSN's database if it does not exist."""
    conn = connect(dsn, database=False)
    try:
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE IF NOT EXISTS `{dsn.database}` CHARACTER SET utf8mb4")
    finally:
        conn.close()
