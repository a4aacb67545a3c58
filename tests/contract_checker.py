"""An independent checker of a finished migration, written from CONTRACTS.md alone.

It deliberately imports nothing from the project (no ``loaders``, ``jobs``, ``workers``,
``scripts``, ``sharding`` or ``shardfarm``): only the standard library, PyMySQL and its own
``tests.contract_model``. It reads the legacy tables into memory, decides on its own which
rows must have been migrated (CONTRACTS §6), and compares the sharded target (§3-§5) with
that expectation.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

import pymysql

from tests.contract_model import (
    ABSENT,
    ALLOCATED,
    BATCH,
    FORWARD,
    HOTSPOT_TABLE,
    LEGACY_COLUMNS,
    OBJECT_SPECS,
    OBJECT_TABLES,
    REVERSE,
    TYPE_IDS,
    Edges,
    Key,
    Problems,
    as_datetime,
    bucket_of,
    decode,
    iso,
    migrated,
    read_legacy,
    row_key,
    shard_of,
    short,
    strictly_equal,
    text,
    unix,
)

# ---------------------------------------------------------------- target side


class Target:
    """Read-only access to the masters of a shard map, one connection per server."""

    def __init__(self, shardmap: dict) -> None:
        self.hosts = shardmap["hosts"]
        self.shard_host = {s: r["master"] for r in shardmap["shards"]
                           for s in range(r["range"][0], r["range"][1] + 1)}
        self.open = {s for lo, hi in shardmap.get("open", []) for s in range(lo, hi + 1)}
        self.buckets = int(shardmap["mod"]["buckets"])
        self.bucket_host = {b: r["master"] for r in shardmap["mod"]["ranges"]
                            for b in range(r["range"][0], r["range"][1] + 1)}
        self.conns: dict[tuple, pymysql.connections.Connection] = {}
        self.tables: dict[tuple, set[tuple[str, str]]] = {}

    def server(self, host_name: str) -> tuple:
        """Identity of the server behind a host name."""
        h = self.hosts[host_name]
        return h["host"], int(h.get("port", 3306)), h.get("user", "root"), h.get("password", "")

    def conn(self, server: tuple) -> pymysql.connections.Connection:
        """The (cached) connection to one server; also learns its tables."""
        if server not in self.conns:
            host, port, user, password = server
            c = pymysql.connect(host=host, port=port, user=user, password=password,
                                charset="utf8mb4", autocommit=True)
            self.conns[server] = c
            with c.cursor() as cur:
                cur.execute("SELECT table_schema, table_name FROM information_schema.tables "
                            "WHERE table_schema LIKE 'db%' OR table_schema LIKE 'mod%'")
                self.tables[server] = {(s, t) for s, t in cur.fetchall()}
        return self.conns[server]

    def fetch(self, kind: str, table: str, cols: str, probs: Problems | None) -> list[tuple]:
        """Rows ``(number, *cols)`` of ``table`` in every shard (kind ``db``) or bucket (``mod``).

        Databases lacking the table are reported under ``schema`` when ``probs`` is given
        and skipped otherwise.
        """
        placement = self.shard_host if kind == "db" else self.bucket_host
        by_server: dict[tuple, list[tuple[int, str]]] = defaultdict(list)
        for number, host_name in sorted(placement.items()):
            by_server[self.server(host_name)].append((number, f"{kind}{number:05d}"))
        rows: list[tuple] = []
        for server, dbs in by_server.items():
            conn = self.conn(server)
            present = [(n, d) for n, d in dbs if (d, table) in self.tables[server]]
            if probs is not None and len(present) < len(dbs):
                missing = sorted(set(dbs) - set(present))
                probs.add("schema", f"table {table} missing in {len(missing)} databases on "
                                    f"{server[0]}:{server[1]}, e.g. {missing[0][1]}")
            for i in range(0, len(present), BATCH):
                sql = " UNION ALL ".join(f"SELECT {n}, {cols} FROM `{d}`.`{table}`"
                                         for n, d in present[i:i + BATCH])
                with conn.cursor() as cur:
                    cur.execute(sql)
                    rows.extend(tuple(text(v) for v in r) for r in cur.fetchall())
        return rows

    def close(self) -> None:
        """Close every connection."""
        for c in self.conns.values():
            c.close()


# ---------------------------------------------------------------- checks


def check_id_map(target: Target, ok: dict[str, set], probs: Problems) -> dict[tuple, int]:
    """Check 1: ``legacy_id_map``; returns ``(type_name, legacy_id) -> new_id``."""
    names = {v: k for k, v in TYPE_IDS.items()}
    found: dict[tuple, list[tuple[int, int]]] = defaultdict(list)
    for bucket, type_id, legacy_id, new_id in target.fetch(
            "mod", "legacy_id_map", "type_id, legacy_id, new_id", probs):
        found[(names.get(type_id, f"type{type_id}"), legacy_id)].append((bucket, new_id))
    ids: dict[tuple, int] = {}
    for (name, legacy_id), rows in found.items():
        if name not in TYPE_IDS or legacy_id not in ok[OBJECT_TABLES[name]]:
            probs.add("id map extra", f"row for non-migrated {name}:{legacy_id} {rows}")
    owners: dict[int, tuple] = {}
    for name, table in OBJECT_TABLES.items():
        for legacy_id in sorted(ok[table]):
            new_id = check_id_row(target, name, legacy_id, found.get((name, legacy_id), []),
                                  probs)
            if new_id is None:
                continue
            if new_id in owners:
                probs.add("id map", f"{name}:{legacy_id} and {owners[new_id]} share id {new_id}")
            owners[new_id] = (name, legacy_id)
            ids[(name, legacy_id)] = new_id
    return ids


def check_id_row(target: Target, name: str, legacy_id: int, rows: list[tuple[int, int]],
                 probs: Problems) -> int | None:
    """Check the id-map rows of one migrated object; its new id when usable."""
    key = f"{name}:{legacy_id}"
    if len(rows) != 1:
        probs.add("id map", f"{key} has {len(rows)} rows (want 1): {rows}")
        if not rows:
            return None
    bucket, new_id = rows[0]
    want_bucket = bucket_of(key, target.buckets)
    if bucket != want_bucket:
        probs.add("id map", f"{key} in bucket {bucket}, want {want_bucket}")
    parts = decode(new_id)
    if parts is None:
        probs.add("id map", f"{key} -> malformed id {new_id}")
        return None
    shard, type_id, local = parts
    if type_id != TYPE_IDS[name]:
        probs.add("id map", f"{key} -> id {new_id} has type {type_id}")
        return None
    if shard not in target.shard_host:
        probs.add("id map", f"{key} -> id {new_id} on shard {shard} not in the shard map")
        return None
    if 0 < legacy_id < ALLOCATED and local != legacy_id:
        probs.add("id map", f"{key} -> id {new_id} has local {local}, want {legacy_id}")
    if not 0 < legacy_id < ALLOCATED and local < ALLOCATED:
        probs.add("id map", f"{key} -> id {new_id} has local {local}, want one allocated "
                            f"from {ALLOCATED} up")
    return new_id


def check_placement(target: Target, src: dict, ok: dict, ids: dict, probs: Problems) -> None:
    """Check 2: users on open shards, everything else beside what it belongs to."""
    for legacy_id in ok["users"]:
        new_id = ids.get(("user", legacy_id))
        if new_id is not None and shard_of(new_id) not in target.open:
            probs.add("placement", f"user:{legacy_id} on shard {shard_of(new_id)}, not open")
    rules = (("board", "boards", "user", "user_id"), ("pin", "pins", "board", "board_id"),
             ("comment", "comments", "pin", "pin_id"))
    for name, table, parent, col in rules:
        for row in src[table]:
            child = ids.get((name, row["id"]))
            owner = ids.get((parent, row[col]))
            if row["id"] in ok[table] and child is not None and owner is not None \
                    and shard_of(child) != shard_of(owner):
                probs.add("placement", f"{name}:{row['id']} on shard {shard_of(child)}, its "
                                       f"{parent}:{row[col]} on shard {shard_of(owner)}")


def expected_data(name: str, row: dict, ids: dict) -> dict | None:
    """The ``data`` document CONTRACTS §5 prescribes, or ``None`` if a reference is unknown."""
    _table, fields, refs = OBJECT_SPECS[name]
    doc: dict[str, Any] = {"legacy_id": row["id"]}
    doc.update({f: row[f] for f in fields})
    for key, ref_type, col in refs:
        new_id = ids.get((ref_type, row[col]))
        if new_id is None:
            return None
        doc[key] = new_id
    doc["created_at"] = iso(as_datetime(row["created_at"]))
    return doc


def check_objects(target: Target, src: dict, ok: dict, ids: dict, probs: Problems) -> None:
    """Check 3: object rows exist, are active and hold exactly the prescribed data."""
    for name, (table, _fields, _refs) in OBJECT_SPECS.items():
        stored = {(s, local): (data, active) for s, local, data, active
                  in target.fetch("db", table, "local_id, data, active", probs)}
        expected_at = set()
        for row in src[table]:
            new_id = ids.get((name, row["id"]))
            if row["id"] not in ok[table] or new_id is None:
                continue
            shard, _type, local = decode(new_id)
            expected_at.add((shard, local))
            check_object_row(f"{name}:{row['id']}", stored.get((shard, local)),
                             expected_data(name, row, ids), probs)
        active = [loc for loc, (_d, a) in stored.items() if a == 1]
        if len(active) != len(ok[table]):
            probs.add("objects", f"{table}: {len(active)} active rows, "
                                 f"{len(ok[table])} migrated legacy rows")
        for shard, local in sorted(set(active) - expected_at):
            probs.add("objects extra", f"{table} row {local} on shard {shard} is unexpected")


def check_object_row(label: str, stored: tuple | None, want: dict | None,
                     probs: Problems) -> None:
    """Compare one stored object row with its expected data."""
    if stored is None:
        probs.add("objects", f"{label}: no row")
        return
    data, active = stored
    if active != 1:
        probs.add("objects", f"{label}: active={active}")
    if want is None:
        return
    try:
        got = json.loads(data)
    except (TypeError, ValueError):
        probs.add("objects", f"{label}: data is not JSON: {short(data)}")
        return
    if not strictly_equal(got, want):
        if not isinstance(got, dict):
            probs.add("objects", f"{label}: data is not an object: {short(got)}")
            return
        diff = sorted(k for k in want.keys() | got.keys()
                      if k not in got or k not in want or not strictly_equal(got[k], want[k]))
        probs.add("objects", f"{label}: data differs in {diff}: "
                             f"got {short({k: got.get(k, ABSENT) for k in diff})}, "
                             f"want {short({k: want.get(k, ABSENT) for k in diff})}")


def expected_edges(src: dict, ok: dict, ids: dict) -> dict[str, Edges]:
    """Check 4's expectation: per forward table, ``(from_id, to_id) -> sequence``."""
    out: dict[str, Edges] = {}
    for table, (legacy, (ftype, fcol), (ttype, tcol)) in FORWARD.items():
        edges: Edges = {}
        for row in src[legacy]:
            if row_key(legacy, row) not in ok[legacy]:
                continue
            f, t = ids.get((ftype, row[fcol])), ids.get((ttype, row[tcol]))
            if f is not None and t is not None:
                edges[(f, t)] = unix(as_datetime(row["created_at"]))
        out[table] = edges
    return out


def compare_edges(table: str, want: Edges, rows: Iterable[tuple],
                  allowed: Callable[[int], set[int]], probs: Problems) -> None:
    """Compare stored ``(shard, from, to, seq)`` rows of one mapping table with ``want``."""
    got: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    for shard, f, t, seq in rows:
        got[(f, t)].append((shard, seq))
    for edge, seq in want.items():
        if edge not in got:
            probs.add(f"{table} missing", f"{edge[0]} -> {edge[1]} (sequence {seq})")
    for edge, copies in got.items():
        if edge not in want:
            probs.add(f"{table} extra", f"{edge[0]} -> {edge[1]} {copies}")
            continue
        if len(copies) > 1:
            probs.add(table, f"{edge[0]} -> {edge[1]} stored {len(copies)} times: {copies}")
        for shard, seq in copies:
            if seq != want[edge]:
                probs.add(table, f"{edge[0]} -> {edge[1]} sequence {seq}, want {want[edge]}")
            if shard not in allowed(edge[0]):
                probs.add(table, f"{edge[0]} -> {edge[1]} on shard {shard}, "
                                 f"want {sorted(allowed(edge[0]))}")


def check_mappings(target: Target, want: dict[str, Edges], probs: Problems) -> None:
    """Check 4: forward tables exactly; reverse tables (when filled) as exact inverses."""
    def home(from_id: int) -> set[int]:
        return {shard_of(from_id)}

    cols = "from_id, to_id, sequence"
    for table, edges in want.items():
        compare_edges(table, edges, target.fetch("db", table, cols, probs), home, probs)
    directory: dict[int, set[int]] = defaultdict(set)
    for shard, board_id, listed in target.fetch("db", HOTSPOT_TABLE, "board_id, shard", None):
        directory[board_id].add(listed)
        if shard != shard_of(board_id):
            probs.add(HOTSPOT_TABLE, f"board {board_id} listed on shard {shard}, not its own")

    def spread(board_id: int) -> set[int]:
        return directory.get(board_id) or home(board_id)

    for table, forward in REVERSE.items():
        rows = target.fetch("db", table, cols, None)
        if not rows:
            continue
        inverse = {(t, f): seq for (f, t), seq in want[forward].items()}
        compare_edges(table, inverse, rows,
                      spread if table == "board_followedby_users" else home, probs)


def check_lookup(target: Target, table: str, col: str, want: dict[str, set[int]],
                 probs: Problems) -> None:
    """Check one lower-cased lookup table: one row per key, right bucket, right user."""
    seen: dict[str, int] = defaultdict(int)
    for bucket, key, user_id in target.fetch("mod", table, f"{col}, user_id", probs):
        seen[key] += 1
        if key not in want:
            probs.add(f"{table} extra", f"{key!r} -> {user_id} in bucket {bucket}")
            continue
        if bucket != bucket_of(key, target.buckets):
            probs.add(table, f"{key!r} in bucket {bucket}, "
                             f"want {bucket_of(key, target.buckets)}")
        if user_id not in want[key]:
            probs.add(table, f"{key!r} -> {user_id}, want one of {sorted(want[key])[:5]}")
    for key in want:
        if seen.get(key, 0) != 1:
            probs.add(f"{table} missing" if key not in seen else table,
                      f"{key!r} has {seen.get(key, 0)} rows (want 1)")


def check_lookups(target: Target, src: dict, ok: dict, ids: dict, probs: Problems) -> None:
    """Check 5: ``username_to_user`` and ``email_to_user``."""
    names: dict[str, set[int]] = defaultdict(set)
    emails: dict[str, set[int]] = defaultdict(set)
    for row in src["users"]:
        new_id = ids.get(("user", row["id"]))
        if row["id"] not in ok["users"] or new_id is None:
            continue
        names[row["username"].lower()].add(new_id)
        if row["email"] is not None:
            emails[row["email"].lower()].add(new_id)
    check_lookup(target, "username_to_user", "username", names, probs)
    check_lookup(target, "email_to_user", "email", emails, probs)


def check_quarantine(src: dict, ok: dict, rows: list[tuple[str, str, str]],
                     probs: Problems) -> None:
    """Check 6: exactly the non-migrated legacy rows are quarantined, each with a reason."""
    def fmt(table: str, key: Key) -> str:
        return f"{key[0]}:{key[1]}" if isinstance(key, tuple) else str(key)

    want = {(table, fmt(table, row_key(table, r))) for table in LEGACY_COLUMNS
            for r in src[table] if row_key(table, r) not in ok[table]}
    got = set()
    for table, key, reason in rows:
        got.add((table, str(key)))
        if not reason:
            probs.add("quarantine", f"{table} {key} has an empty reason")
    for table, key in sorted(want - got):
        probs.add("quarantine missing", f"{table} {key} is not migrated but not quarantined")
    for table, key in sorted(got - want):
        probs.add("quarantine extra", f"{table} {key} is quarantined but should be migrated"
                                      " or does not exist")


def check_migration(legacy: dict, shardmap: dict,
                    quarantine_rows: list[tuple[str, str, str]] | None = None) -> list[str]:
    """Every way the target differs from what CONTRACTS §3-§6 prescribe; ``[]`` when exact.

    ``legacy`` holds PyMySQL connection kwargs of the legacy database, ``shardmap`` the
    parsed shard map, ``quarantine_rows`` optional ``(legacy_table, legacy_key, reason)``
    rows from the control database.
    """
    probs = Problems()
    src = read_legacy(legacy)
    ok = migrated(src)
    target = Target(shardmap)
    try:
        ids = check_id_map(target, ok, probs)
        check_placement(target, src, ok, ids, probs)
        check_objects(target, src, ok, ids, probs)
        check_mappings(target, expected_edges(src, ok, ids), probs)
        check_lookups(target, src, ok, ids, probs)
    finally:
        target.close()
    if quarantine_rows is not None:
        check_quarantine(src, ok, quarantine_rows, probs)
    return probs.lines()
