"""``farm export``: every (table, shard) of the map to ``{dest}/{table}/dt={date}/``.

One chunk per (table, shard) writes ``part-{shard:05d}.jsonl.gz`` (or
``.parquet``) from one consistent snapshot of that shard table, streamed, and
records the part's rows, bytes and sha256 in the control database
(``export_parts``). The chunk that completes a table — every shard of the run
recorded — writes ``_manifest.json`` and then ``_SUCCESS``; two chunks that
complete at once write the same manifest twice, which is harmless.

A re-export of the same date skips a part whose manifest entry (or, before any
manifest, whose recorded bytes) matches the object that is there, unless
``force``. A part that is written again first withdraws the folder's
``_SUCCESS``, so a reader never sees old and new parts under one success marker.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from exporters import dump, formats
from exporters.destinations import Destination, open_destination
from shardfarm.context import ChunkContext
from shardfarm.errors import RetryableError, UsageError
from shardfarm.ledger import ChunkSpec, Ledger, Outcome
from shardfarm.retry import TRANSIENT
from sharding.router import Router
from sharding.schema import OBJECT_TABLES
from sharding.shardmap import Host

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


# -- what was written: the control database's export_parts ---------------------------------
def _ref(dest_url: str, path: str) -> str:
    return hashlib.sha256(f"{dest_url}\0{path}".encode()).hexdigest()


@dataclass(frozen=True)
class Part:
    """One written part: its file name in the folder, shard, rows, bytes and checksum."""

    path: str
    shard: int
    rows: int
    bytes: int
    sha256: str

    def entry(self) -> dict:
        """The part's entry in ``_manifest.json``."""
        return {"path": self.path, "shard": self.shard, "rows": self.rows,
                "bytes": self.bytes, "sha256": self.sha256}


class PartLog:
    """``export_parts`` rows of one destination (through the ledger's control-DB pool)."""

    def __init__(self, ledger: Ledger, dest_url: str) -> None:
        self.pool, self.dest = ledger.pool, dest_url

    def _run(self, sql: str, params: tuple) -> list[tuple]:
        def attempt() -> list[tuple]:
            with self.pool.connection() as conn, conn.cursor() as cur:
                cur.execute(sql, params)
                return list(cur.fetchall())
        return TRANSIENT.call(attempt)

    def record(self, folder: str, part: Part, run_id: str) -> None:
        """Remember that ``part`` is in ``folder`` as written (or confirmed) by ``run_id``."""
        self._run("INSERT INTO export_parts (ref, folder, dest, path, shard, row_count, bytes, "
                  "sha256, run_id) VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s) ON DUPLICATE KEY UPDATE "
                  "shard = VALUES(shard), row_count = VALUES(row_count), bytes = VALUES(bytes), "
                  "sha256 = VALUES(sha256), run_id = VALUES(run_id), written_at = NOW(3)",
                  (_ref(self.dest, folder + part.path), _ref(self.dest, folder), self.dest,
                   folder + part.path, part.shard, part.rows, part.bytes, part.sha256, run_id))

    @contextmanager
    def lock(self, folder: str, wait: int = 60) -> Iterator[None]:
        """Hold the control database's named lock of ``folder`` (``GET_LOCK``)."""
        name = "farm-export-" + _ref(self.dest, folder)[:40]
        with self.pool.connection() as conn, conn.cursor() as cur:
            cur.execute("SELECT GET_LOCK(%s, %s)", (name, wait))
            if cur.fetchone()[0] != 1:
                raise RetryableError(f"export folder {folder} is being finalized elsewhere")
            try:
                yield
            finally:
                cur.execute("SELECT RELEASE_LOCK(%s)", (name,))

    def get(self, folder: str, name: str) -> Part | None:
        """The recorded part ``name`` of ``folder``, if any."""
        rows = self._run("SELECT shard, row_count, bytes, sha256 FROM export_parts "
                         "WHERE ref = %s", (_ref(self.dest, folder + name),))
        return Part(name, rows[0][0], rows[0][1], rows[0][2], rows[0][3]) if rows else None

    def of_run(self, folder: str, run_id: str) -> list[Part]:
        """Parts of ``folder`` recorded by ``run_id``, by shard."""
        rows = self._run("SELECT path, shard, row_count, bytes, sha256 FROM export_parts "
                         "WHERE folder = %s AND run_id = %s ORDER BY shard",
                         (_ref(self.dest, folder), run_id))
        return [Part(p.rsplit("/", 1)[-1], s, r, b, h) for p, s, r, b, h in rows]


# -- the chunk ------------------------------------------------------------------------------
def _checked(check: Callable[[], None], batches: Iterator) -> Iterator:
    for batch in batches:
        check()
        yield batch


def _intact(dest: Destination, log_: PartLog, folder: str, name: str) -> Part | None:
    """The part already there, if it matches its manifest entry (or else its record)."""
    size = dest.size(folder + name)
    if size is None:
        return None
    raw = dest.read(folder + MANIFEST)
    if raw is not None:
        try:
            entries = {e["path"]: e for e in json.loads(raw)["files"]}
        except (ValueError, KeyError, TypeError):
            entries = {}
        e = entries.get(name)
        if e is not None and e.get("bytes") == size:
            return Part(name, e["shard"], e["rows"], e["bytes"], e["sha256"])
    rec = log_.get(folder, name)
    return rec if rec is not None and rec.bytes == size else None


def dump_part(host: Host, shard: int, table: str, fmt: str, dest: Destination, key: str,
              check: Callable[[], None] = lambda: None) -> Part:
    """Stream ``table`` of ``shard`` from ``host`` into the object ``key``; visible only
    once whole. ``check`` runs between batches (a chunk's lease and fencing check)."""
    kind = "object" if table in OBJECT_TABLES else "mapping"
    with dump.snapshot(host, shard) as conn, dest.open_part(key) as w:
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
    parts = PartLog(ctx.ledger, dest.url)
    folder, name = folder_of(table, date), part_name(shard, fmt)
    part = None if p.get("force") else _intact(dest, parts, folder, name)
    skipped = part is not None
    if part is None:
        withdraw(dest, folder)  # this folder is changing: no success marker until final
        host = ctx.router.host_for(shard, p.get("from", "master"))
        part = dump_part(host, shard, table, fmt, dest, folder + name, ctx.check)
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
        write_final(dest, folder, manifest_doc(table, p["date"], p["format"], have))
    return True


def write_final(dest: Destination, folder: str, manifest: dict) -> None:
    """Write ``_manifest.json`` (unless identical) and then, last, ``_SUCCESS``."""
    body = (json.dumps(manifest, indent=1) + "\n").encode()
    if dest.read(folder + MANIFEST) != body:
        withdraw(dest, folder)
        dest.put(folder + MANIFEST, body)
    elif dest.exists(folder + SUCCESS):
        return
    dest.put(folder + SUCCESS, b"")
    log.info("export %s%s complete: %d file(s), %d rows", dest.url + "/", folder,
             len(manifest["files"]), manifest["rows"])


def withdraw(dest: Destination, folder: str) -> None:
    """Remove the folder's ``_SUCCESS`` if there is one (before any of its files changes)."""
    if dest.exists(folder + SUCCESS):
        dest.delete(folder + SUCCESS)
