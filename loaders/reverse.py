"""``farm reverse``: rebuild reverse mapping tables from their forward tables.

Chunks are (reverse table, source shard[, from_id range]) sized by row count.
A chunk reads its forward rows in key order, turns ``(a, b, seq)`` into
``(b, a, seq)``, regroups them by the shard of the new from ID, and writes them
with the migration's fenced, idempotent bulk writer. Followers of a hot board
go where the hotspot directory says (both places while it is being copied),
never back to a home shard they have left.
"""

from __future__ import annotations

from collections.abc import Iterator

from loaders.build import TargetRows
from loaders.legacy import cut_ranges
from loaders.writer import write_shards
from shardfarm.context import ChunkContext
from shardfarm.errors import UsageError
from shardfarm.ledger import ChunkSpec, Outcome
from sharding import ids
from sharding.hotspot import FOLLOWERS, Directory, Entry, follower_shard
from sharding.router import Router
from sharding.schema import MAPPING_TABLES, shard_table

HANDLER = "loaders.reverse.reverse_chunk"
REVERSES = {m.name: m.reverse_of for m in MAPPING_TABLES.values() if m.reverse_of}
DEFAULT_CHUNK_ROWS = 50_000


def plan(router: Router, tables: list[str], chunk_rows: int = DEFAULT_CHUNK_ROWS
         ) -> tuple[dict, list[ChunkSpec]]:
    """Chunks for every source shard of each reverse table's forward table."""
    tables = tables or list(REVERSES)
    unknown = [t for t in tables if t not in REVERSES]
    if unknown:
        names = ", ".join(repr(t)[1:-1][:64] for t in unknown)
        raise UsageError(f"not a reverse table: {names} (known: {', '.join(REVERSES)})")
    chunks = [ChunkSpec(t, {"table": t, "shard": s, "lo": lo, "hi": hi})
              for t in tables for s in router.shardmap.shards()
              for lo, hi in _ranges(router, REVERSES[t], s, chunk_rows)]
    return {"kinds": tables, "chunk_rows": chunk_rows}, chunks


def _ranges(router: Router, forward: str, shard: int, chunk_rows: int
            ) -> Iterator[tuple[int, int]]:
    """from_id ranges of about ``chunk_rows`` rows (one range for a small shard)."""
    q = shard_table(shard, forward)
    groups = router.query(router.host_for(shard),
                          f"SELECT from_id, COUNT(*) FROM {q} GROUP BY from_id ORDER BY from_id",
                          (), shard)
    return cut_ranges(groups, chunk_rows)


def _destinations(table: str, rows: list[tuple], entries: dict[int, Entry]
                  ) -> Iterator[tuple[int, tuple]]:
    for a, b, seq in rows:
        row = (b, a, seq)
        entry = entries.get(b) if table == FOLLOWERS else None
        if entry is None:
            yield ids.shard_of(b), row
            continue
        spread = follower_shard(a, entry.shards)
        yield spread, row
        if not entry.spread:
            yield ids.shard_of(b), row


def reverse_chunk(ctx: ChunkContext, table: str, shard: int, lo: int, hi: int) -> Outcome:
    """Chunk handler: write the reverse of forward rows ``lo..hi`` on ``shard``."""
    q = shard_table(shard, REVERSES[table])
    rows = ctx.router.query(ctx.router.host_for(shard),
                            f"SELECT from_id, to_id, sequence FROM {q} WHERE from_id BETWEEN "
                            "%s AND %s ORDER BY from_id, to_id", (lo, hi), shard)
    entries = (Directory(ctx.router).get_many(sorted({r[1] for r in rows}))
               if table == FOLLOWERS and rows else {})
    target = TargetRows()
    for dest, row in _destinations(table, rows, entries):
        target.mappings[(dest, table)].append(row)
    ctx.check()
    write_shards(ctx.router, ctx.token, target)
    written = sum(len(v) for v in target.mappings.values())
    return Outcome(rows_read=len(rows), rows_written=written, counts={table: written})
