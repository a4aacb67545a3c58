"""Taking objects and mapping rows out of the target (a legacy row gone, invalid, or an
object placed on another shard than before).

An object is *retired*, not deleted: its row stays with ``active = 0`` and its document
(so its slot stays its own: a legacy row that comes back owns it again), and every
forward mapping row from it is deleted. Mapping rows are deleted. Each shard's changes
are one transaction, fenced when a token is given; every step is idempotent.
"""

from __future__ import annotations

from collections import defaultdict

from loaders.migration.spec import SELF, LegacyTable
from shardfarm.parallel import run_parallel
from sharding import fencing, ids
from sharding.fencing import FenceToken
from sharding.jsondoc import loads
from sharding.router import Router
from sharding.schema import MAPPING_TABLES, shard_table

FORWARD_FROM = {t: [m.name for m in MAPPING_TABLES.values()
                    if m.reverse_of is None and m.from_type == t] for t in ids.TYPES.values()}
THREADS = 2  # shard transactions at once
IN_BATCH = 500  # rows per statement: below the server's IN-to-join conversion
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
    ``edges``; per shard one transaction of a few statements (``IN`` lists), a few shards
    at a time."""
    retired: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for new, legacy in objects.items():
        retired[new >> ids.SHARD_SHIFT].append((new, legacy))
    unlinked: dict[int, dict[str, list[tuple[int, int]]]] = defaultdict(lambda: defaultdict(list))
    for name, a, b in edges:
        unlinked[a >> ids.SHARD_SHIFT][name].append((a, b))

    def one(shard: int) -> None:
        def tx(cur) -> None:
            fencing.check(cur, shard, token)
            if shard in retired:
                _retire(cur, shard, table, sorted(retired[shard]))
            for name, pairs in sorted(unlinked.get(shard, {}).items()):
                _unlink(cur, shard_table(shard, name), sorted(pairs))
        router.run(shard, tx)
    run_parallel([(one, shard) for shard in sorted({*retired, *unlinked})], THREADS)


def moved(router: Router, token: FenceToken | None, table: LegacyTable,
          objects: dict[int, int]) -> None:
    """Retire the old slots of objects given a new ID on another shard, with the mapping
    rows their documents implied (the new slot gets its own from the loader), fenced by
    ``token``."""
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
    remove(router, token, table, objects, edges)


def _retire(cur, shard: int, table: LegacyTable, objects: list[tuple[int, int]]) -> None:
    """Inside a shard transaction: retire the slots of ``objects`` (``(new ID, legacy ID)``)
    still active and naming that legacy ID, and delete every forward row from them."""
    q = shard_table(shard, table.name)
    for i in range(0, len(objects), IN_BATCH):
        part = objects[i:i + IN_BATCH]
        locals_ = [new & ids.MAX_LOCAL for new, _ in part]
        cur.execute(f"UPDATE {q} SET active = 0 WHERE local_id IN ({_marks(len(part))}) AND "
                    "active = 1 AND (local_id, JSON_VALUE(data, '$.legacy_id')) IN "
                    f"({','.join(['(%s,%s)'] * len(part))})",
                    [*locals_, *(v for (new, legacy), local in zip(part, locals_, strict=True)
                                 for v in (local, str(legacy)))])
        for name in FORWARD_FROM[ids.TYPES[table.type_name]]:
            cur.execute(f"DELETE FROM {shard_table(shard, name)} WHERE from_id IN "
                        f"({_marks(len(part))})", [new for new, _ in part])


def _unlink(cur, q: str, pairs: list[tuple[int, int]]) -> None:
    """Inside a shard transaction: delete the rows ``(from_id, to_id)`` of ``q``."""
    for i in range(0, len(pairs), IN_BATCH):
        part = pairs[i:i + IN_BATCH]
        cur.execute(f"DELETE FROM {q} WHERE (from_id, to_id) IN "
                    f"({','.join(['(%s,%s)'] * len(part))})", [v for p in part for v in p])


def _marks(n: int) -> str:
    return ",".join(["%s"] * n)
