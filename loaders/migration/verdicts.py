"""Which legacy rows migrate, and where: verdicts on legacy rows, evaluated from the source.

A row migrates iff its required fields are present (a ``created_at`` must not be
NULL or a zero date), its mod-shard lookup keys fit their column, and every row it
references exists and itself migrates.
Referenced rows are read from the legacy database in batches, so a chunk never
waits for another table's chunks: validity and placement are pure functions of
the legacy data (and of the open-shard list frozen in the run).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from loaders.migration import when
from loaders.migration.legacy import LegacyReader
from loaders.migration.spec import RANDOM, SPEC, LegacyTable, Lookup, Ref
from sharding.modshard import md5
from sharding.schema import LOOKUP_KEY_CHARS


class Verdict(NamedTuple):
    """Whether a row migrates; if not, why; if so, its shard (object tables)."""

    valid: bool
    reason: str | None = None
    detail: str | None = None
    shard: int | None = None


def user_placement(open_shards: list[int]) -> Callable[[int], int]:
    """A user's shard: a pseudo-random open shard, a pure function of its legacy ID."""
    shards = sorted(open_shards)

    def place(legacy_id: int) -> int:
        h = int.from_bytes(md5(f"user:{legacy_id}".encode()).digest()[:8], "big")
        return shards[h % len(shards)]
    return place


MAX_VERDICTS = 1_000_000
_VALID: dict[int | None, Verdict] = {}


def _bad(reason: str, detail: str | None = None) -> Verdict:
    return Verdict(False, reason, detail)


def _key_too_long(lookup: Lookup, value: object) -> Verdict | None:
    """``<field>_too_long`` when the lower-cased value is longer than a mod-shard lookup key
    holds (``str.lower()`` may lengthen it: "İ" becomes two characters): written, it would
    fail its chunk's lookups for good. The detail names the sizes, never the value."""
    if value is None:
        return None
    n = len(str(value).lower())
    if n <= LOOKUP_KEY_CHARS:
        return None
    return _bad(f"{lookup.field}_too_long", f"{lookup.field} is {n} characters lower-cased, "
                f"{lookup.table} keys hold at most {LOOKUP_KEY_CHARS}: shorten it")


def _valid(shard: int | None) -> Verdict:
    """The verdict "migrates to ``shard``", one shared instance per shard (keeps caches small)."""
    v = _VALID.get(shard)
    if v is None:
        v = _VALID[shard] = Verdict(True, shard=shard)
    return v


class Verdicts:
    """Verdicts on legacy objects, and IDs found absent, kept across the chunks one process
    runs for one run: a pins chunk need not fetch again the boards an earlier chunk judged.

    A verdict is a pure function of the legacy data, which a migration reads as a fixed
    source; ``farm verify`` re-reads it in runs of its own. Bounded: ``trim`` between
    chunks forgets everything past ``limit`` entries.
    """

    def __init__(self, limit: int = MAX_VERDICTS) -> None:
        self.limit = limit
        self.by_table: dict[str, dict[int, Verdict]] = {
            t: {} for t, s in SPEC.items() if s.is_object}
        self.absent: dict[str, set[int]] = {t: set() for t in self.by_table}

    def size(self) -> int:
        """Entries held."""
        return sum(map(len, self.by_table.values())) + sum(map(len, self.absent.values()))

    def trim(self) -> None:
        """Forget everything if more than ``limit`` entries are held."""
        if self.size() > self.limit:
            for d in (*self.by_table.values(), *self.absent.values()):
                d.clear()


class Resolver:
    """Fetches referenced legacy rows on demand and judges one chunk's rows, memoising
    verdicts per object in ``Verdicts`` (shared with the process's later chunks)."""

    def __init__(self, reader: LegacyReader, place_user: Callable[[int], int],
                 verdicts: Verdicts | None = None) -> None:
        self.reader = reader
        self.place_user = place_user
        memo = verdicts if verdicts is not None else Verdicts()
        self.verdicts, self._absent = memo.by_table, memo.absent
        self.rows: dict[str, dict[int, dict]] = {t: {} for t in self.verdicts}
        self._plans: dict[str, _Checks] = {}

    def load(self, table: LegacyTable, rows: list[dict]) -> None:
        """Take a chunk's own rows, fetch everything they reference, and judge every object
        fetched (a parent of a row rejected for its own fields is remembered too). The
        chunk's own rows are left to the caller, who judges each of them next.

        Own rows are judged as read now: a verdict remembered from when an earlier chunk
        fetched the row as a parent is forgotten (the row may have changed since, and a
        chunk writes the row it read)."""
        if table.is_object:
            own = [r["id"] for r in rows]
            for legacy_id in own:
                self.verdicts[table.name].pop(legacy_id, None)
            self._absent[table.name].difference_update(own)
            self.rows[table.name].update(zip(own, rows, strict=True))
        self._fetch_refs(table, rows)
        for name, fetched in self.rows.items():
            if name != table.name:
                spec = SPEC[name]
                for row in fetched.values():
                    self.judge(spec, row)

    def _fetch_refs(self, table: LegacyTable, rows: list[dict]) -> None:
        for ref in table.refs:
            self.ensure(ref.table, {r[ref.field] for r in rows if r[ref.field] is not None})

    def ensure(self, table_name: str, ids: set[int]) -> None:
        """Fetch rows of ``table_name`` neither seen nor judged yet, and (recursively) what
        they reference."""
        known, absent = self.rows[table_name], self._absent[table_name]
        judged = self.verdicts[table_name]
        todo = {i for i in ids if i not in judged and i not in known and i not in absent}
        if not todo:
            return
        table = SPEC[table_name]
        fetched = self.reader.by_ids(table, todo, table.judge_columns)
        known.update(fetched)
        absent.update(todo - fetched.keys())
        self._fetch_refs(table, list(fetched.values()))

    def judge(self, table: LegacyTable, row: dict) -> Verdict:
        """The verdict on one row (memoised for object rows: ``judge_rows``)."""
        return self.judge_rows(table, [row])[0]

    def judge_rows(self, table: LegacyTable, rows: list[dict]) -> list[Verdict]:
        """The verdict on each of ``rows``, memoised for object rows (the hot loop: the
        table's checks are looked up once, not once a row)."""
        memo, checks, judge = self.verdicts.get(table.name), self._checks(table), self._judge
        if memo is None:  # link tables (follows, likes): nothing to remember
            return [judge(checks, row) for row in rows]
        out = []
        for row in rows:
            v = memo.get(row["id"])
            if v is None:
                v = memo[row["id"]] = judge(checks, row)
            out.append(v)
        return out

    def _parent(self, table_name: str, legacy_id: int) -> Verdict | None:
        """The verdict on a referenced object, or ``None`` if it does not exist."""
        v = self.verdicts[table_name].get(legacy_id)
        if v is None:
            row = self.rows[table_name].get(legacy_id)
            if row is not None:
                v = self.judge(SPEC[table_name], row)
        return v

    def _checks(self, table: LegacyTable) -> _Checks:
        """What judging a row of ``table`` looks at, resolved once per table."""
        checks = self._plans.get(table.name)
        if checks is None:
            checks = self._plans[table.name] = _Checks(
                tuple((f, f == "created_at") for f in table.required), table.lookups,
                tuple((r, self.verdicts[r.table]) for r in table.refs),
                table.placement == RANDOM, table.placement)
        return checks

    def _judge(self, checks: _Checks, row: dict) -> Verdict:
        for f, is_time in checks.required:
            value = row[f]
            if value is None:
                return _bad(f"null_{f}")
            if is_time and when.parse(value) is None:
                zero = value.startswith("0000-00-00")
                return _bad("zero_created_at" if zero else "invalid_created_at", value)
        for lookup in checks.lookups:
            too_long = _key_too_long(lookup, row[lookup.field])
            if too_long is not None:
                return too_long
        shard = None
        for ref, known in checks.refs:
            rid = row[ref.field]
            v = None if rid is None else known.get(rid)
            if v is None and rid is not None:  # not judged yet (or absent)
                v = self._parent(ref.table, rid)
            if v is None:
                return _bad(f"missing_{ref.role}", f"{ref.field}={rid}")
            if not v.valid:
                return _bad(f"{ref.role}_quarantined", f"{ref.field}={rid} ({v.reason})")
            if ref.field == checks.placement:
                shard = v.shard
        if checks.random:
            return _valid(self.place_user(row["id"]))
        return _valid(shard)


class _Checks(NamedTuple):
    """A table's checks: required fields (and whether each is a time), lookups, references
    with the verdicts on their table, and where a valid row goes (``random``, or the
    reference field it follows)."""

    required: tuple[tuple[str, bool], ...]
    lookups: tuple[Lookup, ...]
    refs: tuple[tuple[Ref, dict[int, Verdict]], ...]
    random: bool
    placement: str | None
