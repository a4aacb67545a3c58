"""Taking objects and mapping rows out of the target (a legacy row gone, invalid, or an
object placed on another shard than before).

An object is *retired*, not deleted: its row stays with ``active = 0`` and its document
(so its slot stays its own: a legacy row that comes back owns it again), and every
forward mapping row from it is deleted. Mapping rows are deleted. Each shard's changes
are one transaction, fenced when a token is given; every step is idempotent.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from loaders.migration.spec import SELF, LegacyTable
from sharding import fencing, ids
from sharding.fencing import FenceToken
from sharding.jsondoc import loads
from sharding.router import Router
from sharding.schema import MAPPING_TABLES, shard_table

FORWARD_FROM = {t: [m.name for m in MAPPING_TABLES.values()
                    if m.reverse_of is None and m.from_type == t] for t in ids.TYPES.values()}
IN_BATCH = 1000
Edge = tuple[str, int, int]  # (mapping table, from_id, to_id)


def derived(table: LegacyTable, new_id: int, doc: dict) -> tuple[set[Edge], set[tuple]]:
    """Mapping rows and lookups ``(table, key, user_id)`` an object document implies."""
    def ref(f: str) -> int | None:
        return new_id if f == SELF else doc.get(f)
    edges = {(m.table, ref(m.from_), ref(m.to)) for m in table.mappings}
    looks = {(lk.table, str(doc[lk.field]).lower(), new_id) for lk in table.lookups
             if doc.get(lk.field) is not None}
    return {e for e in edges if None not in e}, looks


def remove(router: Router, token: FenceToken | None, table: LegacyTable,
           objects: dict[int, int], edges: set[Edge]) -> None:
    """Retire ``objects`` (new ID -> the legacy ID its document must name) and delete
    ``edges``; per shard one transaction."""
    per_shard: dict[int, list[Callable]] = defaultdict(list)
    for new, legacy in objects.items():
        per_shard[new >> ids.SHARD_SHIFT].append(_retire(table, new, legacy))
    for name, a, b in edges:
        per_shard[a >> ids.SHARD_SHIFT].append(_unlink(name, a, b))
    for shard, steps in sorted(per_shard.items()):
        def tx(cur, shard=shard, steps=steps) -> None:
            fencing.check(cur, shard, token)
            for step in steps:
                step(cur, shard)
        router.run(shard, tx)


def moved(router: Router, table: LegacyTable, objects: dict[int, int]) -> None:
    """Retire the old slots of objects given a new ID on another shard, with the mapping
    rows their documents implied (the new slot gets its own from the loader)."""
    by_shard: dict[int, list[int]] = defaultdict(list)
    for new in objects:
        by_shard[new >> ids.SHARD_SHIFT].append(new & ids.MAX_LOCAL)
    edges: set[Edge] = set()
    t = ids.TYPES[table.type_name]
    for shard, locals_ in by_shard.items():
        q = shard_table(shard, table.name)
        for i in range(0, len(locals_), IN_BATCH):
            part = locals_[i:i + IN_BATCH]
            rows = router.query(router.host_for(shard), f"SELECT local_id, data FROM {q} WHERE "
                                f"active = 1 AND local_id IN ({','.join(['%s'] * len(part))})",
                                part, shard)
            for local, data in rows:
                edges |= derived(table, ids.encode(shard, t, local), loads(data))[0]
    remove(router, None, table, objects, edges)


def _retire(table: LegacyTable, new: int, legacy: int) -> Callable:
    def step(cur, shard: int) -> None:
        q = shard_table(shard, table.name)
        cur.execute(f"UPDATE {q} SET active = 0 WHERE local_id = %s AND active = 1 "
                    "AND JSON_VALUE(data, '$.legacy_id') = %s", (new & ids.MAX_LOCAL, legacy))
        for name in FORWARD_FROM[ids.TYPES[table.type_name]]:
            cur.execute(f"DELETE FROM {shard_table(shard, name)} WHERE from_id = %s", (new,))
    return step


def _unlink(name: str, a: int, b: int) -> Callable:
    def step(cur, shard: int) -> None:
        cur.execute(f"DELETE FROM {shard_table(shard, name)} WHERE from_id = %s AND to_id = %s",
                    (a, b))
    return step
