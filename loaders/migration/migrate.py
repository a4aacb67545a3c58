"""``farm migrate``: plan chunks of the legacy tables and load one chunk at a time.

A chunk is a range of a legacy table's first key column holding about
``chunk_rows`` rows. Loading it: read the rows, judge them (fetching what they
reference), quarantine the bad ones with their reason, build objects, forward
mapping rows and mod-shard lookups, and write them grouped by destination.
Chunks run in any order, any number of times, with the same result.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from farmcore.context import ChunkContext
from farmcore.ledger import ChunkSpec, Ledger, Outcome
from loaders.migration import claims
from loaders.migration.build import Builder
from loaders.migration.legacy import LegacyReader
from loaders.migration.newids import IdCache, NewIds
from loaders.migration.spec import ORDER, SPEC, legacy_key
from loaders.migration.verdicts import Resolver, Verdict, Verdicts, user_placement
from loaders.migration.writer import write_all
from shardfarm.errors import ConfigError, UsageError
from shardfarm.settings import Settings
from sharding.router import Router

HANDLER = "loaders.migration.migrate.load_chunk"
# Every chunk of an object table writes one upsert per mod bucket (4,096 of them) it
# touches, so rows per chunk set rows per statement: 50k rows put ~12 lookups in each.
# Measured with 2 workers: 15% faster than 25k; a worker's peak memory 200 MiB (150).
DEFAULT_CHUNK_ROWS = 50_000


def plan(settings: Settings, router: Router, ledger: Ledger,
         chunk_rows: int = DEFAULT_CHUNK_ROWS) -> tuple[dict, list[ChunkSpec]]:
    """Run parameters and chunks of a migration of the whole legacy database."""
    if chunk_rows < 1:
        raise UsageError(f"--chunk-size must be at least 1, got {chunk_rows}")
    reader = LegacyReader(settings.legacy_dsn)
    try:
        chunks = [ChunkSpec(t, {"table": t, "lo": lo, "hi": hi}, rows=n)
                  for t in ORDER for lo, hi, n in reader.plan(SPEC[t], chunk_rows)]
    finally:
        reader.close()
    params = {"open_shards": _open_shards(router, ledger), "chunk_rows": chunk_rows,
              "kinds": list(ORDER)}
    return params, chunks


def _open_shards(router: Router, ledger: Ledger) -> list[int]:
    """The open shards users are spread over, frozen at the first migration.

    Later runs reuse the first run's list, so re-running after new shards were
    opened never moves a user (new users of the application go to the new shards).
    """
    first = ledger.latest_run("migrate")
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


def judge_chunk(reader: LegacyReader, params: dict, table: str, lo: int, hi: int,
                verdicts: Verdicts | None = None) -> tuple[Resolver, list[tuple[dict, Verdict]]]:
    """Read one chunk and judge every row (shared by load and verify); ``verdicts`` are
    those the process's earlier chunks of the same run reached."""
    spec = SPEC[table]
    rows = reader.chunk(spec, lo, hi)
    if verdicts is not None:
        verdicts.trim()
    resolver = Resolver(reader, user_placement(params["open_shards"]), verdicts)
    resolver.load(spec, rows)
    return resolver, [(r, resolver.judge(spec, r)) for r in rows]


def load_chunk(ctx: ChunkContext, table: str, lo: int, hi: int) -> Outcome:
    """Chunk handler: load legacy rows ``lo..hi`` of ``table`` into the shards."""
    st = process_state(ctx)
    spec = SPEC[table]
    resolver, judged = judge_chunk(st.reader, ctx.params, table, lo, hi, st.verdicts)
    good = [(r, v) for r, v in judged if v.valid]
    bad = [(table, legacy_key(spec, r), v.reason, v.detail) for r, v in judged if not v.valid]
    ctx.check()
    builder = Builder(spec, resolver, st.newids(ctx), ctx.router.shardmap.buckets)
    target = builder.build(good)
    found = claims.survey(ctx.router, target)
    if found.taken:  # a corrupted target: those rows write nothing at all
        bad += [(table, legacy_key(spec, r), claims.TAKEN, found.taken[r["id"]])
                for r, _ in good if r["id"] in found.taken]
        good = [(r, v) for r, v in good if r["id"] not in found.taken]
        target = builder.build(good)
    write_all(ctx.router, ctx.token, target, found.held)
    ctx.ledger.quarantine.record(ctx.lease, bad)
    return Outcome(rows_read=len(judged), rows_written=len(good), rows_quarantined=len(bad),
                   counts=target.count())
