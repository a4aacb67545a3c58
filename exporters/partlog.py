"""What an export wrote, who writes a folder, who finalizes it: the control database's side.

``export_parts`` remembers every part written (or confirmed intact) with its rows,
bytes and sha256. ``export_claims`` lets one run at a time write a folder
(``{table}/dt={date}/`` of one destination): a run's chunk claims the folder
before it touches anything there, and waits while another active run holds it.
``export_locks`` holds short leases as rows (the folder's finalizer), so a lock
never depends on a connection staying open: the server may drop an idle pooled
connection (``wait_timeout``) without releasing anything. This module is the only
one that reads or writes these three tables.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pymysql.cursors

from shardfarm.errors import RetryableError
from shardfarm.mysql.pool import Pool

ACTIVE = ("running", "paused")  # run statuses that still write
LOCK_SECONDS = 120  # a finalizer frozen longer than this lets the next one in (same manifest)


class FolderBusyError(RetryableError):
    """Another active export run is writing this folder; this one waits for it."""


def ref(dest_url: str, path: str) -> str:
    """``sha256(dest NUL path)``: the control database's key of a destination path."""
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
    """``export_parts``, ``export_claims`` and ``export_locks`` of one destination."""

    def __init__(self, pool: Pool, dest_url: str) -> None:
        self.pool, self.dest = pool, dest_url  # the control database's pool

    def record(self, folder: str, part: Part, run_id: str) -> None:
        """Remember that ``part`` is in ``folder`` as written (or confirmed) by ``run_id``."""
        self.record_many(folder, [part], run_id)

    def record_many(self, folder: str, parts: list[Part], run_id: str) -> None:
        """``record`` for several parts of ``folder`` in one statement."""
        if not parts:
            return
        key = ref(self.dest, folder)
        rows = [(ref(self.dest, folder + p.path), key, self.dest, folder + p.path, p.shard,
                 p.rows, p.bytes, p.sha256, run_id) for p in parts]
        marks = ",".join(["(%s,%s,%s,%s,%s,%s,%s,%s,%s)"] * len(rows))
        self.pool.execute("INSERT INTO export_parts (ref, folder, dest, path, shard, "
                          f"row_count, bytes, sha256, run_id) VALUES {marks} "
                          "ON DUPLICATE KEY UPDATE shard = VALUES(shard), "
                          "row_count = VALUES(row_count), bytes = VALUES(bytes), "
                          "sha256 = VALUES(sha256), run_id = VALUES(run_id), written_at = NOW(3)",
                          [v for row in rows for v in row])

    def get(self, folder: str, name: str) -> Part | None:
        """The recorded part ``name`` of ``folder``, if any."""
        return self.get_many(folder, [name]).get(name)

    def get_many(self, folder: str, names: list[str]) -> dict[str, Part]:
        """The recorded parts among ``names`` of ``folder``, by name (one query)."""
        if not names:
            return {}
        by_ref = {ref(self.dest, folder + n): n for n in names}
        marks = ",".join(["%s"] * len(by_ref))
        rows = self.pool.query("SELECT ref, shard, row_count, bytes, sha256 FROM export_parts "
                               f"WHERE ref IN ({marks})", list(by_ref))
        return {by_ref[r]: Part(by_ref[r], s, n, b, h) for r, s, n, b, h in rows}

    def forget(self, folder: str, names: list[str]) -> None:
        """Drop the records of the parts ``names`` of ``folder`` (deleted from the folder)."""
        if names:
            refs = [ref(self.dest, folder + n) for n in names]
            self.pool.execute("DELETE FROM export_parts WHERE ref IN "
                              f"({','.join(['%s'] * len(refs))})", refs)

    def count_of_run(self, folder: str, run_id: str) -> int:
        """How many parts of ``folder`` ``run_id`` recorded."""
        return int(self.pool.query("SELECT COUNT(*) FROM export_parts WHERE folder = %s "
                                   "AND run_id = %s", (ref(self.dest, folder), run_id))[0][0])

    def of_run(self, folder: str, run_id: str) -> list[Part]:
        """Parts of ``folder`` recorded by ``run_id``, by shard."""
        rows = self.pool.query("SELECT path, shard, row_count, bytes, sha256 FROM export_parts "
                               "WHERE folder = %s AND run_id = %s ORDER BY shard",
                               (ref(self.dest, folder), run_id))
        return [Part(p.rsplit("/", 1)[-1], s, r, b, h) for p, s, r, b, h in rows]

    # -- one run per folder -----------------------------------------------------------------
    def claim(self, folder: str, run_id: str) -> None:
        """Make ``run_id`` the writer of ``folder``; ``FolderBusyError`` naming the other run
        while another run that is still active holds it. Idempotent."""
        key = ref(self.dest, folder)

        def take(cur: pymysql.cursors.Cursor) -> str | None:
            cur.execute("SELECT c.run_id, r.status FROM export_claims c LEFT JOIN runs r "
                        "ON r.run_id = c.run_id WHERE c.folder = %s FOR UPDATE", (key,))
            row = cur.fetchone()
            holder = row[0] if row and row[0] != run_id and row[1] in ACTIVE else None
            if holder is None and (not row or row[0] != run_id):
                cur.execute("INSERT INTO export_claims (folder, run_id) VALUES (%s, %s) "
                            "ON DUPLICATE KEY UPDATE claimed_at = NOW(3), "
                            "run_id = VALUES(run_id)", (key, run_id))
            return holder
        holder = self.pool.run(take, transaction=True)
        if holder is not None:
            raise FolderBusyError(f"export {self.dest}/{folder} is being written by run "
                                  f"{holder}; this run waits until it ends")

    # -- short leases as rows ---------------------------------------------------------------
    @contextmanager
    def lock(self, folder: str, wait: float = 60) -> Iterator[None]:
        """Hold the finalize lock of ``folder`` (waiting up to ``wait`` seconds for it).

        A row with a random token and an expiry, taken by compare-and-set: no connection
        is held meanwhile, so an idle connection the server drops releases nothing. A
        holder frozen past ``LOCK_SECONDS`` lets the next one in.
        """
        name, token = ref(self.dest, "\0lock\0" + folder), secrets.token_hex(16)
        self.pool.execute("INSERT IGNORE INTO export_locks (name, token, expires) "
                          "VALUES (%s, '', NOW(3))", (name,))
        deadline = time.monotonic() + wait
        while not self.pool.execute("UPDATE export_locks SET token = %s, expires = NOW(3) + "
                                    "INTERVAL %s SECOND WHERE name = %s AND expires <= NOW(3)",
                                    (token, LOCK_SECONDS, name)):
            if time.monotonic() >= deadline:
                raise RetryableError(f"export folder {folder} is being finalized elsewhere")
            time.sleep(0.05)
        try:
            yield
        finally:
            self.pool.execute("UPDATE export_locks SET token = '', expires = NOW(3) - INTERVAL "
                              "1 SECOND WHERE name = %s AND token = %s", (name, token))
