"""Who made the rows of a legacy database, and how many there are.

``generate`` records its data set (who asked for it, users, seed) in a one-row table
``farm_generated`` beside the six legacy tables, before it loads and again when it is
done, so ``farm demo`` can tell its own synthetic data from anyone else's and
``farm legacy generate`` can name what it would replace.
"""

from __future__ import annotations

import pymysql

from loaders.migration.legacy_schema import LEGACY_TABLES
from shardfarm.errors import ConfigError, FatalError
from shardfarm.mysql.db import connect, ensure_database
from shardfarm.mysql.dsn import DSN
from shardfarm.mysql.pool import translate

ORIGIN_TABLE = "farm_generated"
COUNT_CAP = 1_000_000  # rows counted per table at most: a real legacy table may be huge
# tables only the farm's own databases hold: a shard (``shard_state``), a mod bucket
# (``legacy_id_map``), either (``chunk_fences``), the control database (the rest)
FARM_TABLES = ("shard_state", "legacy_id_map", "chunk_fences", "sync_state", "export_parts")

_DDL = (f"CREATE TABLE IF NOT EXISTS `{ORIGIN_TABLE}` (id TINYINT PRIMARY KEY, "
        "made_by VARCHAR(64) NOT NULL, users INT NOT NULL, seed BIGINT NOT NULL, "
        "complete TINYINT(1) NOT NULL DEFAULT 0, "
        "made_at TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP) DEFAULT CHARSET=utf8mb4")


def where(dsn: DSN) -> str:
    """``database 'legacy' on 127.0.0.1:3306``: how messages name a database (no password)."""
    return f"database '{dsn.database}' on {dsn.host}:{dsn.port}"


def _query(dsn: DSN, sql: str, params: tuple = ()) -> list[tuple]:
    conn = connect(dsn, database=False)
    try:
        with conn.cursor() as cur:
            cur.execute(sql, params)
            return list(cur.fetchall())
    except pymysql.MySQLError as exc:
        raise translate(exc, f"{dsn.host}:{dsn.port}", None) from None
    finally:
        conn.close()


def legacy_rows(dsn: DSN) -> dict[str, int]:
    """Rows in each legacy table that exists (none when the database does not exist).

    Each count stops at ``COUNT_CAP``, so a huge real table costs a bounded read.
    """
    return database_rows(dsn, LEGACY_TABLES)


def database_rows(dsn: DSN, only: tuple[str, ...] | None = None) -> dict[str, int]:
    """Rows in each table of the DSN's database (of ``only``, in that order, if given), each
    counted up to ``COUNT_CAP``; empty when the database does not exist."""
    present = [t for (t,) in _query(
        dsn, "SELECT table_name FROM information_schema.tables WHERE table_schema = %s "
             "ORDER BY table_name", (dsn.database,)) if only is None or t in only]
    if not present:
        return {}
    db = dsn.database.replace("`", "``")
    sql = " UNION ALL ".join(f"SELECT '{t}', COUNT(*) FROM (SELECT 1 FROM `{db}`.`{t}` "
                             f"LIMIT {COUNT_CAP}) x" for t in present)
    counts = {t: int(n) for t, n in _query(dsn, sql)}
    return {t: counts[t] for t in (only or present) if t in counts}


def describe_rows(counts: dict[str, int]) -> str:
    """``1,234 rows (users 30, pins 1,204)``, with ``+`` where a count was capped."""
    total = sum(counts.values())
    capped = "+" if any(n >= COUNT_CAP for n in counts.values()) else ""
    parts = ", ".join(f"{t} {n:,}{'+' if n >= COUNT_CAP else ''}"
                      for t, n in counts.items() if n)
    return f"{total:,}{capped} row{'' if total == 1 and not capped else 's'} ({parts})"


def read_origin(dsn: DSN) -> dict | None:
    """The recorded data set ``{"made_by", "users", "seed", "complete"}``, or ``None``."""
    rows = _query(dsn, "SELECT COUNT(*) FROM information_schema.tables "
                       "WHERE table_schema = %s AND table_name = %s",
                  (dsn.database, ORIGIN_TABLE))
    if not rows[0][0]:
        return None
    db = dsn.database.replace("`", "``")
    got = _query(dsn, f"SELECT made_by, users, seed, complete "
                      f"FROM `{db}`.`{ORIGIN_TABLE}` WHERE id = 1")
    if not got:
        return None
    made_by, users, seed, complete = got[0]
    return {"made_by": made_by, "users": int(users), "seed": int(seed),
            "complete": bool(complete)}


def record_origin(dsn: DSN, made_by: str, users: int, seed: int, complete: bool) -> None:
    """Record (replace) who is generating the data set; ``complete`` once it has landed."""
    ensure_database(dsn)
    conn = connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(_DDL)
            cur.execute(f"REPLACE INTO `{ORIGIN_TABLE}` (id, made_by, users, seed, complete) "
                        "VALUES (1, %s, %s, %s, %s)", (made_by, users, seed, int(complete)))
    except pymysql.MySQLError as exc:
        raise translate(exc, f"{dsn.host}:{dsn.port}", None) from None
    finally:
        conn.close()


def refuse_to_replace(dsn: DSN,
                      what: str = "pass --replace to drop them and generate anew") -> None:
    """``FatalError`` naming the database, server and rows when the legacy tables hold rows."""
    counts = legacy_rows(dsn)
    if sum(counts.values()):
        raise FatalError(f"legacy {where(dsn)} holds {describe_rows(counts)}; {what}")


def refuse_farm_database(dsn: DSN) -> None:
    """``ConfigError`` when the DSN names one of the farm's own databases (a shard, a mod
    bucket, the control database): a shard's ``users``, ``boards``, ``pins`` and
    ``comments`` would be dropped and made legacy tables, ``--replace`` or not."""
    found = [t for (t,) in _query(
        dsn, "SELECT table_name FROM information_schema.tables WHERE table_schema = %s AND "
             f"table_name IN ({', '.join(['%s'] * len(FARM_TABLES))})",
        (dsn.database, *FARM_TABLES))]
    if found:
        raise ConfigError(f"{where(dsn)} is one of the farm's own databases (it holds "
                          f"{', '.join(sorted(found))}), not a legacy one: nothing was "
                          "generated; point FARM_LEGACY_DSN (or --legacy-dsn) at the legacy "
                          "database")
