"""A deterministic synthetic legacy database of the six legacy tables, written with LOAD DATA.

``build(users, seed)`` makes the rows in memory from ``random.Random(seed)`` alone, so one
seed always gives byte-identical tables: ~40 rows per user, power-law boards, pins and
follows (a few very hot boards), group boards, same-second bursts, sparse IDs with some of
2**36 and above, unicode edge cases, and a small share of bad rows of every kind.
``classify`` applies the migration's rule (a row migrates only if its required fields are
present and every row it references exists and itself migrates) to say which rows a
faithful migration must quarantine and why; ``generate`` recreates the tables and
bulk-loads the rows. The clean rows come from ``clean``, the bad ones from ``corrupt``.
"""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Callable
from operator import itemgetter

from demo.legacygen.clean import CleanBuilder, LegacyData
from demo.legacygen.corrupt import Corrupter
from demo.legacygen.origin import record_origin, refuse_farm_database
from demo.legacygen.write import ZERO, write
from loaders.migration.legacy_schema import LEGACY_TABLES
from shardfarm.errors import TransientDatabaseError, UnreachableError
from shardfarm.mysql.dsn import DSN


def build(users: int, seed: int = 1) -> LegacyData:
    """Generate the whole legacy data set for ``users`` users in memory, in key order."""
    if users < 1:
        raise ValueError("users must be at least 1")
    builder = CleanBuilder(users, seed)
    gc.disable()  # millions of small lists: the cyclic collector would rescan them all
    try:
        data = builder.run()
        Corrupter(builder.rng, data).run()
    finally:
        gc.enable()
    for name, rows in data.tables.items():
        rows.sort(key=itemgetter(0, 1) if name in ("follows", "likes") else itemgetter(0))
    return data


_REFS = {"users": (), "boards": ((1, "owner", "users"),),
         "pins": ((1, "pinner", "users"), (2, "board", "boards")),
         "comments": ((1, "pin", "pins"), (2, "user", "users")),
         "follows": ((0, "user", "users"), (1, "board", "boards")),
         "likes": ((0, "user", "users"), (1, "pin", "pins"))}


def classify(data: LegacyData) -> dict[str, dict]:
    """Rows a faithful migration must quarantine, ``{table: {key: reason}}``: those missing a
    required field (username, a real ``created_at``) or referencing a row that is missing or
    itself quarantined.

    The key is the ID, or ``(user_id, board_id|pin_id)`` for follows and likes; the reason
    is the first fault found: own fields, then each reference (missing or quarantined).
    """
    every = {name: {r[0] for r in data.tables[name]} for name in ("users", "boards", "pins")}
    good: dict[str, set] = {}
    out: dict[str, dict] = {}
    for name in LEGACY_TABLES:
        good[name], out[name] = set(), {}
        for row in data.tables[name]:
            why = ("null_username" if name == "users" and row[1] is None else
                   "null_created_at" if row[-1] is None else
                   "zero_created_at" if row[-1] == ZERO else None)
            for col, label, parent in _REFS[name]:
                if why is None and row[col] not in good[parent]:
                    why = (f"{label}_quarantined" if row[col] in every[parent]
                           else f"missing_{label}")
            if why is None:
                good[name].add(row[0])
            else:
                out[name][tuple(row[:2]) if name in ("follows", "likes") else row[0]] = why
    return out


def report(data: LegacyData) -> dict:
    """Row counts, bad rows by kind, what a migration should load, and follower skew."""
    bad = classify(data)
    kinds = Counter(f"{name}.{why}" for name, rows in bad.items() for why in rows.values())
    rows = {name: len(r) for name, r in data.tables.items()}
    followers = sorted(Counter(f[1] for f in data.tables["follows"]).values()) or [0]
    return {"rows": rows, "bad": dict(sorted(kinds.items())),
            "expected": {"loaded": {n: rows[n] - len(bad[n]) for n in rows},
                         "quarantined": {n: len(bad[n]) for n in rows}},
            "followers_per_board": {"max": followers[-1],
                                    "median": followers[len(followers) // 2]}}


def generate(dsn: DSN, users: int, seed: int = 1,
             progress: Callable[[int], object] | None = None,
             made_by: str = "farm legacy generate") -> dict:
    """Fill the legacy database with the data set of ``build(users, seed)``; return ``report``.

    The tables are dropped and recreated first (callers that must not replace someone's
    data check ``origin.refuse_to_replace`` before). ``made_by``, users and seed
    are recorded in the database (``origin``). ``progress(n)`` is called as rows land.
    """
    refuse_farm_database(dsn)
    data = build(users, seed)
    record_origin(dsn, made_by, users, seed, complete=False)
    for attempt in range(3):  # write() starts from empty tables, so it may simply run again
        try:
            write(dsn, data, progress)
            break
        except TransientDatabaseError as exc:  # a connection lost (or killed) mid-load
            if attempt == 2 or isinstance(exc, UnreachableError):
                raise
    record_origin(dsn, made_by, users, seed, complete=True)
    return {"users": users, "seed": seed, **report(data)}
