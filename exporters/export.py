"""``farm export``: every (table, shard) of the map to ``{dest}/{table}/dt={date}/``.

Each shard's table becomes one ``part-{shard:05d}.jsonl.gz`` (or ``.parquet``), streamed
from a consistent snapshot, and its rows, bytes and sha256 are recorded in the control
database (``export_parts``). A chunk covers a run of up to ``SHARDS_PER_CHUNK`` shards of
one table on one server (``exporters.chunkparts``: one connection and one snapshot for the
run, bookkeeping per group of parts, empty shards written without reading them). The chunk
that completes a table — every shard of the run recorded — writes ``_manifest.json`` and
then ``_SUCCESS``; two chunks that complete at once write the same manifest twice, which
is harmless.

A re-export of the same date skips a part whose manifest entry (or, before any
manifest, whose record) matches the object that is there, size and sha256, unless
``force``. A part that is written again first withdraws the folder's
``_SUCCESS``, so a reader never sees old and new parts under one success marker.

Fenced to the end: one run at a time writes a folder (``PartLog.claim``; a second
run's chunks wait), and every step that makes something visible there (a part's
rename or upload completion, withdrawing ``_SUCCESS``, the manifest, ``_SUCCESS``)
is preceded at once by the chunk's fence (``ChunkContext.fence``, which renews the
lease by compare-and-set; for a group of parts ``fence_fresh``): an attempt whose lease
was taken over, or may have expired, stops before it can replace what its successor
finished.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Callable

from exporters import chunkparts, dump, formats
from exporters.chunkparts import part_name
from exporters.destinations import Destination, Fence, checked_destination, open_destination
from exporters.partlog import FolderBusyError, Part, PartLog
from farmcore.context import ChunkContext
from farmcore.ledger import ChunkSpec, Ledger, Outcome
from shardfarm.errors import UsageError
from shardfarm.mysql.dsn import Host
from sharding.router import Router

log = logging.getLogger(__name__)
HANDLER = "exporters.export.export_chunk"
MANIFEST = chunkparts.MANIFEST
SUCCESS = "_SUCCESS"
ROLES = ("master", "slave")
SHARDS_PER_CHUNK = 64


def check_date(text: str) -> str:
    """A ``YYYY-MM-DD`` date, or one clear line."""
    try:
        if len(text) != 10:
            raise ValueError(text)
        return dt.date.fromisoformat(text).isoformat()
    except ValueError:
        raise UsageError(f"bad export date {text!r} (expected YYYY-MM-DD)") from None


def folder_of(table: str, date: str) -> str:
    """``{table}/dt={date}/``: the Hive partition folder of a table and date."""
    return f"{table}/dt={date}/"


def shard_runs(router: Router, role: str, size: int) -> list[list[int]]:
    """The map's shards in runs of at most ``size`` consecutive shards on one server."""
    runs: list[list[int]] = []
    server = None
    for s in router.shardmap.shards():
        here = router.host_for(s, role).server
        if runs and here == server and len(runs[-1]) < size:
            runs[-1].append(s)
        else:
            runs.append([s])
        server = here
    return runs


def plan(router: Router, date: str, dest_url: str, tables: list[str] | None = None,
         fmt: str = "jsonl", role: str = "master", force: bool = False,
         shards_per_chunk: int = SHARDS_PER_CHUNK) -> tuple[dict, list[ChunkSpec]]:
    """Check the request and return run params plus one chunk per (table, run of shards)."""
    date = check_date(date)
    tables = dump.check_tables(list(tables or []))
    fmt = formats.check_format(fmt)
    if role not in ROLES:
        raise UsageError(f"bad --from {role!r} (expected master or slave)")
    # the planner's look (FARM_STATUS_TIMEOUT), with the folders the run writes
    dest = checked_destination(dest_url, [folder_of(t, date) for t in tables])
    runs = shard_runs(router, role, shards_per_chunk)
    chunks = [ChunkSpec(t, {"table": t, "shards": run}) for t in tables for run in runs]
    params = {"kinds": tables, "date": date, "dest": dest.url, "format": fmt, "from": role,
              "force": bool(force), "parts": sum(len(r) for r in runs)}
    return params, chunks


def folders_named(params: object) -> list[tuple[str, str, str]]:
    """``(dest, table, date)`` of each folder an export run's ``params`` name; nothing for
    params of another shape (a run row written into the ledger by hand or by anyone: a
    list, a number where a name belongs), which readers leave out rather than fail on."""
    if not isinstance(params, dict):
        return []
    dest, date, kinds = params.get("dest"), params.get("date"), params.get("kinds")
    if not (isinstance(dest, str) and isinstance(date, str) and isinstance(kinds, list)):
        return []
    return [(dest, t, date) for t in kinds if isinstance(t, str)]


def refuse_overlap(ledger: Ledger, params: dict) -> None:
    """``FolderBusyError`` in one line naming the active export run that writes one of the
    same folders (destination, table, date) as ``params``: one run at a time per folder.
    (Chunks enforce it too, atomically: a run that slips past this check waits.)"""
    for run_id in ledger.runs(limit=200, active_only=True, kind="export"):
        run = ledger.run(run_id)
        if run["status"] != "running":
            continue
        theirs = set(folders_named(run["params"]))
        shared = [t for t in params["kinds"] if (params["dest"], t, params["date"]) in theirs]
        if shared:
            raise FolderBusyError(f"run {run_id} is already exporting {', '.join(shared)} "
                                  f"of {params['date']} to {params['dest']}; wait until it ends "
                                  f"(farm status --run {run_id})")


# -- the chunk ------------------------------------------------------------------------------
def dump_part(host: Host, shard: int, table: str, fmt: str, dest: Destination, key: str,
              check: Callable[[], None] = lambda: None, fence: Fence | None = None) -> Part:
    """Stream ``table`` of ``shard`` from ``host`` into the object ``key`` over a connection
    and snapshot of its own; visible only once whole. ``check`` runs between batches (a
    chunk's lease check), ``fence`` immediately before the part becomes visible (default:
    ``check``)."""
    dest.drop_leftovers(key)  # a dead attempt's temp file of this part
    with dump.snapshot(host, shard) as conn:
        w, part = chunkparts.write_part(conn, shard, table, fmt, dest, key, check,
                                        fence or check, empty=False)
    with w:
        w.commit()
    return part


def export_chunk(ctx: ChunkContext, table: str, shard: int | None = None,
                 shards: list[int] | None = None) -> Outcome:
    """Chunk handler: export ``table`` of each of ``shards`` (or of one ``shard``: runs
    planned before chunks covered several) as one part each, then finalize if it was last."""
    p = ctx.params
    shards = [int(s) for s in (shards if shards is not None else [shard])]
    date, fmt = p["date"], p["format"]
    dest = open_destination(p["dest"])
    parts = PartLog(ctx.ledger.pool, dest.url)
    folder = folder_of(table, date)
    parts.claim(folder, ctx.run_id)  # one run at a time writes a folder
    names = {part_name(s, fmt): s for s in shards}
    there = {} if p.get("force") else chunkparts.intact(dest, parts, folder, list(names))
    todo = [s for n, s in names.items() if n not in there]
    stale = chunkparts.other_formats(parts, folder, shards, fmt)
    written: list[Part] = []
    if todo or stale:
        withdraw(dest, folder, ctx.fence)  # changing: no success marker until final
    chunkparts.drop(dest, parts, folder, stale, ctx.fence_fresh)  # parts of another format
    if todo:
        role = p.get("from", "master")
        written = chunkparts.write_parts(
            lambda s: ctx.router.host_for(s, role), table, fmt, dest, folder, todo,
            lambda got: parts.record_many(folder, got, ctx.run_id), ctx.check,
            ctx.fence_fresh)
    ctx.check()
    parts.record_many(folder, list(there.values()), ctx.run_id)  # confirmed for this run
    finalize(ctx, dest, parts, table)
    rows = sum(q.rows for q in written)
    return Outcome(rows_read=rows, rows_written=rows,
                   counts={"table": table, "parts": len(shards), "written": len(written),
                           "skipped": len(there), "bytes": sum(q.bytes for q in written)})


def manifest_doc(table: str, date: str, fmt: str, parts: list[Part]) -> dict:
    """The ``_manifest.json`` document of a table and date."""
    return {"table": table, "date": date, "format": fmt,
            "files": [q.entry() for q in sorted(parts, key=lambda q: q.shard)],
            "rows": sum(q.rows for q in parts), "bytes": sum(q.bytes for q in parts)}


def finalize(ctx: ChunkContext, dest: Destination, parts: PartLog, table: str) -> bool:
    """Once every shard of ``table`` in this run is recorded: manifest, then ``_SUCCESS``.

    Returns whether the table is complete. Idempotent: a manifest already there
    with the same content is not written again, nor is an existing ``_SUCCESS``.
    """
    p = ctx.params
    folder = folder_of(table, p["date"])
    expected = p.get("parts") or next((k["total"] for k in ctx.ledger.progress(ctx.run_id)
                                       if k["kind"] == table), None)  # one shard a chunk
    if expected is None or parts.count_of_run(folder, ctx.run_id) < expected:
        return False
    with parts.lock(folder):  # one finalizer at a time: the second finds it all written
        have = parts.of_run(folder, ctx.run_id)
        write_final(dest, folder, manifest_doc(table, p["date"], p["format"], have),
                    ctx.fence)
    return True


def write_final(dest: Destination, folder: str, manifest: dict,
                fence: Fence = lambda: None) -> None:
    """Write ``_manifest.json`` (unless identical) and then, last, ``_SUCCESS``; ``fence``
    right before each change."""
    body = (json.dumps(manifest, indent=1) + "\n").encode()
    if dest.read(folder + MANIFEST) != body:
        withdraw(dest, folder, fence)
        dest.put(folder + MANIFEST, body, fence)
    elif dest.exists(folder + SUCCESS):
        return
    dest.put(folder + SUCCESS, b"", fence)
    log.info("export %s%s complete: %d file(s), %d rows", dest.url + "/", folder,
             len(manifest["files"]), manifest["rows"])


def withdraw(dest: Destination, folder: str, fence: Fence = lambda: None) -> None:
    """Remove the folder's ``_SUCCESS`` if there is one (before any of its files changes);
    ``fence`` right before the delete."""
    if dest.exists(folder + SUCCESS):
        fence()
        dest.delete(folder + SUCCESS)
