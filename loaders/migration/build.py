"""Turn judged legacy rows into target rows: objects, mapping rows and mod-shard lookups."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from loaders.migration.newids import NewIds, fits
from loaders.migration.spec import SELF, SPEC, LegacyTable
from loaders.migration.verdicts import Resolver, Verdict
from loaders.migration.when import iso, unix
from sharding import ids
from sharding.jsondoc import dumps
from sharding.modshard import bucket_of, legacy_key


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
    """Builds target rows for valid legacy rows of one table."""

    def __init__(self, table: LegacyTable, resolver: Resolver, newids: NewIds,
                 buckets: int) -> None:
        self.table, self.resolver, self.newids, self.buckets = table, resolver, newids, buckets
        self._refs = [(r.field, SPEC[r.table], resolver.verdicts[r.table]) for r in table.refs]
        self._type_id = ids.TYPES[table.type_name] if table.is_object else None
        refs = {r.field for r in table.refs}
        # how each document field is filled: 0 as read, 1 an ISO time, 2 a new ID
        self._doc = [(f, 2 if f in refs else 1 if f == "created_at" else 0)
                     for f in table.fields]

    def referenced(self, judged: list[tuple[dict, Verdict]]) -> list[tuple]:
        """``(table, legacy_id, shard)`` of every object these rows create or point at whose
        new ID is not a pure function of it (legacy IDs of 2**35 and above, or 0)."""
        out = []
        t = self.table
        for row, v in judged:
            if t.is_object and not fits(row["id"]):
                out.append((t, row["id"], v.shard))
            for field_name, spec, verdicts in self._refs:
                rid = row[field_name]
                if not fits(rid):
                    out.append((spec, rid, verdicts[rid].shard))
        return out

    def resolvable(self, row: dict, v: Verdict) -> bool:
        """Whether every new ID the row needs is known (always true after allocation)."""
        return all(self.newids.known(t, legacy) for t, legacy, _ in self.referenced([(row, v)]))

    def new_ids(self, row: dict, v: Verdict) -> dict[str, int]:
        """New IDs of the row itself (``SELF``) and of every object it references."""
        new_id = self.newids.new_id
        out = {f: new_id(spec, row[f], verdicts[row[f]].shard)
               for f, spec, verdicts in self._refs}
        if self.table.is_object:
            out[SELF] = new_id(self.table, row["id"], v.shard)
        return out

    def build(self, judged: list[tuple[dict, Verdict]], allocate: bool = True) -> TargetRows:
        """Target rows of the valid rows in ``judged`` (the migration's hot loop)."""
        self.newids.prepare(self.referenced(judged), allocate)
        out = TargetRows()
        t = self.table
        mappings = [(m.table, m.from_, m.to) for m in t.mappings]
        lookups = [(lk.table, lk.field) for lk in t.lookups]
        for row, v in judged:
            new = self.new_ids(row, v)
            if t.is_object:
                self._object(out, row, v, new)
            if mappings:
                seq = unix(row["created_at"])
                for name, frm_field, to_field in mappings:
                    frm = new[frm_field]
                    out.mappings[(frm >> ids.SHARD_SHIFT, name)].append((frm, new[to_field], seq))
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
