"""Turn judged legacy rows into target rows: objects, mapping rows and mod-shard lookups."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from loaders.newids import NewIds
from loaders.resolve import Resolver, Verdict
from loaders.spec import SELF, SPEC, LegacyTable
from loaders.when import iso, unix
from sharding import ids
from sharding.jsondoc import dumps
from sharding.modshard import bucket_of, legacy_key


@dataclass
class TargetRows:
    """Everything one chunk writes, grouped by destination database."""

    objects: dict[tuple[int, str], list[tuple]] = field(default_factory=lambda: defaultdict(list))
    mappings: dict[tuple[int, str], list[tuple]] = field(default_factory=lambda: defaultdict(list))
    lookups: dict[tuple[int, str], list[tuple]] = field(default_factory=lambda: defaultdict(list))

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
        self._refs = {r.field: (SPEC[r.table], resolver.verdicts[r.table]) for r in table.refs}
        self._type_id = ids.TYPES[table.type_name] if table.is_object else None

    def referenced(self, judged: list[tuple[dict, Verdict]]) -> list[tuple]:
        """``(table, legacy_id, shard)`` of every object these rows create or point at."""
        out = []
        for row, v in judged:
            if self.table.is_object:
                out.append((self.table, row["id"], v.shard))
            for ref in self.table.refs:
                rid = row[ref.field]
                out.append((SPEC[ref.table], rid, self.resolver.shard_of(ref.table, rid)))
        return out

    def resolvable(self, row: dict, v: Verdict) -> bool:
        """Whether every new ID the row needs is known (always true after allocation)."""
        return all(self.newids.known(t, legacy) for t, legacy, _ in self.referenced([(row, v)]))

    def ref_id(self, row: dict, field_name: str) -> int:
        """New ID of the object referenced by ``field_name`` (hot path: plain dict lookups)."""
        spec, verdicts = self._refs[field_name]
        rid = row[field_name]
        return self.newids.new_id(spec, rid, verdicts[rid].shard)

    def build(self, judged: list[tuple[dict, Verdict]], allocate: bool = True) -> TargetRows:
        """Target rows of the valid rows in ``judged`` (the migration's hot loop)."""
        self.newids.prepare(self.referenced(judged), allocate)
        out = TargetRows()
        t = self.table
        mappings = [(m.table, m.from_, m.to) for m in t.mappings]
        lookups = [(lk.table, lk.field) for lk in t.lookups]
        for row, v in judged:
            own = self._object(out, row, v) if t.is_object else None
            if mappings:
                seq = unix(row["created_at"])
                for name, frm_field, to_field in mappings:
                    frm = own if frm_field == SELF else self.ref_id(row, frm_field)
                    to = own if to_field == SELF else self.ref_id(row, to_field)
                    out.mappings[(frm >> ids.SHARD_SHIFT, name)].append((frm, to, seq))
            for name, field_name in lookups:
                if row[field_name] is not None:
                    key = str(row[field_name]).lower()
                    out.lookups[(bucket_of(key, self.buckets), name)].append((key, own))
        return out

    def _object(self, out: TargetRows, row: dict, v: Verdict) -> int:
        t = self.table
        legacy = row["id"]
        new = self.newids.new_id(t, legacy, v.shard)
        doc: dict = {"legacy_id": legacy}
        refs = self._refs
        for f in t.fields:
            value = row[f]
            if f == "created_at":
                value = iso(value)
            elif f in refs:
                value = self.ref_id(row, f)
            doc[f] = value
        out.objects[(v.shard, t.name)].append((new & ids.MAX_LOCAL, dumps(doc)))
        b = bucket_of(legacy_key(t.type_name, legacy), self.buckets)
        out.lookups[(b, "legacy_id_map")].append((self._type_id, legacy, new))
        return new
