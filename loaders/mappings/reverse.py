"""``farm reverse``: rebuild reverse mapping tables from their forward tables.

Chunks are (reverse table, source shard[, from_id range]) sized by row count.
A chunk reads its forward rows in key order, turns ``(a, b, seq)`` into
``(b, a, seq)``, regroups them by the shard of the new from ID, and writes them
with the migration's fenced, idempotent bulk writer. Followers of a board are
written by one transaction per home shard that share-locks that shard's hotspot
directory first: a hot board's rows go to its listed shard (committed before the
home commit) and home too while it is not spread, so a rebalance can neither flip
nor clean a board under the writer, and no row lands where no reader looks.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

from farmcore.context import ChunkContext
from farmcore.ledger import ChunkSpec, Outcome
from loaders.migration import writer
from loaders.migration.build import TargetRows
from loaders.migration.legacy import cut_ranges
from loaders.migration.writer import write_shards
from shardfarm.errors import UsageError
from sharding import fencing, ids
from sharding.hotspot import FOLLOWERS, lock_directory, place
from sharding.router import Router
from sharding.schema import MAPPING_TABLES, shard_table

HANDLER = "loaders.mappings.reverse.reverse_chunk"
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
    chunks = [ChunkSpec(t, {"table": t, "shard": s, "lo": lo, "hi": hi}, rows=n)
              for t in tables for s in router.shardmap.shards()
              for lo, hi, n in _ranges(router, REVERSES[t], s, chunk_rows)]
    return {"kinds": tables, "chunk_rows": chunk_rows}, chunks


def _ranges(router: Router, forward: str, shard: int, chunk_rows: int
            ) -> Iterator[tuple[int, int, int]]:
    """from_id ranges of about ``chunk_rows`` rows, with their rows (one range for a small
    shard)."""
    q = shard_table(shard, forward)
    groups = router.query(router.host_for(shard),
                          f"SELECT from_id, COUNT(*) FROM {q} GROUP BY from_id ORDER BY from_id",
                          (), shard)
    return cut_ranges(groups, chunk_rows)


def reverse_chunk(ctx: ChunkContext, table: str, shard: int, lo: int, hi: int) -> Outcome:
    """Chunk handler: write the reverse of forward rows ``lo..hi`` on ``shard``."""
    q = shard_table(shard, REVERSES[table])
    rows = ctx.router.query(ctx.router.host_for(shard),
                            f"SELECT from_id, to_id, sequence FROM {q} WHERE from_id BETWEEN "
                            "%s AND %s ORDER BY from_id, to_id", (lo, hi), shard)
    ctx.check()
    if table == FOLLOWERS:
        written = _write_followers(ctx, [(b, a, seq) for a, b, seq in rows])
    else:
        target = TargetRows()
        for a, b, seq in rows:
            target.mappings[(ids.shard_of(b), table)].append((b, a, seq))
        write_shards(ctx.router, ctx.token, target)
        written = len(rows)
    return Outcome(rows_read=len(rows), rows_written=written, counts={table: written})


def _write_followers(ctx: ChunkContext, rows: list[tuple]) -> int:
    """Follower rows, one transaction per home shard (a few at a time); returns rows written."""
    by_home: dict[int, list[tuple]] = defaultdict(list)
    for row in rows:
        by_home[ids.shard_of(row[0])].append(row)
    written: list[int] = []
    writer.run_parallel([(_write_home, ctx, home, group, written)
                         for home, group in sorted(by_home.items())], writer.WRITE_THREADS)
    return sum(written)


def _write_home(ctx: ChunkContext, home: int, rows: list[tuple], written: list[int]) -> None:
    """In one home-shard transaction: lock the directory, commit hot boards' rows on their
    listed shards, load the home rows, commit."""
    def tx(cur) -> int:
        entries = lock_directory(cur, home)
        fencing.check(cur, home, ctx.token)
        home_rows, spread = place(rows, entries)
        if spread:
            target = TargetRows()
            for shard, group in spread.items():
                target.mappings[(shard, FOLLOWERS)] = group
            write_shards(ctx.router, ctx.token, target, threads=1)
        if home_rows:
            writer.load_rows(cur, shard_table(home, FOLLOWERS), "mapping", home_rows)
        return len(home_rows) + sum(len(g) for g in spread.values())
    written.append(ctx.router.run(home, tx, infile=True))
