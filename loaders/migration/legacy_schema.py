"""The legacy source schema the migration reads: six tables, keys enforced, no foreign keys
(so a row may reference one that does not exist), every column but the keys nullable."""

from __future__ import annotations

import pymysql

from shardfarm.mysql.connect import translate
from shardfarm.mysql.db import connect, ensure_database, where
from shardfarm.mysql.dsn import DSN

_OPTIONS = "ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"

LEGACY_DDL: dict[str, str] = {
    "users": """CREATE TABLE IF NOT EXISTS users (
        id BIGINT UNSIGNED NOT NULL PRIMARY KEY,
        username VARCHAR(64) NULL UNIQUE,
        email VARCHAR(255) NULL,
        full_name VARCHAR(255) NULL,
        created_at DATETIME NULL)""",
    "boards": """CREATE TABLE IF NOT EXISTS boards (
        id BIGINT UNSIGNED NOT NULL PRIMARY KEY,
        user_id BIGINT UNSIGNED NULL,
        name VARCHAR(255) NULL,
        description TEXT NULL,
        created_at DATETIME NULL)""",
    "pins": """CREATE TABLE IF NOT EXISTS pins (
        id BIGINT UNSIGNED NOT NULL PRIMARY KEY,
        user_id BIGINT UNSIGNED NULL,
        board_id BIGINT UNSIGNED NULL,
        details TEXT NULL,
        link VARCHAR(2048) NULL,
        image_url VARCHAR(2048) NULL,
        created_at DATETIME NULL)""",
    "comments": """CREATE TABLE IF NOT EXISTS comments (
        id BIGINT UNSIGNED NOT NULL PRIMARY KEY,
        pin_id BIGINT UNSIGNED NULL,
        user_id BIGINT UNSIGNED NULL,
        body TEXT NULL,
        created_at DATETIME NULL)""",
    "follows": """CREATE TABLE IF NOT EXISTS follows (
        user_id BIGINT UNSIGNED NOT NULL,
        board_id BIGINT UNSIGNED NOT NULL,
        created_at DATETIME NULL,
        PRIMARY KEY (user_id, board_id))""",
    "likes": """CREATE TABLE IF NOT EXISTS likes (
        user_id BIGINT UNSIGNED NOT NULL,
        pin_id BIGINT UNSIGNED NOT NULL,
        created_at DATETIME NULL,
        PRIMARY KEY (user_id, pin_id))""",
}

LEGACY_TABLES: tuple[str, ...] = tuple(LEGACY_DDL)

LEGACY_COLUMNS: dict[str, tuple[str, ...]] = {
    "users": ("id", "username", "email", "full_name", "created_at"),
    "boards": ("id", "user_id", "name", "description", "created_at"),
    "pins": ("id", "user_id", "board_id", "details", "link", "image_url", "created_at"),
    "comments": ("id", "pin_id", "user_id", "body", "created_at"),
    "follows": ("user_id", "board_id", "created_at"),
    "likes": ("user_id", "pin_id", "created_at"),
}


def create_legacy_schema(dsn: DSN, drop: bool = False) -> None:
    """Create the legacy database and its six tables; safe to run again.

    With ``drop=True`` the tables are dropped first, so they come back empty.
    """
    ensure_database(dsn)
    conn = connect(dsn)
    try:
        with conn.cursor() as cur:
            for table, ddl in LEGACY_DDL.items():
                if drop:
                    cur.execute(f"DROP TABLE IF EXISTS `{table}`")
                cur.execute(f"{ddl} {_OPTIONS}")
    except pymysql.MySQLError as exc:
        raise translate(exc, where(dsn)) from None
    finally:
        conn.close()
