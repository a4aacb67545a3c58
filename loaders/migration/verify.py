"""``farm verify``: compare the target with the source, chunk by chunk, reading only.

Each chunk re-reads its legacy rows, works out the rows the migration must have
written (objects, forward mapping rows, lookups), reads those rows back from the
shards and mod buckets, and records every difference with its legacy key. A
quarantined row that nevertheless has a new ID is a difference too. A digest of
the expected and the found rows is kept per chunk.
"""

from __future__ import annotations

import hashlib
from collections import Counter, defaultdict
from dataclasses import dataclass

from farmcore.context import ChunkContext
from farmcore.ledger import Outcome
from loaders.migration.build import Builder, TargetRows
from loaders.migration.migrate import judge_chunk, process_state, selections
from loaders.migration.present import Selection
from loaders.migration.spec import SELF, SPEC, LegacyTable, legacy_key
from shardfarm.mysql.inlist import IN_LIST_MAX
from sharding import ids
from sharding.jsondoc import dumps, loads
from sharding.router import Router
from sharding.schema import mod_table, shard_table

HANDLER = "loaders.migration.verify.verify_chunk"
IN_BATCH = IN_LIST_MAX
UNION_BUCKETS = 200
Problem = tuple[str, str, str, str]


def _select_in(router: Router, shard: int, sql: str, keys: list, width: int) -> list[tuple]:
    host = router.host_for(shard)
    mark = "(" + ",".join(["%s"] * width) + ")" if width > 1 else "%s"
    out: list[tuple] = []
    for i in range(0, len(keys), IN_BATCH):
        part = keys[i:i + IN_BATCH]
        params = [v for k in part for v in (k if width > 1 else (k,))]
        out += router.query(host, sql.format(marks=",".join([mark] * len(part))), params, shard)
    return out


class Checker:
    """Compares one chunk's expected target rows with what the target holds."""

    def __init__(self, router: Router, table: LegacyTable, owner: dict) -> None:
        self.router, self.table, self.owner = router, table, owner
        self.problems: list[Problem] = []
        self.found: list[str] = []

    def _bad(self, key: object, target: str, problem: str) -> None:
        self.problems.append((self.table.name, str(self.owner.get(key, key)), target, problem))

    def objects(self, shard: int, name: str, rows: list[tuple]) -> None:
        """Every expected object row exists, is active and holds exactly the document, and
        no slot is claimed by two legacy rows (e.g. two legacy IDs mapped to one new ID)."""
        claims: dict[int, list[tuple[str, int]]] = defaultdict(list)
        for local, doc, legacy in rows:
            claims[local].append((doc, legacy))
        got = {r[0]: r for r in _select_in(
            self.router, shard, f"SELECT local_id, data, active FROM {shard_table(shard, name)} "
            "WHERE local_id IN ({marks})", list(claims), 1)}
        for local, wanted in claims.items():
            row = got.get(local)
            if len(wanted) > 1:
                who = ", ".join(str(legacy) for _, legacy in wanted)
                for _, legacy in wanted:
                    self.problems.append((self.table.name, str(legacy), name,
                                          f"local_id {local} on shard {shard} is claimed by "
                                          f"legacy {who}"))
            else:
                self._object(shard, name, local, wanted[0][0], row)
            if row is not None:
                self.found.append(canon_object(name, shard, local, loads(row[1]), row[2]))

    def _object(self, shard: int, name: str, local: int, doc: str, row: tuple | None) -> None:
        """Compare one slot with the one document expected there."""
        new = ids.encode(shard, ids.TYPES[self.table.type_name], local)
        if row is None:
            self._bad(new, name, f"missing on shard {shard}")
        elif not row[2]:
            self._bad(new, name, "soft-deleted")
        elif loads(row[1]) != loads(doc):
            want, have = loads(doc), loads(row[1])
            if have.get("legacy_id") != want["legacy_id"]:
                self._bad(new, name, f"local_id {local} on shard {shard} holds legacy "
                                     f"{have.get('legacy_id')}")
                return
            diff = sorted(k for k, v in want.items() if have.get(k) != v)
            self._bad(new, name, f"data differs: {', '.join(diff) or 'extra keys'}")

    def mappings(self, shard: int, name: str, rows: list[tuple]) -> None:
        """Every expected mapping row exists on the from ID's shard with its sequence."""
        got = {(r[0], r[1]): r[2] for r in _select_in(
            self.router, shard, f"SELECT from_id, to_id, sequence FROM {shard_table(shard, name)}"
            " WHERE (from_id, to_id) IN ({marks})", [r[:2] for r in rows], 2)}
        for frm, to, seq in rows:
            have = got.get((frm, to))
            if have is None:
                self._bad((frm, to), name, f"missing on shard {shard}")
            elif have != seq:
                self._bad((frm, to), name, f"sequence {have} != {seq}")
            if have is not None:
                self.found.append(f"m|{name}|{frm}|{to}|{have}")

    def lookups(self, rows_by_bucket: dict[tuple[int, str], list[tuple]]) -> None:
        """Every lookup row exists in its bucket and names its user. A shared e-mail may name
        another user (the smallest ID); a username may not: usernames are unique, and two
        legacy users whose usernames are one once lower-cased (``'Kelvin'`` with a Kelvin
        sign, and ``'kelvin'``) would leave one of them unreachable by name."""
        got = self._fetch_lookups(rows_by_bucket)
        for (bucket, name), rows in rows_by_bucket.items():
            for row in rows:
                key = (name, bucket, str(row[0]), str(row[1]) if name == "legacy_id_map"
                       else None)
                want, have = row[-1], got.get(key)
                if have is None:
                    self._bad(want, name, f"missing in bucket {bucket}")
                elif have != want and (name != "email_to_user" or have > want):
                    self._bad(want, name, f"names {have}, expected {want}" + (
                        ": another legacy user has this username once lower-cased; rename "
                        "one" if name == "username_to_user" else ""))
                if have is not None and name == "legacy_id_map":
                    self.found.append(f"l|{name}|{row[0]}|{row[1]}|{have}")

    def _fetch_lookups(self, rows_by_bucket: dict) -> dict[tuple, int]:
        """One UNION ALL query per mod server and batch of buckets."""
        m = self.router.shardmap
        per_server: dict[tuple, list] = defaultdict(list)
        for (bucket, name), rows in sorted(rows_by_bucket.items()):
            per_server[m.mod_master(bucket).server].append((bucket, name, rows))
        got: dict[tuple, int] = {}
        for groups in per_server.values():
            host = m.mod_master(groups[0][0])
            for i in range(0, len(groups), UNION_BUCKETS):
                sql, params = _lookup_union(groups[i:i + UNION_BUCKETS])
                for name, bucket, k1, k2, value in self.router.query(host, sql, params):
                    # UNION ALL unifies column types: compare keys as text
                    got[(name, int(bucket), str(k1), None if k2 is None else str(k2))] = value
        return got


def _lookup_union(groups: list[tuple[int, str, list]]) -> tuple[str, list]:
    parts, params = [], []
    for bucket, name, rows in groups:
        q = mod_table(bucket, name)
        if name == "legacy_id_map":
            marks = ",".join(["(%s,%s)"] * len(rows))
            parts.append(f"SELECT 'legacy_id_map', {bucket}, type_id, legacy_id, new_id FROM {q}"
                         f" WHERE (type_id, legacy_id) IN ({marks})")
            params += [v for r in rows for v in r[:2]]
        else:
            col = "username" if name == "username_to_user" else "email"
            marks = ",".join(["%s"] * len(rows))
            parts.append(f"SELECT '{name}', {bucket}, {col}, NULL, user_id FROM {q} "
                         f"WHERE {col} IN ({marks})")
            params += [r[0] for r in rows]
    return " UNION ALL ".join(parts), params


def _owners(builder: Builder, judged: list) -> dict:
    """Target key (new ID or mapping pair) -> legacy key, to name mismatches."""
    t = builder.table
    out: dict = {}
    for row, v in judged:
        key = legacy_key(t, row)
        new = builder.new_ids(row, v)
        if t.is_object:
            out[new[SELF]] = key
        for m in t.mappings:
            if m.from_ != SELF and m.to != SELF:
                out[(new[m.from_], new[m.to])] = key
    return out


def canon_object(name: str, shard: int, local: int, doc: dict, active: int) -> str:
    """Canonical text of an object row for the content digest."""
    return f"o|{name}|{shard}|{local}|{dumps(dict(sorted(doc.items())))}|{int(active)}"


def _digest(items: list[str]) -> str:
    return hashlib.sha256("\n".join(sorted(items)).encode()).hexdigest()[:16]


def _quarantined_but_present(ctx: ChunkContext, table: LegacyTable, bad: list) -> list[Problem]:
    """A quarantined object that has a ``legacy_id_map`` entry was migrated after all."""
    if not table.is_object or not bad:
        return []
    keys = [(ids.TYPES[table.type_name], r["id"]) for r, _ in bad]
    found = process_state(ctx).newids(ctx)._lookup(keys)
    return [(table.name, str(legacy), "legacy_id_map", "quarantined row has a new ID")
            for (_, legacy) in found]


def verify_chunk(ctx: ChunkContext, table: str, lo: int, hi: int,
                 slices: list[list[int]] | None = None) -> Outcome:
    """Chunk handler: check legacy rows ``lo..hi`` of ``table`` against the target, slice by
    slice; the chunk's digests are those of its one slice, or of its slices' digests."""
    problems: list[Problem] = []
    read = written = 0
    counts: Counter = Counter()
    digests: list[tuple[str, str]] = []
    for sel in selections(lo, hi, slices):
        out = _verify_slice(ctx, SPEC[table], sel)
        problems += out.problems
        read, written = read + out.read, written + out.written
        counts.update(out.expected)
        digests.append((out.want, out.have))
    want, have = digests[0] if len(digests) == 1 else (
        _digest([w for w, _ in digests]), _digest([h for _, h in digests]))
    ctx.ledger.mismatches.record(ctx.lease, problems)
    return Outcome(rows_read=read, rows_written=written, rows_quarantined=len(problems),
                   counts={"expected": dict(counts), "mismatches": len(problems),
                           "digest_expected": want, "digest_found": have})


@dataclass
class Checked:
    """One slice's verification: its mismatches, rows, expected rows and digests."""

    problems: list[Problem]
    read: int
    written: int
    expected: dict[str, int]
    want: str
    have: str


def _verify_slice(ctx: ChunkContext, spec: LegacyTable, sel: Selection) -> Checked:
    """Check the legacy rows of one selection against the target."""
    st = process_state(ctx)
    table = spec.name
    resolver, judged = judge_chunk(st.reader, ctx.params, table, 0, -1, st.verdicts, sel)
    newids = st.newids(ctx)
    builder = Builder(spec, resolver, newids, ctx.router.shardmap.buckets)
    good = [(r, v) for r, v in judged if v.valid]
    newids.prepare(builder.referenced(good), allocate=False)
    missing = [(r, v) for r, v in good if not builder.resolvable(r, v)]
    good = [(r, v) for r, v in good if builder.resolvable(r, v)]
    expected = builder.build(good, allocate=False)
    checker = Checker(ctx.router, spec, _owners(builder, good))
    checker.problems += [(table, legacy_key(spec, r), "legacy_id_map", "no new ID recorded")
                         for r, _ in missing]
    checker.problems += _quarantined_but_present(ctx, spec, [(r, v) for r, v in judged
                                                             if not v.valid])
    _compare(checker, expected)
    want, have = _digest(_expected_items(expected)), _digest(checker.found)
    if want != have and not checker.problems:
        checker.problems.append((table, f"{sel.lo}..{sel.hi}", "*", "content digest differs"))
    return Checked(checker.problems, len(judged), len(good), expected.count(), want, have)


def _compare(checker: Checker, expected: TargetRows) -> None:
    for (shard, name), rows in expected.objects.items():
        checker.objects(shard, name, rows)
    for (shard, name), rows in expected.mappings.items():
        checker.mappings(shard, name, rows)
    checker.lookups(dict(expected.lookups))


def _expected_items(expected: TargetRows) -> list[str]:
    """Canonical text of every expected row (shared e-mail/username lookups excluded)."""
    out = [canon_object(n, s, local, loads(doc), 1)
           for (s, n), rows in expected.objects.items() for local, doc, _ in rows]
    out += [f"m|{n}|{a}|{b}|{c}" for (_, n), rows in expected.mappings.items()
            for a, b, c in rows]
    out += [f"l|{n}|{t}|{legacy}|{new}" for (_, n), rows in expected.lookups.items()
            if n == "legacy_id_map" for t, legacy, new in rows]
    return out

