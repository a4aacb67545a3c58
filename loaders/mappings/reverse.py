"""``farm reverse``: rebuild reverse mapping tables from their forward tables.

Chunks are a reverse table and about ``chunk_rows`` forward rows: from_id ranges of one
or several source shards (small shards packed together). A chunk has each source's
server turn ``(a, b, seq)`` into ``(b, a, seq)`` rendered as ``LOAD DATA`` text grouped
by the shard of the new from ID (no row is parsed by the worker), and loads each
destination shard's text fenced; sources are read, and destinations written, in one
transaction per group of one server's shards, a few groups at a time. Followers of a
board are written by one transaction per home shard that share-locks that shard's
hotspot directory first: a hot board's rows go to its listed shard (committed before the
home commit) and home too while it is not spread, so a rebalance can neither flip nor
clean a board under the writer, and no row lands where no reader looks.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from itertools import groupby, zip_longest

from farmcore.context import ChunkContext
from farmcore.ledger import ChunkSpec, Outcome
from loaders.migration import writer
from loaders.migration.build import TargetRows
from loaders.migration.writer import write_shards
from shardfarm.errors import FatalError, UsageError
from sharding import fencing, ids
from sharding.hotspot import FOLLOWERS, lock_directory, place
from sharding.router import Router
from sharding.schema import MAPPING_TABLES, shard_table

HANDLER = "loaders.mappings.reverse.reverse_chunk"
REVERSES = {m.name: m.reverse_of for m in MAPPING_TABLES.values() if m.reverse_of}
DEFAULT_CHUNK_ROWS = 200_000  # fewer, larger chunks: less interleaving in each reverse table
PLAN_BATCH = 256  # shards counted per planning statement
SLICES = 16  # a big shard is cut into slices of about chunk_rows / SLICES rows
PLAN_THREADS = 4  # planning statements at a time


def plan(router: Router, tables: list[str], chunk_rows: int = DEFAULT_CHUNK_ROWS
         ) -> tuple[dict, list[ChunkSpec]]:
    """Chunks of about ``chunk_rows`` forward rows each: a big shard is cut into from_id
    ranges, small shards are packed together (so a chunk writes each destination shard
    once for many sources, and the number of chunks follows the rows, not the shards).
    Tables take turns in the queue, so that workers running side by side write different
    tables instead of contending for the same index pages; each table's largest chunks
    come first, so that workers taking them in turn end together."""
    tables = list(dict.fromkeys(tables)) or list(REVERSES)  # a table named twice: once
    unknown = [t for t in tables if t not in REVERSES]
    if unknown:
        names = ", ".join(repr(t)[1:-1][:64] for t in unknown)
        raise UsageError(f"not a reverse table: {names} (known: {', '.join(REVERSES)})")
    sliced = _slices(router, [REVERSES[t] for t in tables], max(1, chunk_rows // SLICES))
    per_table = [sorted((ChunkSpec(t, {"table": t, "parts": parts}, rows) for parts, rows
                         in pack(_groups(sliced[REVERSES[t]], chunk_rows), chunk_rows)),
                        key=lambda c: -(c.rows or 0)) for t in tables]
    chunks = [c for turn in zip_longest(*per_table) for c in turn if c is not None]
    return {"kinds": tables, "chunk_rows": chunk_rows}, chunks


def _groups(slices: list[tuple], chunk_rows: int) -> list[tuple[int, int, int, int]]:
    """``(shard, lo, hi, rows)`` from_id ranges in shard order, where a chunk may begin, from
    a table's ``slices``: a whole shard when it holds at most a quarter of ``chunk_rows``
    rows, else its slices."""
    out: list[tuple[int, int, int, int]] = []
    for shard, group in groupby(slices, key=lambda g: g[0]):
        cut = list(group)
        rows = sum(n for *_, n in cut)
        out += cut if rows > chunk_rows // 4 else [(shard, cut[0][1], cut[-1][2], rows)]
    return out


def _slices(router: Router, forwards: list[str], step: int) -> dict[str, list[tuple]]:
    """Each forward table's ``_slice_keys`` on every shard, in shard order: a statement per
    table and group of up to ``PLAN_BATCH`` shards of one server (``server_groups``),
    ``PLAN_THREADS`` statements at a time (one pass over each table)."""
    batches = router.server_groups(list(router.shardmap.shards()), most=PLAN_BATCH)
    work = [(f, b) for f in forwards for b in batches]
    with ThreadPoolExecutor(PLAN_THREADS) as pool:
        got = list(pool.map(lambda w: _slice_keys(router, *w, step), work))
    out: dict[str, list[tuple]] = {f: [] for f in forwards}
    for (forward, _), rows in zip(work, got, strict=True):
        out[forward] += rows
    for rows in out.values():
        rows.sort()  # servers' groups may interleave in shard order
    return out


def _slice_keys(router: Router, forward: str, shards: list[int], step: int) -> list[tuple]:
    """``(shard, lo, hi, rows)`` slices of ``forward`` on ``shards`` (all on one server), in
    order: consecutive from_ids, a slice per ``step`` rows that precede its first from_id
    (a from_id is never cut; a slice of one big from_id may hold more). The server sums
    and cuts, so only the slices cross the network, not a row per from_id."""
    keys = " UNION ALL ".join(f"(SELECT {s} AS shard, from_id, COUNT(*) AS n FROM "
                              f"{shard_table(s, forward)} GROUP BY from_id)" for s in shards)
    sql = ("SELECT shard, MIN(from_id), MAX(from_id), SUM(n) FROM (SELECT shard, from_id, n, "
           "SUM(n) OVER (PARTITION BY shard ORDER BY from_id ROWS UNBOUNDED PRECEDING) - n "
           f"AS rows_before FROM ({keys}) k) w GROUP BY shard, rows_before DIV %s ORDER BY 1, 2")
    return [(int(s), int(lo), int(hi), int(n)) for s, lo, hi, n in
            router.query(router.host_for(shards[0]), sql, (step,), shards[0])]


def pack(groups: Iterable[tuple[int, int, int, int]], chunk_rows: int
         ) -> Iterator[tuple[list[list[int]], int]]:
    """Chunks of about ``chunk_rows`` rows from ``(shard, lo, hi, rows)`` groups, each as
    ``(parts, rows)``: parts are ``[shard, lo, hi]`` (inclusive key ranges, one per shard
    it covers). A chunk ends once it holds an equal share of the rows (``total / ceil(total
    / chunk_rows)``) or before a group would take it past ``chunk_rows``: chunks of equal
    size rather than full ones and a remainder."""
    groups = list(groups)
    total = sum(g[3] for g in groups)
    share = total / max(1, math.ceil(total / chunk_rows)) if total else chunk_rows
    parts: list[list[int]] = []
    n = 0
    for shard, lo, hi, count in groups:
        if n and (n >= share or n + count > chunk_rows):
            yield parts, n
            parts, n = [], 0
        if parts and parts[-1][0] == shard:
            parts[-1][2] = hi
        else:
            parts.append([shard, lo, hi])
        n += count
    if parts:
        yield parts, n


def reverse_chunk(ctx: ChunkContext, table: str, parts: list[list[int]] | None = None,
                  shard: int | None = None, lo: int | None = None, hi: int | None = None
                  ) -> Outcome:
    """Chunk handler: write the reverse of the forward rows of ``parts`` (``[shard, lo,
    hi]`` each; a chunk planned before packing names one ``shard, lo, hi``). Parts are read,
    and destinations written fenced, in one transaction per group of shards on one server
    (``Router.server_groups``), ``writer.WRITE_THREADS`` groups at a time; follower rows
    get one transaction per destination (``_place_followers``)."""
    texts = _read_parts(ctx, REVERSES[table], parts or [[shard, lo, hi]])
    written: list[int] = []
    if table == FOLLOWERS:
        writer.run_parallel([(_write_followers, ctx, dest, text, n, written)
                             for dest, (text, n) in sorted(texts.items())],
                            writer.WRITE_THREADS)
    else:
        _write_groups(ctx, table, texts, written)
    rows, done = sum(n for _text, n in texts.values()), sum(written)
    return Outcome(rows_read=rows, rows_written=done, counts={table: done})


def _on_servers(ctx: ChunkContext, shards: Iterable[int]) -> list[list[int]]:
    return ctx.router.server_groups(list(shards), writer.WRITE_THREADS, writer.GROUP_SHARDS)


def _read_parts(ctx: ChunkContext, forward: str, parts: list[list[int]]
                ) -> dict[int, tuple[str, int]]:
    """``{dest: (text, rows)}`` of every part's reverse rows, each destination's text the
    parts' texts in part order."""
    got: list[dict[int, tuple[str, int]]] = [{} for _ in parts]
    by_shard: dict[int, list[int]] = {}
    for i, (src, _lo, _hi) in enumerate(parts):
        by_shard.setdefault(src, []).append(i)

    def read(cur, src: int) -> None:
        for i in by_shard[src]:
            got[i] = _reverse_text(cur, forward, *parts[i])
        ctx.check()
    writer.run_parallel([(partial(ctx.router.run_group, g, read),)
                         for g in _on_servers(ctx, by_shard)], writer.WRITE_THREADS)
    texts: dict[int, list] = {}
    for part in got:
        for dest, (text, n) in part.items():
            have = texts.setdefault(dest, [[], 0])
            have[0].append(text)
            have[1] += n
    return {dest: ("".join(chunks), n) for dest, (chunks, n) in texts.items()}


def _reverse_text(cur, forward: str, shard: int, lo: int, hi: int
                  ) -> dict[int, tuple[str, int]]:
    """The reverse of forward rows ``lo..hi``, rendered by the server as ``LOAD DATA`` text
    per destination shard (the new from ID's), in its primary-key order: ``{shard: (text,
    rows)}``. No row is parsed here; a group cut short by ``group_concat_max_len`` (a chunk
    far beyond ``max_allowed_packet``) is refused rather than loaded in part."""
    cur.execute("SET SESSION group_concat_max_len = @@max_allowed_packet")
    cur.execute(f"SELECT to_id >> {ids.SHARD_SHIFT}, COUNT(*), GROUP_CONCAT(to_id, '\t', "
                "from_id, '\t', sequence ORDER BY to_id, from_id SEPARATOR '\n') "
                f"FROM {shard_table(shard, forward)} WHERE from_id BETWEEN %s AND %s "
                "GROUP BY 1", (lo, hi))
    out = {}
    for dest, n, text in cur.fetchall():
        if text.count("\n") + 1 != n:
            raise FatalError(f"reverse rows of {forward} on shard {shard} ({lo}..{hi}) for "
                             f"shard {dest} exceed max_allowed_packet: use a smaller "
                             "--chunk-size")
        out[int(dest)] = (text + "\n", int(n))
    return out


def _write_groups(ctx: ChunkContext, table: str, texts: dict[int, tuple[str, int]],
                  written: list[int]) -> None:
    """Each destination's rows, fenced, in one transaction per group of destinations."""
    def write(cur, dest: int) -> None:
        fencing.check(cur, dest, ctx.token)
        writer.load_text(cur, shard_table(dest, table), "mapping", texts[dest][0])

    def group(g: list[int]) -> None:
        ctx.router.run_group(g, write, infile=True)
        written.append(sum(texts[d][1] for d in g))
    writer.run_parallel([(group, g) for g in _on_servers(ctx, texts)], writer.WRITE_THREADS)


def _write_followers(ctx: ChunkContext, dest: int, text: str, n: int,
                     written: list[int]) -> None:
    """One fenced transaction on ``dest``: its follower rows of the chunk (through the
    hotspot directory, see ``_place_followers``)."""
    written.append(ctx.router.run(dest, lambda cur: _place_followers(ctx, cur, dest, text, n),
                                  infile=True))


def _place_followers(ctx: ChunkContext, cur, home: int, text: str, n: int) -> int:
    """In the home shard's transaction: lock the directory; with no hot board listed, load
    the text as it is; else commit hot boards' rows on their listed shards first and load
    the home rows (only then are rows parsed).

    The home shard's fence is taken after the listed shards' rows are committed: those go
    on other connections (fenced each), and another destination's home transaction of the
    same chunk, running beside this one, may list this home for its own hot board. Held
    first, the two fences made a wait cycle across connections that the server cannot see
    (each home transaction waiting in this process for its listed shards' writes, those
    for the other's fence), so both sat until a timeout killed one. The home fence is still
    checked first, in a short transaction of its own (committed at once: fences only
    grow), so a zombie writes no listed shard either."""
    entries = lock_directory(cur, home)
    if not entries:
        fencing.check(cur, home, ctx.token)
        writer.load_text(cur, shard_table(home, FOLLOWERS), "mapping", text)
        return n
    rows = [tuple(map(int, line.split("\t"))) for line in text.splitlines()]
    home_rows, spread = place(rows, entries)
    if spread:  # a zombie is refused before it writes anywhere: the home fence, committed
        ctx.router.run(home, lambda c: fencing.check(c, home, ctx.token))  # at once
        target = TargetRows()
        for shard, group in spread.items():
            target.mappings[(shard, FOLLOWERS)] = group
        write_shards(ctx.router, ctx.token, target, threads=1)
    fencing.check(cur, home, ctx.token)
    if home_rows:
        writer.load_rows(cur, shard_table(home, FOLLOWERS), "mapping", home_rows)
    return len(home_rows) + sum(len(g) for g in spread.values())
