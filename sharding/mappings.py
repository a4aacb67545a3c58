"""Mapping store: ``(from_id, to_id, sequence)`` rows on the shard of ``from_id``.

Pages are newest sequence first, ties broken by ``to_id`` (descending), which
is exactly the order of the ``(from_id, sequence, to_id)`` index read backwards,
so a keyset cursor pages without gaps or repeats even when many rows share a sequence.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from shardfarm.errors import FatalError, InvalidIdError
from sharding import ids
from sharding.router import Router
from sharding.schema import MAPPING_TABLES, shard_table


@dataclass(frozen=True)
class Edge:
    """One mapping row."""

    from_id: int
    to_id: int
    sequence: int


@dataclass(frozen=True)
class Page:
    """A page of a mapping and the cursor of the next page (``None`` at the end)."""

    edges: list[Edge]
    next_cursor: str | None

    @property
    def ids(self) -> list[int]:
        """The ``to_id`` of every row, in page order."""
        return [e.to_id for e in self.edges]


def encode_cursor(edge: Edge) -> str:
    """An opaque keyset cursor positioned after ``edge``."""
    return f"{edge.sequence}:{edge.to_id}"


def decode_cursor(cursor: str) -> tuple[int, int]:
    """``(sequence, to_id)`` of a cursor; a malformed cursor is an ``InvalidIdError``."""
    try:
        seq, to_id = cursor.split(":")
        return int(seq), int(to_id)
    except ValueError:
        raise InvalidIdError(f"malformed page cursor {cursor!r}") from None


class MappingStore:
    """Idempotent adds, removes, ordered pages and counts for one mapping table."""

    def __init__(self, router: Router, table: str) -> None:
        if table not in MAPPING_TABLES:
            raise FatalError(f"unknown mapping table {table!r}")
        self.router = router
        self.table = table
        self.spec = MAPPING_TABLES[table]

    def _q(self, shard: int) -> str:
        return shard_table(shard, self.table)

    def add(self, from_id: int, to_id: int, sequence: int) -> None:
        """Add (or re-add) one row; adding twice leaves one row with the newest sequence."""
        self.add_many([Edge(from_id, to_id, sequence)])

    def add_many(self, edges: Iterable[Edge], batch: int = 1000) -> int:
        """Add rows in batched INSERTs grouped by shard, in primary-key order; returns rows sent."""
        by_shard: dict[int, list[Edge]] = defaultdict(list)
        for e in edges:
            ids.decode(e.from_id)
            ids.decode(e.to_id)
            by_shard[ids.shard_of(e.from_id)].append(e)
        total = 0
        for shard, rows in by_shard.items():
            rows.sort(key=lambda e: (e.from_id, e.to_id))
            for i in range(0, len(rows), batch):
                chunk = rows[i:i + batch]
                self.router.run(shard, lambda cur, c=chunk, s=shard: self._insert(cur, s, c))
                total += len(chunk)
        return total

    def _insert(self, cur, shard: int, rows: list[Edge]) -> None:
        marks = ",".join(["(%s,%s,%s)"] * len(rows))
        params = [v for e in rows for v in (e.from_id, e.to_id, e.sequence)]
        cur.execute(f"INSERT INTO {self._q(shard)} (from_id, to_id, sequence) VALUES {marks}"
                    " ON DUPLICATE KEY UPDATE sequence = VALUES(sequence)", params)

    def remove(self, from_id: int, to_id: int) -> bool:
        """Remove one row; returns whether it existed."""
        shard = ids.decode(from_id).shard

        def delete(cur) -> bool:
            return cur.execute(f"DELETE FROM {self._q(shard)} WHERE from_id = %s AND to_id = %s",
                               (from_id, to_id)) > 0
        return self.router.run(shard, delete)

    def page(self, from_id: int, limit: int = 50, cursor: str | None = None,
             offset: int = 0) -> Page:
        """The next ``limit`` rows after ``cursor`` (or skipping ``offset``), newest first."""
        if not 1 <= limit <= 10_000 or offset < 0:
            raise FatalError(f"bad page request: limit {limit}, offset {offset}")
        shard = ids.decode(from_id).shard
        where, params = "from_id = %s", [from_id]
        if cursor:
            seq, to_id = decode_cursor(cursor)
            where += " AND (sequence < %s OR (sequence = %s AND to_id < %s))"
            params += [seq, seq, to_id]
        sql = (f"SELECT from_id, to_id, sequence FROM {self._q(shard)} WHERE {where}"
               " ORDER BY sequence DESC, to_id DESC LIMIT %s OFFSET %s")

        def select(cur) -> list[tuple]:
            cur.execute(sql, [*params, limit + 1, offset])
            return cur.fetchall()
        rows = [Edge(*r) for r in self.router.run(shard, select)]
        more = len(rows) > limit
        edges = rows[:limit]
        return Page(edges, encode_cursor(edges[-1]) if more and edges else None)

    def count(self, from_id: int) -> int:
        """How many rows ``from_id`` has."""
        shard = ids.decode(from_id).shard

        def select(cur) -> int:
            cur.execute(f"SELECT COUNT(*) FROM {self._q(shard)} WHERE from_id = %s", (from_id,))
            return cur.fetchone()[0]
        return self.router.run(shard, select)
