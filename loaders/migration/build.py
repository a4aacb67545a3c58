"""Turn judged legacy rows into target rows: objects, mapping rows and mod-shard lookups."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from operator import itemgetter

from loaders.migration.newids import SMALL_LIMIT, NewIds
from loaders.migration.spec import SELF, SPEC, LegacyTable
from loaders.migration.verdicts import Resolver, Verdict
from loaders.migration.when import parse
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
    only for the others. It groups rows by shard or bucket number alone (no key tuple a
    row), then names the tables once; a document is made in C from the row's values in
    field order, its references and time then set in place."""

    def __init__(self, table: LegacyTable, resolver: Resolver, newids: NewIds,
                 buckets: int) -> None:
        self.table, self.resolver, self.newids, self.buckets = table, resolver, newids, buckets
        self._refs = [(r.field, SPEC[r.table], resolver.verdicts[r.table],
                       ids.TYPES[SPEC[r.table].type_name] << ids.TYPE_SHIFT) for r in table.refs]
        self._type_id = ids.TYPES[table.type_name] if table.is_object else None
        self._self_bits = None if self._type_id is None else self._type_id << ids.TYPE_SHIFT
        # a document's keys, and the row's values for them (a reference as its legacy ID)
        self._doc_keys = ("legacy_id", *table.fields)
        self._doc_values = itemgetter("id", *table.fields) if table.fields \
            else lambda row: (row["id"],)
        self._doc_refs = tuple(r.field for r in table.refs if r.field in table.fields)
        self._doc_time = "created_at" in table.fields

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
        t = self.table
        new_ids, obj = self.new_ids, self._object if t.is_object else None
        objects: dict[int, list[tuple]] = defaultdict(list)  # by shard
        mapped: dict[int, list[tuple]] = defaultdict(list)  # legacy_id_map rows, by bucket
        mappings = [(m.from_, m.to, defaultdict(list)) for m in t.mappings]  # by shard
        lookups = [(lk.field, defaultdict(list)) for lk in t.lookups]  # by bucket
        buckets = self.buckets
        for row, v in judged:
            new = new_ids(row, v)
            when = parse(row["created_at"]) if mappings or self._doc_time else None
            if obj is not None:
                obj(objects, mapped, row, v, new, when)
            for frm_field, to_field, by_shard in mappings:
                frm = new[frm_field]
                by_shard[frm >> _SHARD_SHIFT].append((frm, new[to_field], when[1]))
            for field_name, by_bucket in lookups:
                if row[field_name] is not None:
                    key = str(row[field_name]).lower()
                    by_bucket[bucket_of(key, buckets)].append((key, new[SELF]))
        return self._named(objects, mapped, mappings, lookups)

    def _named(self, objects: dict, mapped: dict, mappings: list, lookups: list) -> TargetRows:
        """The rows grouped by shard or bucket, keyed ``(number, table)``."""
        t = self.table
        out = TargetRows()
        out.objects.update(((s, t.name), rows) for s, rows in objects.items())
        for m, (_, _, by_shard) in zip(t.mappings, mappings, strict=True):
            out.mappings.update(((s, m.table), rows) for s, rows in by_shard.items())
        out.lookups.update(((b, "legacy_id_map"), rows) for b, rows in mapped.items())
        for lk, (_, by_bucket) in zip(t.lookups, lookups, strict=True):
            out.lookups.update(((b, lk.table), rows) for b, rows in by_bucket.items())
        return out

    def _object(self, objects: dict, mapped: dict, row: dict, v: Verdict, new: dict[str, int],
                when: tuple[str, int] | None) -> None:
        legacy, own = row["id"], new[SELF]
        doc = dict(zip(self._doc_keys, self._doc_values(row), strict=True))
        for f in self._doc_refs:
            doc[f] = new[f]
        if when is not None:
            doc["created_at"] = when[0]
        objects[v.shard].append((own & ids.MAX_LOCAL, dumps(doc), legacy))
        b = bucket_of(legacy_key(self.table.type_name, legacy), self.buckets)
        mapped[b].append((self._type_id, legacy, own))
