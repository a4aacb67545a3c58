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

from collections import defaultdict
from dataclasses import dataclass, field

from farmcore.quarantine import Quarantine
from loaders.migration.legacy import LegacyReader
from loaders.migration.migrate import ProcessState, load_selection
from loaders.migration.present import Selection
from loaders.migration.spec import ORDER, SPEC
from loaders.migration.verdicts import Verdicts
from sharding.fencing import FenceToken
from sharding.router import Router

# changed object table -> (dependent legacy table, its column referencing it)
DEPENDENTS: dict[str, tuple[tuple[str, str], ...]] = {
    "users": (("boards", "user_id"), ("pins", "user_id"), ("comments", "user_id"),
              ("follows", "user_id"), ("likes", "user_id")),
    "boards": (("pins", "board_id"), ("follows", "board_id")),
    "pins": (("comments", "pin_id"), ("likes", "pin_id")),
}
IN_BATCH = 1000


@dataclass
class Changes:
    """First-key values touched per legacy table, and objects whose dependents must follow."""

    keys: dict[str, set[int]] = field(default_factory=lambda: defaultdict(set))
    roots: dict[str, set[int]] = field(default_factory=lambda: defaultdict(set))

    def add(self, table: str, before: dict | None, after: dict | None) -> None:
        """One row change (``before``/``after`` images; ``None`` for insert/delete)."""
        spec = SPEC.get(table)
        if spec is None:
            return
        images = [i for i in (before, after) if i is not None]
        for image in images:
            self.keys[table].add(int(image[spec.key[0]]))
        if table in DEPENDENTS:
            judged = spec.judge_columns
            if before is None or after is None or any(
                    before.get(c) != after.get(c) for c in judged):
                self.roots[table].update(int(i["id"]) for i in images)

    def rows(self) -> int:
        """Keys touched."""
        return sum(map(len, self.keys.values()))


def expand(reader: LegacyReader, changes: Changes) -> dict[str, set[int]]:
    """The touched keys plus every legacy row depending on a root, recursively."""
    keys = {t: set(v) for t, v in changes.keys.items()}
    todo = {t: set(v) for t, v in changes.roots.items()}
    while any(todo.values()):
        nxt: dict[str, set[int]] = defaultdict(set)
        for table, ids_ in todo.items():
            for dep, col in DEPENDENTS.get(table, ()):
                found = _referencing(reader, dep, col, sorted(ids_))
                keys.setdefault(dep, set()).update(found)
                if dep in DEPENDENTS:
                    nxt[dep] |= found - changes.roots.get(dep, set())
                    changes.roots[dep] = changes.roots.get(dep, set()) | found
        todo = nxt
    return keys


def _referencing(reader: LegacyReader, table: str, col: str, ids_: list[int]) -> set[int]:
    """First-key values of ``table``'s rows whose ``col`` is one of ``ids_``."""
    first = SPEC[table].key[0]
    out: set[int] = set()
    for i in range(0, len(ids_), IN_BATCH):
        part = ids_[i:i + IN_BATCH]
        out |= {int(r[0]) for r in reader.query(
            f"SELECT DISTINCT `{first}` FROM `{table}` WHERE `{col}` IN "
            f"({','.join(['%s'] * len(part))})", part)}
    return out


def apply(router: Router, token: FenceToken | None, reader: LegacyReader, quarantine: Quarantine,
          run: dict, changes: Changes) -> dict[str, int]:
    """Apply a batch of changes to the target and to ``run``'s quarantine; returns the
    legacy keys applied per table."""
    keys = expand(reader, changes)
    st = ProcessState(reader, {}, Verdicts())  # the legacy data moved on: nothing cached
    applied: dict[str, int] = {}
    for table in ORDER:
        values = sorted(keys.get(table, ()))
        if not values:
            continue
        link = not SPEC[table].is_object

        def record(bad: list, table=table, values=values, link=link) -> None:
            quarantine.replace(run["run_id"], table, [str(v) for v in values], bad, link)
        load_selection(router, token, st, run["params"], table, Selection.of(values), record)
        applied[table] = len(values)
    return applied
