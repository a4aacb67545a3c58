"""The parts of one export chunk: a run of shards of one table, one part per shard.

The fixed cost of a part is paid once per chunk, not once per shard:

- **what is there already**: one read of the manifest and one query of the records, then
  (only for parts they name) one listing of their sizes (``Destination.sizes``); only a
  part that exists with the recorded size is read again for its sha256 (a re-export);
- **reading**: one connection and one ``START TRANSACTION WITH CONSISTENT SNAPSHOT`` per
  server the chunk's shards are on (all of them, unless shards moved since the plan): every
  part of a chunk from one server comes from the same snapshot. One query finds the empty
  shards inside that snapshot; an empty shard's part is written without reading it;
- **making visible**: parts are written to invisible temp objects; a group is made durable
  at once (``PartWriter.prepare`` on several threads: the fsyncs share journal commits),
  then a group of up to ``GROUP_PARTS`` parts (at most ``GROUP_BYTES``
  held in memory) is then published one after the other, each behind the chunk's fence
  (``ChunkContext.fence_fresh``: one renewal of the lease serves the parts published within
  a second of it, each still checked against the lease's deadline), S3 uploads several at
  a time; the folder is synced once and the group's ``export_parts`` rows written in one
  statement.

A chunk killed half way leaves whole parts that are recorded (skipped when it runs again)
or whole parts not recorded yet and temp files (written again; ``drop_leftovers``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

from exporters import dump, formats
from exporters.destinations import Destination, Fence, PartWriter
from exporters.partlog import Part, PartLog
from shardfarm.mysql.dsn import Host
from sharding.schema import OBJECT_TABLES

GROUP_PARTS = 64
GROUP_BYTES = 8 * 1024 * 1024  # single-PUT bodies an S3 group may hold in memory at once
THREADS = 8  # parts made durable (fsync, last upload) or published (S3) at once
MANIFEST = "_manifest.json"


def part_name(shard: int, fmt: str) -> str:
    """``part-00042.jsonl.gz``."""
    return f"part-{shard:05d}.{formats.EXTENSIONS[fmt]}"


def checked(check: Callable[[], None], batches: Iterator) -> Iterator:
    """``batches``, ``check()`` before each is handed on (a chunk's lease check)."""
    for batch in batches:
        check()
        yield batch


# -- what is there already ------------------------------------------------------------------
def claimed(dest: Destination, log_: PartLog, folder: str, names: list[str]) -> dict[str, Part]:
    """What the manifest (or else the record) says each of ``names`` of ``folder`` is."""
    out: dict[str, Part] = {}
    raw = dest.read(folder + MANIFEST)
    if raw is not None:
        try:
            entries = {e["path"]: e for e in json.loads(raw)["files"]}
            out = {n: Part(n, e["shard"], e["rows"], e["bytes"], e["sha256"])
                   for n in names if (e := entries.get(n)) is not None}
        except (ValueError, KeyError, TypeError):
            out = {}
    return {**log_.get_many(folder, [n for n in names if n not in out]), **out}


def intact(dest: Destination, log_: PartLog, folder: str, names: list[str]) -> dict[str, Part]:
    """The parts among ``names`` already there whose size and sha256 match their manifest
    entry (or else their record). Only claimed names are looked for: a first export of a
    folder neither lists nor reads a part."""
    want = claimed(dest, log_, folder, names)
    sizes = dest.sizes(folder, sorted(want)) if want else {}
    return {n: p for n, p in want.items()
            if sizes.get(n) == p.bytes and dest.sha256(folder + n) == p.sha256}


def other_formats(log_: PartLog, folder: str, shards: list[int], fmt: str) -> list[str]:
    """Recorded parts of ``shards`` in ``folder`` in a format other than ``fmt``: an export
    of the date in another format replaces them (a reader of the folder takes every part)."""
    names = [part_name(s, f) for f in formats.EXTENSIONS if f != fmt for s in shards]
    return sorted(log_.get_many(folder, names))


def drop(dest: Destination, log_: PartLog, folder: str, names: list[str],
         fence: Fence) -> None:
    """Delete the parts ``names`` of ``folder`` (each behind ``fence``), then their records."""
    for name in names:
        fence()
        dest.delete(folder + name)
    log_.forget(folder, names)


# -- writing one part -----------------------------------------------------------------------
def write_part(conn, host_shard: int, table: str, fmt: str, dest: Destination, key: str,
               check: Callable[[], None], fence: Fence, empty: bool) -> tuple[PartWriter, Part]:
    """Stream ``table`` of shard ``host_shard`` over ``conn`` (in its snapshot) into the
    temp object of ``key``, not visible; ``empty``: write an empty part without reading.
    Returns the writer (to prepare and publish) and the part it will publish."""
    kind = "object" if table in OBJECT_TABLES else "mapping"
    w = dest.open_part(key, fence)
    try:
        out = formats.Hashed(w)
        if empty:
            source: Iterator = iter(())
        else:
            source = (dump.lines(conn, table, host_shard) if fmt == "jsonl"
                      else dump.columns(conn, table, host_shard))
            source = dump.prefetched(checked(check, source))
        rows = formats.write_part(fmt, out, kind, source)
        check()
    except BaseException:
        w.abort()
        raise
    return w, Part(key.rsplit("/", 1)[-1], host_shard, rows, out.bytes, out.sha256)


# -- publishing a group ---------------------------------------------------------------------
class Group:
    """Prepared parts of one folder waiting to be published together, then recorded."""

    def __init__(self, dest: Destination, folder: str, record: Callable[[list[Part]], None],
                 parallel: bool) -> None:
        self.dest, self.folder, self.record, self.parallel = dest, folder, record, parallel
        self.pending: list[tuple[PartWriter, Part]] = []
        self.held = 0

    def add(self, writer: PartWriter, part: Part) -> None:
        """Hold a prepared part; publish the group once it is full."""
        self.pending.append((writer, part))
        self.held += part.bytes
        if len(self.pending) >= GROUP_PARTS or self.held >= GROUP_BYTES:
            self.flush()

    def flush(self) -> None:
        """Publish every held part (each behind its fence), sync the folder, record them."""
        if not self.pending:
            return
        writers = [w for w, _ in self.pending]
        try:
            with ThreadPoolExecutor(min(THREADS, len(writers))) as pool:
                list(pool.map(lambda w: w.prepare(), writers))  # fsyncs meet in one commit
                if self.parallel:
                    list(pool.map(lambda w: w.publish(), writers))
                else:
                    for w in writers:
                        w.publish()
        except BaseException:
            self.abort()
            raise
        self.dest.sync(self.folder)
        self.record([p for _, p in self.pending])
        self.pending, self.held = [], 0

    def abort(self) -> None:
        """Drop every held part that is not published (temp files, uploads)."""
        for w, _ in self.pending:
            w.abort()
        self.pending, self.held = [], 0


def by_host(hosts: Callable[[int], Host], shards: list[int]) -> list[tuple[Host, list[int]]]:
    """``shards`` in order, grouped by consecutive runs on one server."""
    out: list[tuple[Host, list[int]]] = []
    for s in shards:
        h = hosts(s)
        if out and out[-1][0].server == h.server:
            out[-1][1].append(s)
        else:
            out.append((h, [s]))
    return out


def write_parts(hosts: Callable[[int], Host], table: str, fmt: str, dest: Destination,
                folder: str, shards: list[int], record: Callable[[list[Part]], None],
                check: Callable[[], None], fence: Fence) -> list[Part]:
    """Write the part of every shard of ``shards`` into ``folder`` (one snapshot per server,
    published and recorded in groups); returns the parts written."""
    written: list[Part] = []

    def keep(parts: list[Part]) -> None:
        record(parts)
        written.extend(parts)
    group = Group(dest, folder, keep, parallel=dest.parallel_publish)
    dest.drop_leftovers_of(folder, [part_name(s, fmt) for s in shards])  # dead attempts'
    try:
        for host, run in by_host(hosts, shards):
            with dump.snapshot(host, run[0]) as conn:
                full = dump.nonempty(conn, table, run)
                for s in run:
                    check()
                    group.add(*write_part(conn, s, table, fmt, dest,
                                          folder + part_name(s, fmt), check, fence,
                                          empty=s not in full))
        group.flush()
    except BaseException:
        group.abort()
        raise
    return written
