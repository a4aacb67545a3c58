"""Applying legacy changes (``farm sync``): the keys a batch of binlog rows touched, with
every row whose validity or placement they may change, through the migration itself.

A change is never applied from the event's row image: the keys it names are loaded
again from the legacy database as it is now (``migrate.load_selection``, the code a
re-run uses), so applying is idempotent and order does not matter: whatever the
events in between, the target ends as the current legacy rows imply. A change to an
object's judged columns (insert, delete, a new owner, board, pin, username or date)
also applies every legacy row referencing it, recursively (a deleted user takes its
boards, their pins, comments, follows and likes; a re-inserted one brings them back).
"""

from __future__ import annotations

import queue
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field

from farmcore.quarantine import Quarantine
from loaders.migration.legacy import LegacyReader
from loaders.migration.migrate import ProcessState, load_selection
from loaders.migration.newids import IdCache, fits
from loaders.migration.present import Selection
from loaders.migration.spec import ORDER, RANDOM, SPEC
from loaders.migration.verdicts import Verdicts
from shardfarm.mysql.dsn import DSN
from shardfarm.mysql.inlist import IN_LIST_MAX
from sharding.fencing import FenceToken
from sharding.router import Router

# changed object table -> (dependent legacy table, its column referencing it)
DEPENDENTS: dict[str, tuple[tuple[str, str], ...]] = {
    "users": (("boards", "user_id"), ("pins", "user_id"), ("comments", "user_id"),
              ("follows", "user_id"), ("likes", "user_id")),
    "boards": (("pins", "board_id"), ("follows", "board_id")),
    "pins": (("comments", "pin_id"), ("likes", "pin_id")),
}
IN_BATCH = IN_LIST_MAX
APPLY_THREADS = 3  # selections applied at once, as chunks of different tables run at once


@dataclass
class Changes:
    """Legacy keys touched per table, and objects whose dependents must follow.

    An object is its ID (in ``keys``). A link row (follow, like) is its whole key (in
    ``pairs``) when both IDs are below 2**35; otherwise, or when its user changed, the
    user's rows are taken whole (its ID in ``keys``). An object whose placement a change
    may have moved (its placing column changed, or it depends on a changed root) is also
    in ``moved``: its old slot is looked for on every shard, any other only where
    ``legacy_id_map`` places it (``present.held_objects``).
    """

    keys: dict[str, set[int]] = field(default_factory=lambda: defaultdict(set))
    pairs: dict[str, set[tuple[int, int]]] = field(default_factory=lambda: defaultdict(set))
    roots: dict[str, set[int]] = field(default_factory=lambda: defaultdict(set))
    moved: dict[str, set[int]] = field(default_factory=lambda: defaultdict(set))

    def add(self, table: str, before: dict | None, after: dict | None) -> None:
        """One row change (``before``/``after`` images; ``None`` for insert/delete)."""
        spec = SPEC.get(table)
        if spec is None:
            return
        images = [i for i in (before, after) if i is not None]
        for image in images:
            self.key(table, tuple(int(image[k]) for k in spec.key))
        place = spec.placement if spec.placement != RANDOM else None
        if place and before is not None and after is not None \
                and before.get(place) != after.get(place):
            self.moved[table].add(int(after["id"]))
        if table in DEPENDENTS:
            judged = spec.judge_columns
            if before is None or after is None or any(
                    before.get(c) != after.get(c) for c in judged):
                self.roots[table].update(int(i["id"]) for i in images)

    def key(self, table: str, key: tuple[int, ...]) -> None:
        """A legacy row of ``table`` to apply again, by its whole key."""
        if len(key) == 2 and fits(key[0]) and fits(key[1]):
            self.pairs[table].add((key[0], key[1]))
        else:
            self.keys[table].add(key[0])

    def rows(self) -> int:
        """Keys touched."""
        return sum(map(len, self.keys.values())) + sum(map(len, self.pairs.values()))


def expand(reader: LegacyReader, changes: Changes) -> Changes:
    """``changes`` plus every legacy row depending on a root, recursively: a changed
    user's link rows whole, another object's dependents by their keys."""
    todo = {t: set(v) for t, v in changes.roots.items()}
    while any(todo.values()):
        nxt: dict[str, set[int]] = defaultdict(set)
        for table, ids_ in todo.items():
            for dep, col in DEPENDENTS.get(table, ()):
                found = _referencing(reader, dep, col, sorted(ids_))
                if table == "users" and not SPEC[dep].is_object:
                    changes.keys[dep].update(k[0] for k in found)
                    continue
                for k in found:
                    changes.key(dep, k)
                if SPEC[dep].is_object:
                    changes.moved[dep].update(k[0] for k in found)
                if dep in DEPENDENTS:
                    ids_found = {k[0] for k in found}
                    nxt[dep] |= ids_found - changes.roots.get(dep, set())
                    changes.roots[dep] = changes.roots.get(dep, set()) | ids_found
        todo = nxt
    return changes


def _referencing(reader: LegacyReader, table: str, col: str, ids_: list[int]
                 ) -> set[tuple[int, ...]]:
    """Whole keys of ``table``'s rows whose ``col`` is one of ``ids_``."""
    cols = ", ".join(f"`{k}`" for k in SPEC[table].key)
    out: set[tuple[int, ...]] = set()
    for i in range(0, len(ids_), IN_BATCH):
        part = ids_[i:i + IN_BATCH]
        out |= {tuple(int(v) for v in r) for r in reader.query(
            f"SELECT {cols} FROM `{table}` WHERE `{col}` IN "
            f"({','.join(['%s'] * len(part))})", part)}
    return out


def _selections(changes: Changes, table: str) -> list[tuple[Selection, list[str], bool]]:
    """What to apply of ``table``: selections with the quarantine keys each stands for
    (``prefix``: a first key column standing for all its rows)."""
    whole = sorted(changes.keys.get(table, ()))
    out: list[tuple[Selection, list[str], bool]] = []
    if SPEC[table].is_object:
        moved = changes.moved.get(table, set())
        for part, mapped_only in (([v for v in whole if v in moved], False),
                                  ([v for v in whole if v not in moved], True)):
            if part:
                out.append((Selection.of(part, mapped_only), [str(v) for v in part], False))
    elif whole:
        out.append((Selection.of(whole), [str(v) for v in whole], True))
    taken = set(whole)
    pairs = {p for p in changes.pairs.get(table, ()) if p[0] not in taken}
    if pairs:
        out.append((Selection.of_pairs(pairs), [f"{a}:{b}" for a, b in sorted(pairs)], False))
    return out


def table_token(token: FenceToken | None, table: str) -> FenceToken | None:
    """The lease's token for writes of ``table``'s target rows: one fence row per legacy
    table on each shard, as a migration has one per chunk. Selections of different tables
    write different target rows, so their transactions need not wait for each other on a
    shared fence row; a zombie leader is refused on a shard once its successor wrote the
    same table's rows there, the only writes its late ones could overtake."""
    if token is None:
        return None
    return FenceToken(token.run_id, 1 + ORDER.index(table), token.fence)


class Readers:
    """Legacy connections, one per thread applying a batch (``APPLY_THREADS``)."""

    def __init__(self, dsn: DSN, threads: int = APPLY_THREADS) -> None:
        self.threads = threads
        self._free: queue.SimpleQueue[LegacyReader] = queue.SimpleQueue()
        self._all = [LegacyReader(dsn) for _ in range(threads)]
        for r in self._all:
            self._free.put(r)

    @contextmanager
    def one(self) -> Iterator[LegacyReader]:
        """A reader no other thread is using, for the ``with`` block's time."""
        r = self._free.get()
        try:
            yield r
        finally:
            self._free.put(r)

    def close(self) -> None:
        """Drop every connection."""
        for r in self._all:
            r.close()


def apply(router: Router, token: FenceToken | None, readers: Readers, quarantine: Quarantine,
          run: dict, changes: Changes) -> dict[str, int]:
    """Apply a batch of changes to the target and to ``run``'s quarantine; returns the
    legacy keys applied per table.

    Each table's selections are applied on threads of their own, as a migration's chunks
    of different tables run at once on different workers: every selection reads the
    legacy rows as they are now and makes its own table's target rows match them.
    """
    with readers.one() as reader:
        expand(reader, changes)
    jobs = sorted(((t, *s) for t in ORDER for s in _selections(changes, t)),
                  key=lambda j: -len(j[2]))
    cache: IdCache = {}  # the legacy data moved on: no verdict is kept from the last batch

    def one(table: str, sel: Selection, keys: list[str], prefix: bool) -> None:
        def record(bad: list) -> None:
            quarantine.replace(run["run_id"], table, keys, bad, prefix,
                               fence=token.fence if token else None)
        with readers.one() as reader:
            st = ProcessState(reader, cache, Verdicts())
            load_selection(router, table_token(token, table), st, run["params"], table, sel,
                           record)
    with ThreadPoolExecutor(readers.threads, thread_name_prefix="sync-apply") as pool:
        for f in [pool.submit(one, *job) for job in jobs]:
            f.result()
    applied: dict[str, int] = defaultdict(int)
    for table, _, keys, _ in jobs:
        applied[table] += len(keys)
    return dict(applied)
