"""The bad rows of the synthetic legacy data set: a small share of every kind a migration
must quarantine (NULL or zero ``created_at``, NULL username, references to missing rows,
and rows whose parent is itself quarantined). Hot boards and their owners stay clean.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from demo.legacygen.clean import DAY, EPOCH, MAX_ID, LegacyData
from demo.legacygen.write import ZERO
from loaders.migration.legacy_schema import LEGACY_TABLES


class Corrupter:
    """Adds a small share of every kind of row a migration must quarantine (hot boards stay
    clean)."""

    def __init__(self, rng: random.Random, data: LegacyData) -> None:
        self.rng, self.t = rng, data.tables
        self.ids = {name: {r[0] for r in self.t[name]} for name in ("users", "boards", "pins",
                                                                    "comments")}
        self.used: dict[str, set[int]] = {name: set() for name in LEGACY_TABLES}
        self.hot = data.hot_boards
        self.hot_owners = {b[1] for b in self.t["boards"] if b[0] in self.hot}

    def run(self) -> None:
        """Bad fields, orphans at every reference, and a chain of quarantined parents."""
        self.fields("users", lambda r: r[0] not in self.hot_owners, null_username=0.01)
        self.fields("boards", lambda r: r[0] not in self.hot)
        for table, share in (("pins", 0.002), ("comments", 0.004), ("follows", 0.002),
                             ("likes", 0.002)):
            self.fields(table, share=share)
        self.orphans("boards", 1, "users", 0.004, lambda r: r[0] not in self.hot)
        for table, col, parent, share in (("pins", 1, "users", 0.002),
                                          ("pins", 2, "boards", 0.002),
                                          ("comments", 1, "pins", 0.004),
                                          ("comments", 2, "users", 0.004)):
            self.orphans(table, col, parent, share)
        for table, parent in (("follows", "boards"), ("likes", "pins")):
            self.orphan_edges(table, parent)
        self.chain()

    def _pick(self, table: str, share: float, ok: Callable[[list], bool]) -> list[list]:
        """Some rows of ``table`` (at least two) not made bad yet."""
        rows, used, chosen = self.t[table], self.used[table], []
        want = max(2, int(len(rows) * share))
        for _ in range(20 * want if rows else 0):
            i = self.rng.randrange(len(rows))
            if i not in used and ok(rows[i]):
                used.add(i)
                chosen.append(rows[i])
                if len(chosen) == want:
                    break
        return chosen

    def _missing(self, table: str) -> int:
        """A fresh ID near a real one of ``table``, never handed out twice (a deleted parent)."""
        rows, ids, spread = self.t[table], self.ids[table], 3
        while True:
            near = rows[self.rng.randrange(len(rows))][0] if rows else 1000
            cand, spread = near + self.rng.randint(1, spread), spread + 1
            if cand <= MAX_ID and cand not in ids:
                ids.add(cand)
                return cand

    def fields(self, table: str, ok: Callable[[list], bool] = lambda r: True,
               share: float = 0.004, null_username: float = 0.0) -> None:
        """NULL and zero ``created_at`` (and, for users, NULL username)."""
        for row in self._pick(table, share, ok):
            row[-1] = None
        for row in self._pick(table, share, ok):
            row[-1] = ZERO
        for row in self._pick(table, null_username, ok) if null_username else ():
            row[1] = None

    def orphans(self, table: str, col: int, parent: str, share: float,
                ok: Callable[[list], bool] = lambda r: True) -> None:
        """Point some references at parents that do not exist (one in four NULL)."""
        for row in self._pick(table, share, ok):
            row[col] = None if self.rng.random() < 0.25 else self._missing(parent)

    def orphan_edges(self, table: str, parent: str) -> None:
        """Extra follows/likes by missing users and of missing boards/pins."""
        rows, users, targets = self.t[table], self.t["users"], self.t[parent]
        for _ in range(max(2, len(rows) // 500)):
            user = users[self.rng.randrange(len(users))]
            if targets:
                target = targets[self.rng.randrange(len(targets))]
                rows.append([self._missing("users"), target[0], max(target[-1] or 0, EPOCH)])
            rows.append([user[0], self._missing(parent), max(user[-1] or 0, EPOCH)])

    def _new(self, table: str, row: list) -> list:
        """Add ``row`` to ``table`` under a fresh ID; return it."""
        row[0] = self._missing(table)
        self.t[table].append(row)
        return row

    def chain(self) -> None:
        """A valid user, board and pin next to a NULL-username user, so that every kind
        of row whose parent is quarantined (and is therefore quarantined too) exists
        whatever the size."""
        t0 = EPOCH + 100 * DAY
        good = self._new("users", [0, "🔗chain.good", "Chain@Example.com", "🔗 ok", t0])
        bad = self._new("users", [0, None, "chain@example.com", "no username", t0])
        gb = self._new("boards", [0, good[0], "Good board", None, t0 + 1])
        qb = self._new("boards", [0, bad[0], "Board of a bad owner", None, t0 + 1])
        gp = self._new("pins", [0, good[0], gb[0], "good pin", None, None, t0 + 2])
        qp = self._new("pins", [0, good[0], qb[0], "pin on a quarantined board", None, None,
                                t0 + 2])
        self._new("pins", [0, bad[0], gb[0], "pinned by a bad user", None, None, t0 + 2])
        self._new("comments", [0, qp[0], good[0], "on a quarantined pin", t0 + 3])
        self._new("comments", [0, gp[0], bad[0], "by a bad user", t0 + 3])
        self.t["follows"] += [[good[0], qb[0], t0 + 3], [bad[0], gb[0], t0 + 3]]
        self.t["likes"] += [[good[0], qp[0], t0 + 3], [bad[0], gp[0], t0 + 3]]

