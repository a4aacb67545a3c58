"""Every table of a shard database and a mod bucket database, declared in one place.

A new mapping table is one line in ``MAPPING_TABLES``. Database and table names
used in SQL come only from this vocabulary and are checked against a pattern.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sharding.ids import TYPES

OBJECT_TABLES: dict[str, int] = {"users": TYPES["user"], "boards": TYPES["board"],
                                 "pins": TYPES["pin"], "comments": TYPES["comment"]}
TABLE_OF_TYPE: dict[int, str] = {t: name for name, t in OBJECT_TABLES.items()}


@dataclass(frozen=True)
class MappingTable:
    """A one-directional mapping ``from -> to`` stored on the shard of ``from_id``."""

    name: str
    from_type: int
    to_type: int
    reverse_of: str | None = None


_M = MappingTable
MAPPING_TABLES: dict[str, MappingTable] = {m.name: m for m in [
    _M("user_has_boards", TYPES["user"], TYPES["board"]),
    _M("user_has_pins", TYPES["user"], TYPES["pin"]),
    _M("board_has_pins", TYPES["board"], TYPES["pin"]),
    _M("user_follows_boards", TYPES["user"], TYPES["board"]),
    _M("user_likes_pins", TYPES["user"], TYPES["pin"]),
    _M("pin_has_comments", TYPES["pin"], TYPES["comment"]),
    _M("pin_owned_by_board", TYPES["pin"], TYPES["board"], reverse_of="board_has_pins"),
    _M("board_followedby_users", TYPES["board"], TYPES["user"], reverse_of="user_follows_boards"),
    _M("pin_liked_by_users", TYPES["pin"], TYPES["user"], reverse_of="user_likes_pins"),
]}

# Local IDs below 2**35 are legacy IDs; the shard allocates from ids.FIRST_ALLOCATED = 2**35 up.
_OBJECT_DDL = """CREATE TABLE IF NOT EXISTS {q} (
  local_id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
  data JSON NOT NULL,
  active TINYINT(1) NOT NULL DEFAULT 1
) ENGINE=InnoDB AUTO_INCREMENT=34359738368 DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"""

_MAPPING_DDL = """CREATE TABLE IF NOT EXISTS {q} (
  from_id BIGINT UNSIGNED NOT NULL,
  to_id BIGINT UNSIGNED NOT NULL,
  sequence BIGINT NOT NULL,
  PRIMARY KEY (from_id, to_id),
  KEY by_sequence (from_id, sequence, to_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"""

# Hotspot directory: which shards hold a hot board's follower rows, and the rebalance state.
DIRECTORY_TABLES: dict[str, str] = {
    "board_followedby_user_shard": """CREATE TABLE IF NOT EXISTS {q} (
  board_id BIGINT UNSIGNED NOT NULL,
  shard INT NOT NULL,
  state VARCHAR(16) NOT NULL DEFAULT 'planned',
  row_count BIGINT NOT NULL DEFAULT 0,
  updated_at TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP,
  PRIMARY KEY (board_id, shard)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"""}

_FENCES_DDL = """CREATE TABLE IF NOT EXISTS {q} (
  run_id VARCHAR(40) NOT NULL,
  chunk_id INT NOT NULL,
  fence BIGINT NOT NULL,
  PRIMARY KEY (run_id, chunk_id)
) ENGINE=InnoDB DEFAULT CHARSET=ascii"""

# Farm bookkeeping on every shard: the highest fencing token seen per chunk (see fencing.py).
FARM_TABLES: dict[str, str] = {"chunk_fences": _FENCES_DDL,
    # The shard map version that last placed (moved) this shard, and the move's write freeze.
    "shard_state": """CREATE TABLE IF NOT EXISTS {q} (
  id TINYINT UNSIGNED NOT NULL PRIMARY KEY,
  map_version BIGINT NOT NULL DEFAULT 0,
  frozen TINYINT(1) NOT NULL DEFAULT 0,
  updated_at TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP
) ENGINE=InnoDB DEFAULT CHARSET=ascii"""}

# Mod-shard lookups. Keys compare byte-wise (utf8mb4_bin): "josé" and "jose" are different users.
# A key holds at most LOOKUP_KEY_CHARS characters; str.lower() may lengthen a value ("İ" becomes
# two characters), so a legacy value that fits its column may not fit here (verdicts.py).
LOOKUP_KEY_CHARS = 255
MOD_TABLES: dict[str, str] = {
    "legacy_id_map": """CREATE TABLE IF NOT EXISTS {q} (
  type_id SMALLINT UNSIGNED NOT NULL,
  legacy_id BIGINT UNSIGNED NOT NULL,
  new_id BIGINT UNSIGNED NOT NULL,
  PRIMARY KEY (type_id, legacy_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4""",
    "username_to_user": f"""CREATE TABLE IF NOT EXISTS {{q}} (
  username VARCHAR({LOOKUP_KEY_CHARS}) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL
    PRIMARY KEY,
  user_id BIGINT UNSIGNED NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4""",
    "email_to_user": f"""CREATE TABLE IF NOT EXISTS {{q}} (
  email VARCHAR({LOOKUP_KEY_CHARS}) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL
    PRIMARY KEY,
  user_id BIGINT UNSIGNED NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4""",
}

# Farm bookkeeping in every mod bucket database: the fences of the writes to the mod buckets
# of a range of the map, kept in its first bucket's (see fencing.py, ``mod_home``).
MOD_FARM_TABLES: dict[str, str] = {"chunk_fences": _FENCES_DDL}

SHARD_TABLES: frozenset[str] = frozenset(
    [*OBJECT_TABLES, *MAPPING_TABLES, *DIRECTORY_TABLES, *FARM_TABLES])
_DB_NAME = re.compile(r"^(db|mod)\d{5}$")
_TABLE_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


def shard_db(shard: int) -> str:
    """Database name of a logical shard: ``db00042``."""
    return f"db{shard:05d}"


def mod_db(bucket: int) -> str:
    """Database name of a mod bucket: ``mod00042``."""
    return f"mod{bucket:05d}"


def qualified(db: str, table: str) -> str:
    """A quoted ``db.table`` after checking both names against the vocabulary."""
    if not _DB_NAME.match(db):
        raise ValueError(f"invalid database name {db!r}")
    known = SHARD_TABLES if db.startswith("db") else MOD_TABLES.keys() | MOD_FARM_TABLES
    if table not in known or not _TABLE_NAME.match(table):
        raise ValueError(f"unknown table {table!r} for database {db!r}")
    return f"`{db}`.`{table}`"


def shard_table(shard: int, table: str) -> str:
    """Quoted ``dbNNNNN.table`` of a shard."""
    return qualified(shard_db(shard), table)


def mod_table(bucket: int, table: str) -> str:
    """Quoted ``modNNNNN.table`` of a mod bucket."""
    return qualified(mod_db(bucket), table)


def shard_ddl(shard: int) -> list[str]:
    """Statements that create one shard database and all its tables (idempotent)."""
    db = shard_db(shard)
    out = [f"CREATE DATABASE IF NOT EXISTS `{db}` CHARACTER SET utf8mb4"]
    out += [_OBJECT_DDL.format(q=qualified(db, t)) for t in OBJECT_TABLES]
    out += [_MAPPING_DDL.format(q=qualified(db, t)) for t in MAPPING_TABLES]
    out += [ddl.format(q=qualified(db, t)) for t, ddl in DIRECTORY_TABLES.items()]
    out += [ddl.format(q=qualified(db, t)) for t, ddl in FARM_TABLES.items()]
    return out


def mod_ddl(bucket: int) -> list[str]:
    """Statements that create one mod bucket database, its lookup tables and its fences
    (idempotent)."""
    db = mod_db(bucket)
    out = [f"CREATE DATABASE IF NOT EXISTS `{db}` CHARACTER SET utf8mb4"]
    out += [ddl.format(q=qualified(db, t))
            for t, ddl in [*MOD_TABLES.items(), *MOD_FARM_TABLES.items()]]
    return out
