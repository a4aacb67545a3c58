"""Convergence: remove from the target what the current legacy data no longer implies.

After a selection's valid rows are written (``writer``), whatever the target still
holds for that selection beyond them is stale and is taken out:

- an object whose legacy row is gone, invalid, or placed elsewhere now is *retired*:
  its row stays as a tombstone (``active = 0``, its document kept, so its slot stays
  its own and a small legacy ID that comes back gets the very same new ID), its
  ``legacy_id_map`` row is deleted (the map lists exactly the migrated objects), and
  every mapping row from it, or derived from its document, is deleted;
- a valid object whose document changed (a new owner, board, username, e-mail) loses
  the mapping rows and lookups its old document implied and the new one does not;
- a link row (follow, like) that is no longer valid loses its mapping row;
- a username or e-mail lookup that named a retired user, or a user whose key changed,
  is deleted, then given to another valid user with that key if there is one.

Every shard write is one fenced transaction, and so is every mod-bucket write
(``fencing.check_mod``); each step is idempotent, so a chunk or a sync batch killed half
way converges when it runs again.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from loaders.migration import retire
from loaders.migration.build import Builder, TargetRows
from loaders.migration.legacy import LegacyReader
from loaders.migration.newids import fits
from loaders.migration.present import Held
from loaders.migration.retire import Edge, derived
from loaders.migration.spec import SPEC, LegacyTable
from loaders.migration.writer import run_mod_statements, write_mod
from sharding import ids
from sharding.fencing import FenceToken
from sharding.jsondoc import loads
from sharding.modshard import bucket_of, legacy_key
from sharding.router import Router
from sharding.schema import mod_table

LOOKUP_COLUMN = {"username_to_user": "username", "email_to_user": "email"}
IN_BATCH = 500


@dataclass
class Stale:
    """What one selection must lose: objects to retire (new ID -> legacy ID), map rows
    (legacy -> new ID), mapping rows and lookups ``(table, key, user_id)``."""

    objects: dict[int, int] = field(default_factory=dict)
    mapped: dict[int, int] = field(default_factory=dict)
    edges: set[Edge] = field(default_factory=set)
    lookups: set[tuple[str, str, int]] = field(default_factory=set)

    def count(self) -> int:
        """Rows removed or retired."""
        return len(self.objects) + len(self.mapped) + len(self.edges) + len(self.lookups)


def expected_objects(target: TargetRows, type_id: int) -> dict[int, tuple[int, str]]:
    """New ID -> ``(legacy_id, document text)`` of every object row ``target`` writes (the
    text is parsed only where a held slot is compared with it: most are new slots)."""
    return {ids.encode(shard, type_id, local): (legacy, doc)
            for (shard, _), rows in target.objects.items() for local, doc, legacy in rows}


def stale_objects(table: LegacyTable, held: Held, target: TargetRows) -> Stale:
    """What an object table's selection must lose, given what its valid rows write (nothing
    when the target holds nothing for it: a first load skips comparing every row)."""
    if held.empty():
        return Stale()
    want = expected_objects(target, ids.TYPES[table.type_name])
    valid = {legacy: new for new, (legacy, _) in want.items()}
    out = Stale()
    for new, (legacy, doc) in held.slots.items():
        edges, looks = derived(table, new, doc)
        if new in want:
            w_edges, w_looks = derived(table, new, loads(want[new][1]))
            out.edges |= edges - w_edges
            out.lookups |= looks - w_looks
        else:
            out.objects[new] = legacy
            out.edges |= edges
            out.lookups |= looks
    out.mapped = {legacy: new for legacy, new in held.mapped.items() if legacy not in valid}
    for legacy, new in out.mapped.items():
        if not fits(legacy):  # its slot is found through the map only: retire it too
            out.objects.setdefault(new, legacy)
    return out


def changed(target: TargetRows, held: Held, type_id: int) -> TargetRows:
    """``target`` without what the target already holds as it is: object rows whose active
    slot has the same document, ``legacy_id_map`` rows naming the same new ID (each read
    for this selection just before). Mapping rows and other lookups stay: they were not
    read, so a write killed half way is still completed. When the target holds nothing
    for the selection (a first load), that is ``target`` itself."""
    if held.empty():
        return target
    out = TargetRows(mappings=target.mappings)
    slots = held.slots
    for (shard, name), rows in target.objects.items():
        keep = [r for r in rows if _differs(slots.get(ids.encode(shard, type_id, r[0])), r[1])]
        if keep:
            out.objects[(shard, name)] = keep
    for (b, name), rows in target.lookups.items():
        keep = rows if name != "legacy_id_map" else [
            r for r in rows if held.mapped.get(r[1]) != r[2]]
        if keep:
            out.lookups[(b, name)] = keep
    return out


def _differs(slot: tuple[int, dict] | None, doc: str) -> bool:
    """Whether a held slot (``None``: none) is not the document ``doc`` (text)."""
    return slot is None or slot[1] != loads(doc)


def stale_links(held: dict[str, set[tuple[int, int]]], target: TargetRows) -> Stale:
    """What a link table's selection must lose: rows held but no longer written."""
    want = {(name, a, b) for (_, name), rows in target.mappings.items() for a, b, _ in rows}
    return Stale(edges={(name, a, b) for name, pairs in held.items() for a, b in pairs} - want)


def apply(router: Router, token: FenceToken | None, table: LegacyTable, stale: Stale) -> None:
    """Retire, delete and un-map everything in ``stale`` (the lookups are handled by
    ``relink``)."""
    retire.remove(router, token, table, stale.objects, stale.edges)
    if stale.mapped:
        _unmap(router, token, table, stale.mapped)


def _unmap(router: Router, token: FenceToken | None, table: LegacyTable,
           mapped: dict[int, int]) -> None:
    """Delete ``legacy_id_map`` rows still naming the stale new ID."""
    t = ids.TYPES[table.type_name]
    by_bucket: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for legacy, new in mapped.items():
        b = bucket_of(legacy_key(table.type_name, legacy), router.shardmap.buckets)
        by_bucket[b].append((legacy, new))
    run_mod_statements(router, [
        (b, f"DELETE FROM {mod_table(b, 'legacy_id_map')} WHERE type_id = {t} AND "
            f"(legacy_id, new_id) IN ({','.join(['(%s,%s)'] * len(part))})",
         tuple(v for row in part for v in row))
        for b, rows in sorted(by_bucket.items())
        for part in (sorted(rows)[i:i + IN_BATCH] for i in range(0, len(rows), IN_BATCH))],
        token)


def relink(router: Router, token: FenceToken | None, reader: LegacyReader, builder: Builder,
           lookups: set[tuple[str, str, int]], retired: set[int]) -> None:
    """Delete lookups naming a user that lost the key, then give each such key to a
    valid user that holds it now (the smallest new ID, as the loader's upsert keeps)."""
    if not lookups:
        return
    buckets = router.shardmap.buckets
    run_mod_statements(router, [
        (b, f"DELETE FROM {mod_table(b, name)} WHERE {LOOKUP_COLUMN[name]} = %s AND "
            "user_id = %s", (key, uid))
        for name, key, uid in sorted(lookups) for b in (bucket_of(key, buckets),)], token)
    rows = TargetRows()
    users = SPEC["users"]
    for name in LOOKUP_COLUMN:
        keys = sorted({k for n, k, _ in lookups if n == name})
        for i in range(0, len(keys), IN_BATCH):
            part = keys[i:i + IN_BATCH]
            found = reader.rows(users, users.columns, f"`{LOOKUP_COLUMN[name]}` IN "
                                f"({','.join(['%s'] * len(part))})", part)
            _holders(builder, found, name, set(part), retired, rows)
    write_mod(router, rows, token)


def _holders(builder: Builder, found: list[dict], name: str, keys: set[str], retired: set[int],
             out: TargetRows) -> None:
    """Lookup rows of ``name`` for ``keys`` from the valid users among ``found``."""
    col, users = LOOKUP_COLUMN[name], SPEC["users"]
    judged = [(r, builder.resolver.judge(users, r)) for r in found
              if r[col] is not None and str(r[col]).lower() in keys]
    judged = [(r, v) for r, v in judged if v.valid]
    if not judged:
        return
    built = builder.build(judged)
    for (b, n), items in built.lookups.items():
        if n == name:
            out.lookups[(b, n)] += [r for r in items if r[1] not in retired]
