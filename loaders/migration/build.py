"""Turn judged legacy rows into target rows: objects, mapping rows and mod-shard lookups."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from loaders.migration.newids import SMALL_LIMIT, NewIds
from loaders.migration.spec import SELF, SPEC, LegacyTable
from loaders.migration.verdicts import Resolver, Verdict
from loaders.migration.when import iso, unix
from sharding import ids
from sharding.jsondoc import dumps
from sharding.modshard import bucket_of, legacy_key

_SHARD_SHIFT = ids.SHARD_SHIFT


@dataclass
class TargetRows:
    """Everything one chunk writes, grouped by destination database.

    An object row is ``(local_id, data, legacy_id)``: the legacy ID says who owns the slot.
    """

    objects: dict[tuple[int, str], list[tuple]] = field(default_factory=lambda: defaultdict(list))
    mappings: dict[tuple[int, str], list[tuple]] = field(default_factory=lambda: defaultdict(list))
    lookups: dict[tuple[int, str], list[tuple]] = field(default_factory=lambda: defaultdict(list))

    def extend(self, other: TargetRows) -> None:
        """Add ``other``'s rows to these, destination by destination."""
        for mine, theirs in ((self.objects, other.objects), (self.mappings, other.mappings),
                             (self.lookups, other.lookups)):
            for key, rows in theirs.items():
                mine[key] += rows

    def count(self) -> dict[str, int]:
        """Rows per target table."""
        out: dict[str, int] = defaultdict(int)
        for group in (self.objects, self.mappings, self.lookups):
            for (_, table), rows in group.items():
                out[table] += len(rows)
        return dict(out)


class Builder:
    """Builds target rows for valid legacy rows of one table.

    The hot loop composes each new ID of a legacy ID below 2**35 inline (shard, type and
    local ID are in range by construction, as in ``NewIds.new_id``), and asks ``NewIds``
    only for the others."""

    def __init__(self, table: LegacyTable, resolver: Resolver, newids: NewIds,
                 buckets: int) -> None:
        self.table, self.resolver, self.newids, self.buckets = table, resolver, newids, buckets
        self._refs = [(r.field, SPEC[r.table], resolver.verdicts[r.table],
                       ids.TYPES[SPEC[r.table].type_name] << ids.TYPE_SHIFT) for r in table.refs]
        self._type_id = ids.TYPES[table.type_name] if table.is_object else None
        self._self_bits = None if self._type_id is None else self._type_id << ids.TYPE_SHIFT
        refs = {r.field for r in table.refs}
        # how each document field is filled: 0 as read, 1 an ISO time, 2 a new ID
        self._doc = [(f, 2 if f in refs else 1 if f == "created_at" else 0)
                     for f in table.fields]

    def referenced(self, judged: list[tuple[dict, Verdict]]) -> list[tuple]:
        """``(table, legacy_id, shard)`` of every object these rows create or point at whose
        new ID is not a pure function of it (legacy IDs of 2**35 and above, or 0)."""
        t = self.table
        out = [(t, row["id"], v.shard) for row, v in judged
               if not 0 < row["id"] < SMALL_LIMIT] if t.is_object else []
        for f, spec, verdicts, _ in self._refs:
            out += [(spec, rid, verdicts[rid].shard) for row, _ in judged
                    if not 0 < (rid := row[f]) < SMALL_LIMIT]
        return out

    def resolvable(self, row: dict, v: Verdict) -> bool:
        """Whether every new ID the row needs is known (always true after allocation)."""
        return all(self.newids.known(t, legacy) for t, legacy, _ in self.referenced([(row, v)]))

    def new_ids(self, row: dict, v: Verdict) -> dict[str, int]:
        """New IDs of the row itself (``SELF``) and of every object it references."""
        out = {}
        for f, spec, verdicts, bits in self._refs:
            legacy = row[f]
            shard = verdicts[legacy].shard
            out[f] = (shard << _SHARD_SHIFT) | bits | legacy if 0 < legacy < SMALL_LIMIT \
                else self.newids.new_id(spec, legacy, shard)
        if self._self_bits is not None:
            legacy = row["id"]
            out[SELF] = (v.shard << _SHARD_SHIFT) | self._self_bits | legacy \
                if 0 < legacy < SMALL_LIMIT else self.newids.new_id(self.table, legacy, v.shard)
        return out

    def build(self, judged: list[tuple[dict, Verdict]], allocate: bool = True) -> TargetRows:
        """Target rows of the valid rows in ``judged`` (the migration's hot loop)."""
        self.newids.prepare(self.referenced(judged), allocate)
        out = TargetRows()
        t = self.table
        mappings = [(m.table, m.from_, m.to) for m in t.mappings]
        lookups = [(lk.table, lk.field) for lk in t.lookups]
        new_ids, obj, by_map = self.new_ids, self._object if t.is_object else None, out.mappings
        for row, v in judged:
            new = new_ids(row, v)
            if obj is not None:
                obj(out, row, v, new)
            if mappings:
                seq = unix(row["created_at"])
                for name, frm_field, to_field in mappings:
                    frm = new[frm_field]
                    by_map[(frm >> _SHARD_SHIFT, name)].append((frm, new[to_field], seq))
            for name, field_name in lookups:
                if row[field_name] is not None:
                    key = str(row[field_name]).lower()
                    out.lookups[(bucket_of(key, self.buckets), name)].append((key, new[SELF]))
        return out

    def _object(self, out: TargetRows, row: dict, v: Verdict, new: dict[str, int]) -> None:
        t = self.table
        legacy, own = row["id"], new[SELF]
        doc: dict = {"legacy_id": legacy}
        for f, how in self._doc:
            doc[f] = row[f] if how == 0 else iso(row[f]) if how == 1 else new[f]
        out.objects[(v.shard, t.name)].append((own & ids.MAX_LOCAL, dumps(doc), legacy))
        b = bucket_of(legacy_key(t.type_name, legacy), self.buckets)
        out.lookups[(b, "legacy_id_map")].append((self._type_id, legacy, own))
