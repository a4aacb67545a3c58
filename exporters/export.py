"""``farm export``: every (table, shard) of the map to ``{dest}/{table}/dt={date}/``.

One chunk per (table, shard) writes ``part-{shard:05d}.jsonl.gz`` (or
``.parquet``) from one consistent snapshot of that shard table, streamed, and
records the part's rows, bytes and sha256 in the control database
(``export_parts``). The chunk that completes a table — every shard of the run
recorded — writes ``_manifest.json`` and then ``_SUCCESS``; two chunks that
complete at once write the same manifest twice, which is harmless.

A re-export of the same date skips a part whose manifest entry (or, before any
manifest, whose record) matches the object that is there, size and sha256, unless
``force``. A part that is written again first withdraws the folder's
``_SUCCESS``, so a reader never sees old and new parts under one success marker.

Fenced to the end: one run at a time writes a folder (``PartLog.claim``; a second
run's chunks wait), and every step that makes something visible there (a part's
rename or upload completion, withdrawing ``_SUCCESS``, the manifest, ``_SUCCESS``)
is preceded at once by the chunk's fence (``ChunkContext.fence``, which renews the
lease by compare-and-set): an attempt whose lease was taken over, or may have
expired, stops before it can replace what its successor finished.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Callable, Iterator

from exporters import dump, formats
from exporters.destinations import Destination, Fence, open_destination
from exporters.partlog import FolderBusyError, Part, PartLog
from farmcore.context import ChunkContext
from farmcore.ledger import ChunkSpec, Ledger, Outcome
from shardfarm.errors import UsageError
from shardfarm.mysql.dsn import Host
from sharding.router import Router
from sharding.schema import OBJECT_TABLES

log = logging.getLogger(__name__)
HANDLER = "exporters.export.export_chunk"
MANIFEST = "_manifest.json"
SUCCESS = "_SUCCESS"
ROLES = ("master", "slave")


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


def part_name(shard: int, fmt: str) -> str:
    """``part-00042.jsonl.gz``."""
    return f"part-{shard:05d}.{formats.EXTENSIONS[fmt]}"


def plan(router: Router, date: str, dest_url: str, tables: list[str] | None = None,
         fmt: str = "jsonl", role: str = "master", force: bool = False
         ) -> tuple[dict, list[ChunkSpec]]:
    """Check the request and return run params plus one chunk per (table, shard)."""
    date = check_date(date)
    tables = dump.check_tables(list(tables or []))
    fmt = formats.check_format(fmt)
    if role not in ROLES:
        raise UsageError(f"bad --from {role!r} (expected master or slave)")
    dest = open_destination(dest_url)
    dest.check()
    chunks = [ChunkSpec(t, {"table": t, "shard": s})
              for t in tables for s in router.shardmap.shards()]
    params = {"kinds": tables, "date": date, "dest": dest.url, "format": fmt, "from": role,
              "force": bool(force)}
    return params, chunks


def refuse_overlap(ledger: Ledger, params: dict) -> None:
    """``FolderBusyError`` in one line naming the active export run that writes one of the
    same folders (destination, table, date) as ``params``: one run at a time per folder.
    (Chunks enforce it too, atomically: a run that slips past this check waits.)"""
    for run_id in ledger.runs(limit=200, active_only=True):
        run = ledger.run(run_id)
        other = run["params"]
        if run["kind"] != "export" or run["status"] != "running":
            continue
        same = (other.get("dest"), other.get("date")) == (params["dest"], params["date"])
        shared = [t for t in params["kinds"] if t in other.get("kinds", ())]
        if same and shared:
            raise FolderBusyError(f"run {run_id} is already exporting {', '.join(shared)} "
                                  f"of {params['date']} to {params['dest']}; wait until it ends "
                                  f"(farm status --run {run_id})")


# -- the chunk ------------------------------------------------------------------------------
def _checked(check: Callable[[], None], batches: Iterator) -> Iterator:
    for batch in batches:
        check()
        yield batch


def _claimed(dest: Destination, log_: PartLog, folder: str, name: str) -> Part | None:
    """What the manifest (or else the record) says part ``name`` of ``folder`` is."""
    raw = dest.read(folder + MANIFEST)
    if raw is not None:
        try:
            e = {e["path"]: e for e in json.loads(raw)["files"]}.get(name)
            if e is not None:
                return Part(name, e["shard"], e["rows"], e["bytes"], e["sha256"])
        except (ValueError, KeyError, TypeError):
            pass
    return log_.get(folder, name)


def _intact(dest: Destination, log_: PartLog, folder: str, name: str) -> Part | None:
    """The part already there, if its size and sha256 match its manifest entry (or else
    its record)."""
    size = dest.size(folder + name)
    if size is None:
        return None
    want = _claimed(dest, log_, folder, name)
    if want is None or want.bytes != size or dest.sha256(folder + name) != want.sha256:
        return None
    return want


def dump_part(host: Host, shard: int, table: str, fmt: str, dest: Destination, key: str,
              check: Callable[[], None] = lambda: None, fence: Fence | None = None) -> Part:
    """Stream ``table`` of ``shard`` from ``host`` into the object ``key``; visible only
    once whole. ``check`` runs between batches (a chunk's lease check), ``fence``
    immediately before the part becomes visible (default: ``check``)."""
    kind = "object" if table in OBJECT_TABLES else "mapping"
    dest.drop_leftovers(key)  # a dead attempt's temp file of this part
    with dump.snapshot(host, shard) as conn, dest.open_part(key, fence or check) as w:
        out = formats.Hashed(w)
        source = (dump.lines(conn, table, shard) if fmt == "jsonl"
                  else dump.columns(conn, table, shard))
        rows = formats.write_part(fmt, out, kind, dump.prefetched(_checked(check, source)))
        check()
        w.commit()
    return Part(key.rsplit("/", 1)[-1], shard, rows, out.bytes, out.sha256)


def export_chunk(ctx: ChunkContext, table: str, shard: int) -> Outcome:
    """Chunk handler: export ``table`` of ``shard`` as one part, then finalize if it was last."""
    p = ctx.params
    date, fmt = p["date"], p["format"]
    dest = open_destination(p["dest"])
    parts = PartLog(ctx.ledger.pool, dest.url)
    folder, name = folder_of(table, date), part_name(shard, fmt)
    parts.claim(folder, ctx.run_id)  # one run at a time writes a folder
    part = None if p.get("force") else _intact(dest, parts, folder, name)
    skipped = part is not None
    if part is None:
        withdraw(dest, folder, ctx.fence)  # changing: no success marker until final
        host = ctx.router.host_for(shard, p.get("from", "master"))
        part = dump_part(host, shard, table, fmt, dest, folder + name, ctx.check, ctx.fence)
    ctx.check()
    parts.record(folder, part, ctx.run_id)
    finalize(ctx, dest, parts, table)
    done = 0 if skipped else part.rows
    return Outcome(rows_read=done, rows_written=done,
                   counts={"table": table, **part.entry(), "skipped": skipped})


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
    expected = next((k["total"] for k in ctx.ledger.progress(ctx.run_id)
                     if k["kind"] == table), None)
    if expected is None or len(parts.of_run(folder, ctx.run_id)) < expected:
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
