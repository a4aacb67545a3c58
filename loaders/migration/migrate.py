"""``farm migrate``: plan chunks of the legacy tables and load one chunk at a time.

A chunk is a range of a legacy table's first key column holding about
``chunk_rows`` rows, cut into consecutive *slices* of about ``slice_rows`` rows (a
worker holds one slice at a time). Loading a slice: read its rows, judge them
(fetching what they reference), build objects, forward mapping rows and mod-shard
lookups, write its objects grouped by destination, and remove what its rows no longer
imply. The mapping rows and mod-shard lookups of every slice (a few integers or a short
key each) are written once at the end of the chunk: an object chunk writes to every one
of the 4,096 mod buckets (and of 4,096 shards at full size), so a statement per bucket
and shard table per chunk, not per slice. Then the bad rows are quarantined with their
reason.
Chunks run in any order, any number of times, with the same result.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from farmcore.context import ChunkContext
from farmcore.ledger import ChunkSpec, Ledger, Outcome
from loaders.migration import binlog, claims, converge, present, runwatch, writer
from loaders.migration.build import Builder, TargetRows
from loaders.migration.legacy import LegacyReader
from loaders.migration.newids import IdCache, NewIds
from loaders.migration.present import Selection
from loaders.migration.spec import ORDER, SPEC, LegacyTable, legacy_key
from loaders.migration.verdicts import Resolver, Verdict, Verdicts, user_placement
from shardfarm import collector
from shardfarm.errors import ConfigError, UsageError
from shardfarm.mysql.inlist import IN_LIST_MAX
from shardfarm.settings import Settings
from sharding import ids
from sharding.fencing import FenceToken
from sharding.router import Router

HANDLER = "loaders.migration.migrate.load_chunk"
# Every chunk of an object table writes each mod bucket (4,096 of them) once, so rows per
# chunk set rows per statement: 100k rows put ~25 lookups in each, and those statements were
# a fifth of the server's time at 10x. Slices keep a worker's legacy rows to 100k at a time
# (a first load on thousands of shards holds the chunk's objects until its end: ``thin``).
DEFAULT_CHUNK_ROWS = 400_000
DEFAULT_SLICE_ROWS = 100_000
IN_BATCH = IN_LIST_MAX
PAIR_BATCH = 500
KEY_LIMIT = (1 << 64) - 1


def plan(settings: Settings, router: Router, ledger: Ledger,
         chunk_rows: int = DEFAULT_CHUNK_ROWS, slice_rows: int = DEFAULT_SLICE_ROWS
         ) -> tuple[dict, list[ChunkSpec]]:
    """Run parameters and chunks of a migration of the whole legacy database."""
    params, chunks = plan_source(settings, chunk_rows, slice_rows)
    return run_params(router, ledger, params), chunks


def run_params(router: Router, ledger: Ledger, source_params: dict) -> dict:
    """A run's parameters: ``plan_source``'s, with what the target and the ledger say at
    planning time (the open shards, the fresh tables)."""
    return {"open_shards": open_shards(router, ledger), "fresh": fresh_tables(router, ledger),
            **source_params}


def fresh_tables(router: Router, ledger: Ledger) -> list[str]:
    """The legacy tables the target holds nothing of, as a run's plan finds them: of an
    object table no row (active or not) on any shard and no ``legacy_id_map`` row of its
    type, of a link table no row of its forward mapping tables. A chunk of one may skip
    reading what the target holds for its range on its first attempt (``first_load``).
    None while another migrate run is running or paused (its chunks may write any range
    meanwhile)."""
    if ledger.runs(limit=1, active_only=True, kind=runwatch.KIND):
        return []
    mapped = present.mapped_types(router)
    return [t for t in ORDER if (SPEC[t].type_name is None or
                                 ids.TYPES[SPEC[t].type_name] not in mapped)
            and present.tables_empty(router, (t,) if SPEC[t].is_object
                                     else tuple(m.table for m in SPEC[t].mappings))]


def first_load(ctx: ChunkContext, table: str) -> bool:
    """Whether this chunk writes into a target that holds nothing for its range, known
    without reading it: ``table`` was fresh when the run was planned (``fresh_tables``),
    the run is still the latest migrate run (no run planned after it has written), and this
    is the chunk's first claim (fence 1: no earlier attempt, nor a zombie of one, has
    written). Then the target holds, of the chunk's range, only what other chunks of the
    run allocated for legacy IDs of 2**35 and above (placeholders and their
    ``legacy_id_map`` rows, which the slot survey and the upserts take as they are) and
    nothing to take out: a read would change nothing the chunk leaves."""
    return (table in ctx.params.get("fresh", ()) and ctx.token.fence == 1
            and ctx.ledger.latest_run(runwatch.KIND) == ctx.run_id)


def plan_source(settings: Settings, chunk_rows: int = DEFAULT_CHUNK_ROWS,
                slice_rows: int = DEFAULT_SLICE_ROWS) -> tuple[dict, list[ChunkSpec]]:
    """What ``plan`` reads from the legacy database alone (its chunks, and the run's
    parameters but the open shards): a legacy database that is missing or unreachable
    fails here, before anything asks the control database."""
    if chunk_rows < 1:
        raise UsageError(f"--chunk-size must be at least 1, got {chunk_rows}")
    if slice_rows < 1:
        raise UsageError(f"--slice-size must be at least 1, got {slice_rows}")
    reader = LegacyReader(settings.legacy_dsn)
    try:
        binlog_pos = binlog.followable_position(reader)  # before any row is read
        chunks = [ChunkSpec(t, chunk_args(t, part), rows=sum(n for _, _, n in part))
                  for t in ORDER for part in sliced(
                      covering(reader.plan(SPEC[t], min(chunk_rows, slice_rows))), chunk_rows)]
    finally:
        reader.close()
    params = {"chunk_rows": chunk_rows, "slice_rows": slice_rows, "kinds": list(ORDER),
              "binlog_pos": binlog_pos}
    return params, chunks


def sliced(ranges: list[tuple[int, int, int]], chunk_rows: int
           ) -> list[list[tuple[int, int, int]]]:
    """Consecutive ``(lo, hi, rows)`` slices grouped into chunks of ``chunk_rows`` rows at
    most (a slice holding more is a chunk of its own)."""
    out: list[list[tuple[int, int, int]]] = []
    n = 0
    for r in ranges:
        if not out or n + r[2] > chunk_rows:
            out.append([])
            n = 0
        out[-1].append(r)
        n += r[2]
    return out


def chunk_args(table: str, part: list[tuple[int, int, int]]) -> dict:
    """A chunk's handler arguments: its key range and, if it has several, its slices."""
    args = {"table": table, "lo": part[0][0], "hi": part[-1][1]}
    if len(part) > 1:
        args["slices"] = [[lo, hi] for lo, hi, _ in part]
    return args


def selections(lo: int, hi: int, slices: list[list[int]] | None) -> list[Selection]:
    """A chunk's slices as selections (the whole range if it has none)."""
    return [Selection(a, b) for a, b in (slices or [[lo, hi]])]


def covering(ranges: Iterable[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """The ``(lo, hi, rows)`` ranges stretched to cover every key from 0 to 2**64 - 1
    without a gap (rows kept): a re-run must also visit the keys deleted since the last
    one (between, before or after the keys there are now) to take them out of the target."""
    ranges = list(ranges) or [(0, 0, 0)]
    starts = [lo for lo, _, _ in ranges]
    ends = [s - 1 for s in starts[1:]] + [KEY_LIMIT]
    return [(0 if i == 0 else lo, hi, n)
            for i, (lo, hi, (_, _, n)) in enumerate(zip(starts, ends, ranges, strict=True))]


def open_shards(router: Router, ledger: Ledger) -> list[int]:
    """The open shards users are spread over, frozen at the first migration.

    Later runs reuse the first run's list, so re-running after new shards were
    opened never moves a user (new users of the application go to the new shards).
    """
    first = ledger.latest_run(runwatch.KIND)
    if first:
        return ledger.run(first)["params"]["open_shards"]
    shards = router.shardmap.open_shards()
    if not shards:
        raise ConfigError("the shard map has no open shards to place users on")
    return shards


@dataclass
class ProcessState:
    """What a process keeps across the chunks of one run: never a router (each chunk
    routes with its own, ``ctx.router``)."""

    reader: LegacyReader
    id_cache: IdCache
    verdicts: Verdicts

    def newids(self, ctx: ChunkContext) -> NewIds:
        """New IDs for one chunk: its router, the process's cache."""
        return NewIds(ctx.router, self.id_cache)


_states: dict[tuple, ProcessState] = {}


def process_state(ctx: ChunkContext) -> ProcessState:
    """This process's state for ``ctx``'s run (a new one for another run or legacy DSN;
    shared by the run's load and verify chunks)."""
    key = (os.getpid(), str(ctx.settings.legacy_dsn), ctx.run_id)
    if key not in _states:
        _states.clear()
        _states[key] = ProcessState(LegacyReader(ctx.settings.legacy_dsn), {}, Verdicts())
    return _states[key]


def read_selection(reader: LegacyReader, spec: LegacyTable, sel: Selection) -> list[dict]:
    """The legacy rows of a selection of ``spec``'s first key column, in key order."""
    if sel.values is None:
        return reader.chunk(spec, sel.lo, sel.hi)
    if sel.pairs is not None:
        return _read_pairs(reader, spec, sorted(sel.pairs))
    if not sel.values:
        return []
    out: list[dict] = []
    for i in range(0, len(sel.values), IN_BATCH):
        part = sel.values[i:i + IN_BATCH]
        cond, params = Selection.of(list(part)).where(f"`{spec.key[0]}`")
        out += reader.rows(spec, spec.columns, cond, params)
    return out


def _read_pairs(reader: LegacyReader, spec: LegacyTable, pairs: list[tuple[int, int]]
                ) -> list[dict]:
    """The legacy rows of a link table whose two-column keys are ``pairs``, in key order
    (one index range per key; batches below the server's IN-to-join conversion)."""
    cols = ", ".join(f"`{k}`" for k in spec.key)
    out: list[dict] = []
    for i in range(0, len(pairs), PAIR_BATCH):
        part = pairs[i:i + PAIR_BATCH]
        out += reader.rows(spec, spec.columns, f"({cols}) IN ({','.join(['(%s,%s)'] * len(part))})",
                           [v for pair in part for v in pair])
    return out


def judge_chunk(reader: LegacyReader, params: dict, table: str, lo: int, hi: int,
                verdicts: Verdicts | None = None, sel: Selection | None = None
                ) -> tuple[Resolver, list[tuple[dict, Verdict]]]:
    """Read one chunk (or ``sel``) and judge every row (shared by load and verify);
    ``verdicts`` are those the process's earlier chunks of the same run reached."""
    spec = SPEC[table]
    rows = read_selection(reader, spec, sel or Selection(lo, hi))
    if verdicts is not None:
        verdicts.trim()
    resolver = Resolver(reader, user_placement(params["open_shards"]), verdicts)
    resolver.load(spec, rows)
    return resolver, list(zip(rows, resolver.judge_rows(spec, rows), strict=True))


def held(router: Router, spec: LegacyTable, sel: Selection, resolver: Resolver,
         fresh: bool = False) -> present.Held | dict[str, set[tuple[int, int]]]:
    """What the target holds for ``sel`` now (read before the selection writes); with
    ``fresh``, nothing, unread (``first_load``)."""
    if fresh:
        return present.Held() if spec.is_object else {m.table: set() for m in spec.mappings}
    if spec.is_object:
        return present.held_objects(router, spec.name, spec.type_name, sel)
    return {m.table: present.held_links(router, m.table, sel, resolver.place_user)
            for m in spec.mappings}


def load_chunk(ctx: ChunkContext, table: str, lo: int, hi: int,
               slices: list[list[int]] | None = None) -> Outcome:
    """Chunk handler: load legacy rows ``lo..hi`` of ``table`` (slice by slice) into the
    shards and take out of the target what those rows no longer imply
    (``loaders.migration.converge``)."""
    def record(bad: list) -> None:
        ctx.ledger.quarantine.record(ctx.lease, bad)
    with collector.held_off():  # a chunk's rows form no cycles: see shardfarm.collector
        return load_slices(ctx.router, ctx.token, process_state(ctx), ctx.params, table,
                           selections(lo, hi, slices), record, ctx.check,
                           first_load(ctx, table))


def load_selection(router: Router, token: FenceToken | None, st: ProcessState, params: dict,
                   table: str, sel: Selection, record: Callable[[list], None],
                   check: Callable[[], None] = lambda: None) -> Outcome:
    """Make the target exactly what the legacy rows of ``sel`` imply: write the valid rows,
    quarantine the others (through ``record``), remove what is stale."""
    return load_slices(router, token, st, params, table, [sel], record, check)


def thin(rows: TargetRows) -> bool:
    """Whether ``rows``' objects are a few a shard table (``writer.INSERT_ROWS`` or fewer
    on average, as a slice spread over thousands of shards is): a transaction's fence and
    map checks then cost the server more than its rows. Measured at full size (4,096
    shards, 2.0M legacy rows): the first load's objects kept for the chunk's end took the
    migration from 198 to 144 s; on 16 shards, they only raised a worker's peak RSS from
    485 to 741 MiB."""
    n = sum(len(r) for r in rows.objects.values())
    return n <= writer.INSERT_ROWS * len(rows.objects)


@dataclass
class Slice:
    """What a slice left to do once its objects are written and its stale rows removed
    (its mapping rows, mod-bucket lookups and bad rows), and what it counted."""

    later: TargetRows
    bad: list
    read: int
    counts: dict[str, int]
    held: dict[tuple[int, str], set[int]] = field(default_factory=dict)  # of ``later``'s objects


def load_slices(router: Router, token: FenceToken | None, st: ProcessState, params: dict,
                table: str, sels: list[Selection], record: Callable[[list], None],
                check: Callable[[], None] = lambda: None, fresh: bool = False) -> Outcome:
    """``load_selection`` of consecutive selections, one in memory at a time: of several,
    each one's objects are written as they are built and what it no longer implies removed
    at once (a removal known only in memory would be lost with the process: on a re-run the
    target already holds the new documents); then every one's mapping rows and mod-bucket
    lookups at once (a statement per shard table and bucket, not per selection), and the bad
    rows. One selection alone writes all its rows before it removes anything. ``fresh``: the
    target holds nothing for them (``first_load``), so it is not read, and nothing is
    removed: then a slice whose objects are spread ``thin`` (thousands of shards) keeps them
    for the end too, so each shard gets one transaction a chunk, not one a slice (the
    worker then holds those target rows of the chunk, not of one slice)."""
    spec = SPEC[table]
    later = TargetRows()
    held: dict[tuple[int, str], set[int]] = {}
    bad: list = []
    read, counts = 0, Counter()
    for sel in sels:
        done = _load_slice(router, token, st, params, spec, sel, check, len(sels) > 1, fresh)
        later.extend(done.later)
        for key, slots in done.held.items():
            held.setdefault(key, set()).update(slots)
        bad += done.bad
        read += done.read
        counts.update(done.counts)
        del done  # the next slice's rows take its place
    writer.write_shards(router, token, later, held=held)
    check()
    writer.write_mod(router, later, token)
    record(bad)
    return Outcome(rows_read=read, rows_written=read - len(bad), rows_quarantined=len(bad),
                   counts=dict(counts))


def _load_slice(router: Router, token: FenceToken | None, st: ProcessState, params: dict,
                spec: LegacyTable, sel: Selection, check: Callable[[], None],
                defer: bool, fresh: bool = False) -> Slice:
    """Write the rows of the valid legacy rows of ``sel`` (with ``defer``, only objects) and
    remove what they no longer imply; return what is left to write (``defer``: mapping rows
    and lookups) and the bad rows. A selection alone (``farm sync``, a chunk of one slice)
    writes everything before it removes anything, so a moved object is never without its
    new links."""
    table = spec.name
    resolver, judged = judge_chunk(st.reader, params, table, 0, -1, st.verdicts, sel)
    good = [(r, v) for r, v in judged if v.valid]
    bad = [(table, legacy_key(spec, r), v.reason, v.detail) for r, v in judged if not v.valid]
    check()
    builder = Builder(spec, resolver, NewIds(router, st.id_cache, token),
                      router.shardmap.buckets)
    target = builder.build(good)
    before = held(router, spec, sel, resolver, fresh)

    def writes(rows: TargetRows) -> TargetRows:  # what the target does not hold as it is
        return converge.changed(rows, before, ids.TYPES[spec.type_name]) \
            if spec.is_object else rows
    writing = writes(target)
    found = claims.survey(router, writing, ranged=sel.values is None)
    if found.taken:  # a corrupted target: those rows write nothing at all
        bad += [(table, legacy_key(spec, r), claims.TAKEN, found.taken[r["id"]])
                for r, _ in good if r["id"] in found.taken]
        good = [(r, v) for r, v in good if r["id"] not in found.taken]
        target = builder.build(good)
        writing = writes(target)
    if defer and fresh and thin(writing):  # nothing to remove: all of it waits for the end
        return Slice(writing, bad, len(judged), {**target.count(), "removed": 0}, found.held)
    now, later = (TargetRows(objects=writing.objects),
                  TargetRows(mappings=writing.mappings, lookups=writing.lookups)) if defer \
        else (writing, TargetRows())
    writer.write_shards(router, token, now, held=found.held)
    writer.write_mod(router, now, token)
    stale = (converge.stale_objects(spec, before, target) if spec.is_object
             else converge.stale_links(before, target))
    converge.apply(router, token, spec, stale)
    converge.relink(router, token, st.reader, builder, stale.lookups, set(stale.objects))
    return Slice(later, bad, len(judged), {**target.count(), "removed": stale.count()})
