"""What the independent migration checker (``tests.contract_checker``) knows of
CONTRACTS.md: the legacy tables and which of their rows must migrate (§6), the object and
mapping tables (§3-§5), the ID layout (§4), and how it compares values and reports
problems.

Like the checker, it imports nothing from the project: only the standard library and
PyMySQL.
"""

from __future__ import annotations

import calendar
import datetime as dt
import hashlib
from collections import defaultdict
from typing import Any

import pymysql

TYPE_IDS = {"pin": 1, "board": 2, "user": 3, "comment": 4}
OBJECT_TABLES = {"user": "users", "board": "boards", "pin": "pins", "comment": "comments"}
LEGACY_COLUMNS = {
    "users": ("id", "username", "email", "full_name", "created_at"),
    "boards": ("id", "user_id", "name", "description", "created_at"),
    "pins": ("id", "user_id", "board_id", "details", "link", "image_url", "created_at"),
    "comments": ("id", "pin_id", "user_id", "body", "created_at"),
    "follows": ("user_id", "board_id", "created_at"),
    "likes": ("user_id", "pin_id", "created_at"),
}
# Object type -> legacy table; fields copied verbatim; references (data key, type, legacy column).
OBJECT_SPECS = {
    "user": ("users", ("username", "email", "full_name"), ()),
    "board": ("boards", ("name", "description"), (("user_id", "user", "user_id"),)),
    "pin": ("pins", ("details", "link", "image_url"),
            (("user_id", "user", "user_id"), ("board_id", "board", "board_id"))),
    "comment": ("comments", ("body",),
                (("pin_id", "pin", "pin_id"), ("user_id", "user", "user_id"))),
}
# Forward mapping table -> (legacy table, (from type, from column), (to type, to column)).
FORWARD = {
    "user_has_boards": ("boards", ("user", "user_id"), ("board", "id")),
    "user_has_pins": ("pins", ("user", "user_id"), ("pin", "id")),
    "board_has_pins": ("pins", ("board", "board_id"), ("pin", "id")),
    "user_follows_boards": ("follows", ("user", "user_id"), ("board", "board_id")),
    "user_likes_pins": ("likes", ("user", "user_id"), ("pin", "pin_id")),
    "pin_has_comments": ("comments", ("pin", "pin_id"), ("comment", "id")),
}
REVERSE = {"pin_owned_by_board": "board_has_pins",
           "board_followedby_users": "user_follows_boards",
           "pin_liked_by_users": "user_likes_pins"}
HOTSPOT_TABLE = "board_followedby_user_shard"
MOD_TABLES = ("legacy_id_map", "username_to_user", "email_to_user")
LOCAL_BITS = 36
ALLOCATED = 1 << 35  # local IDs from here up are the shard's to allocate (CONTRACTS §4)
BATCH = 200
ABSENT = "<absent>"

Key = Any  # legacy key: int id, or (user_id, other_id) for follows/likes
Edges = dict[tuple[int, int], int]


# ---------------------------------------------------------------- problems


class Problems:
    """Problems grouped by category, keeping at most ``cap`` examples of each."""

    def __init__(self, cap: int = 20) -> None:
        self.cap = cap
        self.examples: dict[str, list[str]] = {}
        self.counts: dict[str, int] = defaultdict(int)

    def add(self, category: str, message: str) -> None:
        """Record one problem."""
        self.counts[category] += 1
        examples = self.examples.setdefault(category, [])
        if len(examples) < self.cap:
            examples.append(f"{category}: {message}")

    def lines(self) -> list[str]:
        """The examples, then one summary line per category that was cut short."""
        out: list[str] = []
        for category, examples in self.examples.items():
            out.extend(examples)
            if self.counts[category] > len(examples):
                out.append(f"{category}: {self.counts[category]} problems in all "
                           f"({self.counts[category] - len(examples)} not shown)")
        return out


# ---------------------------------------------------------------- ids and values


def bucket_of(key: str, buckets: int) -> int:
    """CONTRACTS §4 mod bucket of a key."""
    return int(hashlib.md5(key.encode("utf-8")).hexdigest(), 16) % buckets


def decode(new_id: int) -> tuple[int, int, int] | None:
    """``(shard, type, local)`` of a 64-bit ID, or ``None`` when malformed."""
    if not isinstance(new_id, int) or new_id < 0 or new_id >> 62:
        return None
    local = new_id & ((1 << LOCAL_BITS) - 1)
    if local < 1:
        return None
    return (new_id >> 46) & 0xFFFF, (new_id >> 36) & 0x3FF, local


def shard_of(new_id: int) -> int:
    """Shard part of a 64-bit ID."""
    return (new_id >> 46) & 0xFFFF


def as_datetime(value: Any) -> dt.datetime | None:
    """A legacy DATETIME as a datetime; ``None`` for NULL, zero or invalid dates."""
    if isinstance(value, dt.datetime):
        return value
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str) and not value.startswith("0000"):
        try:
            return dt.datetime.fromisoformat(value)
        except ValueError:
            return None
    return None


def iso(value: dt.datetime) -> str:
    """ISO-8601 UTC with a Z, seconds precision."""
    return (f"{value.year:04d}-{value.month:02d}-{value.day:02d}T"
            f"{value.hour:02d}:{value.minute:02d}:{value.second:02d}Z")


def unix(value: dt.datetime) -> int:
    """Unix seconds of a naive UTC datetime."""
    return calendar.timegm(value.timetuple())


def text(value: Any) -> Any:
    """Bytes from the driver as str; everything else unchanged."""
    return value.decode("utf-8") if isinstance(value, bytes | bytearray) else value


def strictly_equal(a: Any, b: Any) -> bool:
    """Equality that also requires equal types (so 1 != 1.0 != True and "1" != 1)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(strictly_equal(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(map(strictly_equal, a, b))
    return a == b


def short(value: Any, limit: int = 120) -> str:
    """A repr cut to ``limit`` characters."""
    r = repr(value)
    return r if len(r) <= limit else r[:limit] + "..."


# ---------------------------------------------------------------- legacy side


def read_legacy(legacy: dict) -> dict[str, list[dict]]:
    """Every legacy table fully in memory, rows as dicts keyed by column name."""
    conn = pymysql.connect(**{"charset": "utf8mb4", **legacy})
    try:
        out = {}
        with conn.cursor() as cur:
            for table, cols in LEGACY_COLUMNS.items():
                cur.execute(f"SELECT {', '.join(cols)} FROM `{table}`")
                out[table] = [{c: text(v) for c, v in zip(cols, row, strict=True)}
                              for row in cur.fetchall()]
        return out
    finally:
        conn.close()


def row_key(table: str, row: dict) -> Key:
    """The legacy key: the id, or ``(user_id, board_id|pin_id)`` for follows/likes."""
    if table == "follows":
        return row["user_id"], row["board_id"]
    if table == "likes":
        return row["user_id"], row["pin_id"]
    return row["id"]


def migrated(src: dict[str, list[dict]]) -> dict[str, set]:
    """Per legacy table, the keys of the rows a migration must load (CONTRACTS §6)."""
    ok: dict[str, set] = {}
    needs = {"users": (), "boards": (("user_id", "users"),),
             "pins": (("user_id", "users"), ("board_id", "boards")),
             "comments": (("pin_id", "pins"), ("user_id", "users")),
             "follows": (("user_id", "users"), ("board_id", "boards")),
             "likes": (("user_id", "users"), ("pin_id", "pins"))}
    for table, refs in needs.items():  # dependency order: references are decided first
        ok[table] = {row_key(table, r) for r in src[table]
                     if as_datetime(r["created_at"]) is not None
                     and (table != "users" or r["username"] is not None)
                     and all(r[col] in ok[ref] for col, ref in refs)}
    return ok
