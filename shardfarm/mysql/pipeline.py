"""Statements of one transaction sent together, their results judged before it commits.

With thousands of shards a chunk writes a few rows to each, and a round trip per
statement, not the rows, set its time. A ``Pipeline`` lives inside one transaction on a
connection allowed multi-statements: ``add`` queues a statement (its parameters bound
by the driver) with an optional check of its result. ``flush`` sends the queue in two
steps, each in as few round trips as ``MAX_CHARS`` allows: first the *guards* (fence,
shard-state and slot checks, ``add(..., guard=True)``), whose checks are judged as soon
as they are read; then, only if every guard passed, the other statements, whose checks
run after all of them are read. A refused guard therefore means the writes it guards
were never sent, as if each statement had waited for the one before; a check that
raises later aborts the transaction before its commit (the caller rolls back). Work
that needs checked results (``then``) runs after the checks, on the same cursor and
transaction.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pymysql.cursors import Cursor

MAX_CHARS = 1 << 19  # SQL characters per round trip: at most 2 MiB of utf8mb4, half of
# the smallest max_allowed_packet default (4 MiB, MySQL 5.7); a longer statement goes
# alone, so callers keep theirs shorter (loaders.migration.writer.INSERT_CHARS)


@dataclass(frozen=True)
class Result:
    """One statement's outcome: rows affected (or returned) and the rows it returned."""

    rowcount: int
    rows: tuple[tuple, ...]


Check = Callable[[Result], None]


class Pipeline:
    """Queued statements of the transaction open on ``cur`` (multi-statements allowed)."""

    def __init__(self, cur: Cursor, max_chars: int = MAX_CHARS) -> None:
        self.cur = cur
        self.max_chars = max_chars
        self._guards: list[tuple[str, Check | None]] = []
        self._queue: list[tuple[str, Check | None]] = []
        self._then: list[Callable[[Cursor], None]] = []

    def add(self, sql: str, params: tuple | list | None = None, check: Check | None = None,
            *, guard: bool = False) -> None:
        """Queue ``sql`` with ``params``; ``check(result)`` runs at ``flush`` and may raise
        to abort the transaction. A ``guard`` is sent, and its check judged, before any
        other statement is sent; the others' checks run once all of them have run."""
        (self._guards if guard else self._queue).append((self.cur.mogrify(sql, params), check))

    def then(self, fn: Callable[[Cursor], None]) -> None:
        """Run ``fn(cursor)`` at the end of ``flush``, once every check has passed (a check
        may call this: what it found decides what else the transaction does)."""
        self._then.append(fn)

    def flush(self) -> None:
        """Send the guards and judge them, then send the rest, read every result, run their
        checks in order, then ``then``'s."""
        guards, queue, self._guards, self._queue = self._guards, self._queue, [], []
        self._send(guards)
        self._send(queue)
        while self._then:
            self._then.pop(0)(self.cur)

    def _send(self, queue: list[tuple[str, Check | None]]) -> None:
        results: list[Result] = []
        for batch in _batches([sql for sql, _ in queue], self.max_chars):
            results += _run(self.cur, batch)
        for (_, check), result in zip(queue, results, strict=True):
            if check is not None:
                check(result)


def _batches(sqls: list[str], max_chars: int) -> Iterator[list[str]]:
    """``sqls`` in order, in runs of at most ``max_chars`` (a longer statement goes alone)."""
    batch: list[str] = []
    size = 0
    for sql in sqls:
        if batch and size + len(sql) > max_chars:
            yield batch
            batch, size = [], 0
        batch.append(sql)
        size += len(sql) + 2
    if batch:
        yield batch


def _run(cur: Cursor, sqls: list[str]) -> list[Result]:
    """``sqls`` as one round trip; every result, read (an error raises at its statement,
    and the server runs none after it)."""
    cur.execute(";\n".join(sqls))
    out = [_result(cur)]
    while cur.nextset():
        out.append(_result(cur))
    return out


def _result(cur: Cursor) -> Result:
    rows = tuple(cur.fetchall()) if cur.description else ()
    return Result(cur.rowcount, rows)
