"""Plain connections to the single-server databases: control and legacy (not the shards).

They never allow ``LOAD DATA LOCAL INFILE`` nor multi-statements unless the caller
asks (``infile=True``: only the synthetic legacy generator, which loads files it
wrote itself); see ``shardfarm.mysql.connect``.
"""

from __future__ import annotations

import pymysql

from shardfarm.mysql.connect import Where, open_connection, translate
from shardfarm.mysql.dsn import DSN


def where(dsn: DSN, database: bool = True) -> Where:
    """How errors name this DSN's connection: ``legacy (root@h:3306/legacy)``."""
    return Where(dsn.name, dsn.host, dsn.port, dsn.user, dsn.database if database else None)


def connect(dsn: DSN, *, database: bool = True, infile: bool = False,
            **extra: object) -> pymysql.Connection:
    """Connect to ``dsn`` (utf8mb4, autocommit, TLS as the DSN says) within
    FARM_CONNECT_TIMEOUT; errors name the connection, never the password."""
    return open_connection(where(dsn, database), dsn.password, tls=dsn.tls_args(),
                           infile=infile, autocommit=True, **extra)


def _on_server(dsn: DSN, sql: str, params: tuple = ()) -> list[tuple]:
    """Run one statement on the DSN's server, outside any database; its rows."""
    conn = connect(dsn, database=False)
    try:
        with conn.cursor() as cur:
            cur.execute(sql, params)
            return list(cur.fetchall())
    except pymysql.MySQLError as exc:
        raise translate(exc, where(dsn, False)) from None
    finally:
        conn.close()


def database_exists(dsn: DSN) -> bool:
    """Whether the DSN's database exists on its server."""
    (n,), = _on_server(dsn, "SELECT COUNT(*) FROM information_schema.schemata "
                            "WHERE schema_name = %s", (dsn.database,))
    return bool(n)


def ensure_database(dsn: DSN) -> None:
    """Create the DSN's database if it does not exist."""
    _on_server(dsn, f"CREATE DATABASE IF NOT EXISTS `{dsn.database}` CHARACTER SET utf8mb4")


def drop_database(dsn: DSN) -> None:
    """Drop the DSN's database if it exists (``farm demo --clean``, tests)."""
    _on_server(dsn, f"DROP DATABASE IF EXISTS `{dsn.database}`")
