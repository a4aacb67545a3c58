"""The migration's per-row Python work alone, in this process, without any server.

Usage: ``python -m benchmarks.migrate_hot [--users N] [--repeat N] [--slice-size R]``.

The synthetic legacy data set of ``farm legacy generate`` is made in memory and served by
a reader that hands out its rows as the legacy server's ``JSON_ARRAYAGG`` pages would be
(JSON text, decoded here); every table is then, slice by slice, judged, built, given the
survey's key conditions, rendered as ``LOAD DATA`` text and mod-bucket upserts: the work
a worker does per legacy row, without the round trips around it. CPU seconds
(``time.process_time``, best of ``--repeat``) per legacy row, per table. Deterministic:
run it under ``valgrind --tool=callgrind`` (with ``--users 1000``) for instruction counts
that other work on the machine does not change.
"""

from __future__ import annotations

import argparse
import hashlib
import time
from collections.abc import Callable, Iterable
from operator import itemgetter

import orjson
import pymysql

from demo.legacygen.generate import build as generate
from demo.legacygen.write import _when
from loaders.migration import claims, converge, legacy, when, writer
from loaders.migration.build import Builder, TargetRows
from loaders.migration.migrate import judge_chunk
from loaders.migration.newids import NewIds
from loaders.migration.present import Held, Selection
from loaders.migration.spec import ORDER, SPEC, LegacyTable, legacy_key
from loaders.migration.verdicts import Verdicts
from shardfarm import collector
from sharding import ids

SHARDS = 16
BUCKETS = 4096


class MemoryReader:
    """The legacy reader's interface over rows held in memory, each read through JSON text
    as the legacy server sends it."""

    def __init__(self, tables: dict[str, list[list]]) -> None:
        self.tables: dict[str, list[dict]] = {}
        self._texts: dict[tuple, list[bytes]] = {}
        self.by_id: dict[str, dict[int, dict]] = {}
        for name, rows in tables.items():
            cols = SPEC[name].columns
            made = [dict(zip(cols, self._row(name, r), strict=True)) for r in rows]
            self.tables[name] = made
            if SPEC[name].is_object:
                self.by_id[name] = {r["id"]: r for r in made}

    @staticmethod
    def _row(name: str, row: list) -> list:
        from loaders.migration.legacy_schema import LEGACY_COLUMNS
        values = dict(zip(LEGACY_COLUMNS[name], row, strict=True))
        values["created_at"] = None if row[-1] is None else _when(row[-1])
        return [values[c] for c in SPEC[name].columns]

    def _pages(self, table: LegacyTable, key: tuple, rows: Callable[[], list[dict]],
               cols: tuple[str, ...]) -> list[dict]:
        """The rows decoded from their JSON pages (rendered once: a repeated read decodes
        the same text again, and only the decoding is the reader's work)."""
        pages = self._texts.get(key)
        if pages is None:
            made = rows()
            pages = self._texts[key] = [
                orjson.dumps([{c: r[c] for c in cols} for r in made[i:i + legacy.AGG_ROWS]])
                for i in range(0, len(made), legacy.AGG_ROWS)]
        out: list[dict] = []
        for page in pages:
            out += orjson.loads(page)
        return sorted(out, key=itemgetter(*table.key))

    def chunk(self, table: LegacyTable, lo: int, hi: int) -> list[dict]:
        """Rows whose first key column is in ``[lo, hi]``."""
        k = table.key[0]
        return self._pages(table, (table.name, lo, hi), lambda: [
            r for r in self.tables[table.name] if lo <= r[k] <= hi], table.columns)

    def by_ids(self, table: LegacyTable, wanted: Iterable[int],
               cols: tuple[str, ...] | None = None) -> dict[int, dict]:
        """Rows of an object table by ``id``."""
        have = self.by_id[table.name]
        wanted = sorted(set(wanted))
        cols = cols or table.columns
        rows = self._pages(table, (table.name, cols, *wanted),
                           lambda: [have[i] for i in wanted if i in have], cols)
        return {r["id"]: r for r in rows}


class MemoryIds(NewIds):
    """New IDs with big legacy IDs given made-up local IDs (no server to allocate them)."""

    def __init__(self) -> None:
        super().__init__(None, {})  # type: ignore[arg-type]

    def prepare(self, wanted: Iterable[tuple[LegacyTable, int, int]],
                allocate: bool = True) -> None:
        """Record a new ID for every big legacy ID not yet known on its shard."""
        for tbl, legacy_id, shard in wanted:
            key = (ids.TYPES[tbl.type_name], legacy_id)
            if not (0 < legacy_id < ids.FIRST_ALLOCATED) and not self._placed(key, shard):
                self.cache[key] = ids.encode(shard, key[0], ids.FIRST_ALLOCATED + len(self.cache))


def slices(reader: MemoryReader, table: str, slice_rows: int) -> list[Selection]:
    """The table's first-key ranges of about ``slice_rows`` rows."""
    keys = sorted({r[SPEC[table].key[0]] for r in reader.tables[table]})
    return [Selection(keys[i], keys[min(i + slice_rows, len(keys)) - 1])
            for i in range(0, len(keys), slice_rows)]


def one_slice(reader: MemoryReader, verdicts: Verdicts, newids: MemoryIds, table: str,
              sel: Selection, conn: pymysql.Connection, digest: hashlib._Hash | None = None) -> int:
    """A worker's per-row work on one slice; returns the rows read. ``digest``: updated
    with everything the slice would write and quarantine."""
    spec = SPEC[table]
    params = {"open_shards": list(range(SHARDS))}
    resolver, judged = judge_chunk(reader, params, table, 0, -1, verdicts, sel)  # type: ignore
    good = [(r, v) for r, v in judged if v.valid]
    target = Builder(spec, resolver, newids, BUCKETS).build(good)
    if spec.is_object:
        target = converge.changed(target, Held(), ids.TYPES[spec.type_name])
    out = render(target, conn)
    if digest is not None:
        digest.update(repr(sorted([(legacy_key(spec, r), v.reason, v.detail) for r, v in judged
                                   if not v.valid])).encode())
        for key, text in sorted(out):
            digest.update(repr(key).encode() + (text if isinstance(text, bytes) else
                                                repr(text).encode()))
    return len(judged)


def render(target: TargetRows, conn: pymysql.Connection) -> list[tuple[tuple, object]]:
    """The survey's conditions, ``LOAD DATA`` text and mod-bucket upserts of ``target``."""
    out: list[tuple[tuple, object]] = []
    for key, rows in target.objects.items():
        claims._conditions([r[0] for r in rows], True)
        out.append((key, writer._tsv_backslash_escaped("object", rows)))
    for key, rows in target.mappings.items():
        out.append((key, writer._tsv_backslash_escaped("mapping", rows)))
    for (b, name), rows in target.lookups.items():
        out.append(((b, name), writer._mod_statements(conn, b, name, rows)))
    return out


def run(users: int, repeat: int, slice_rows: int, digest: bool = False) -> None:
    """Best CPU seconds of ``repeat`` runs over every table, per table; with ``digest``,
    one more run whose output's SHA-256 is printed (equal before and after a change that
    must not change what is written)."""
    data = generate(users, 1)
    reader = MemoryReader(data.tables)
    conn = pymysql.connections.Connection(defer_connect=True, charset="utf8mb4")
    conn.server_status = 0  # backslash escapes, as on the servers
    best: dict[str, tuple[float, int]] = {}
    sels = {table: slices(reader, table, slice_rows) for table in ORDER}
    for _ in range(repeat):
        verdicts, newids = Verdicts(), MemoryIds()
        when.parse.cache_clear()  # a process meets each row's time once
        for table in ORDER:
            start, n = time.process_time(), 0
            with collector.held_off():  # as a chunk runs
                for sel in sels[table]:
                    n += one_slice(reader, verdicts, newids, table, sel, conn)
            took = time.process_time() - start
            if table not in best or took < best[table][0]:
                best[table] = (took, n)
    if digest:
        h = hashlib.sha256()
        verdicts, newids = Verdicts(), MemoryIds()
        for table in ORDER:
            for sel in sels[table]:
                one_slice(reader, verdicts, newids, table, sel, conn, h)
        print(f"digest {h.hexdigest()}")
    for table, (took, n) in best.items():
        print(f"{table:<9} {n:>9,} rows {took:7.3f} s {1e6 * took / max(n, 1):6.2f} us/row")
    took, n = sum(t for t, _ in best.values()), sum(n for _, n in best.values())
    print(f"{'all':<9} {n:>9,} rows {took:7.3f} s {1e6 * took / max(n, 1):6.2f} us/row")


def main(argv: Iterable[str] | None = None) -> None:
    """Parse the options and run."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--slice-size", type=int, default=100_000)
    ap.add_argument("--digest", action="store_true", help="print a digest of the output")
    args = ap.parse_args(None if argv is None else list(argv))
    run(args.users, args.repeat, args.slice_size, args.digest)


if __name__ == "__main__":
    main()
