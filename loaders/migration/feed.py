"""The binlog read ahead by a process of its own (``farm sync``): decoding row events is
pure Python (``pymysqlreplication``), about a third of a follower's CPU, so it runs beside
the apply instead of taking turns with it for one interpreter.

The reader process sends each change reduced to what ``farm sync`` looks at (the legacy
table's key and judged columns) and each transaction's end, as JSON over a pipe; the
pipe is bounded, so a reader ahead of the apply waits. It exits with its parent: a write
to a closed pipe (at the latest at the next heartbeat, every second) ends it.
"""

from __future__ import annotations

import multiprocessing
import queue
import signal
import threading
from collections import deque
from contextlib import suppress
from typing import Protocol

import orjson
import pymysql

from loaders.migration.binlog import (
    Change,
    Mark,
    PartialImageError,
    PurgedPositionError,
    stream,
)
from loaders.migration.spec import SPEC
from shardfarm.errors import FarmError, PermanentDatabaseError, TransientDatabaseError
from shardfarm.mysql.connect import translate
from shardfarm.mysql.db import where
from shardfarm.mysql.dsn import DSN

CHANGE, MARK, ERROR = 0, 1, 2
# what ``farm sync`` decides by, of each legacy table's changes: its key and judged columns
JUDGED = {table: spec.judge_columns for table, spec in SPEC.items()}
SEND_ITEMS = 2000  # changes per message inside a large transaction
# The reader sends at least the server's heartbeat every second (``stream``): this long
# without a message is a stalled stream (a server or network that stopped answering
# without closing the connection), not a quiet one; sync would otherwise wait for ever.
SILENCE_SECONDS = 60.0


class Batch(Protocol):
    """What ``Feed.take`` fills: row changes in, keys counted."""

    def add(self, table: str, before: dict | None, after: dict | None) -> None:
        """One row change."""

    def rows(self) -> int:
        """Keys held."""


class Feed:
    """Row changes of whole transactions from ``start`` on, read ahead by a child process
    and drained from its pipe by a thread (a pipe holds 64 KiB: without it, read-ahead
    would stop at a few hundred changes). Bounded: ``limit`` messages at most."""

    def __init__(self, dsn: DSN, start: str, limit: int = 20_000) -> None:
        self._where = f"{dsn.host}:{dsn.port}"
        ctx = multiprocessing.get_context("spawn")  # no copy of this process's threads
        recv, send = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(target=_read, args=(dsn, start, send), daemon=True,
                                 name="farm-sync-binlog")
        self._proc.start()
        send.close()
        self._messages: queue.Queue[list] = queue.Queue(limit)
        self._items: deque = deque()
        self._closed = threading.Event()
        threading.Thread(target=self._drain, args=(recv,), daemon=True,
                         name="binlog-pipe").start()

    def _drain(self, recv) -> None:
        with recv:
            while not self._closed.is_set():
                try:
                    message = orjson.loads(recv.recv_bytes())
                except (EOFError, OSError):
                    message = [[ERROR, "gone", "the binlog reader process ended (exit "
                                f"{self._proc.exitcode}): run farm sync again"]]
                while not self._closed.is_set():
                    try:
                        self._messages.put(message, timeout=0.2)
                        break
                    except queue.Full:
                        continue
                if message and message[-1][0] == ERROR:
                    return

    def _next(self) -> list:
        while not self._items:
            try:
                self._items.extend(self._messages.get(timeout=SILENCE_SECONDS))
            except queue.Empty:
                raise TransientDatabaseError(
                    f"the binlog stream of the legacy server {self._where} sent nothing, not "
                    f"even its heartbeat, for {SILENCE_SECONDS:.0f} s (a stalled server or "
                    "network): run farm sync again") from None
        return self._items.popleft()

    def take(self, batch: Batch, most: int) -> Mark:
        """Add to ``batch`` the row changes of whole transactions until the end of one finds
        nothing more read ahead, or ``batch`` holds ``most`` keys, or the server is idle;
        returns that transaction's end (or the idle mark). Blocks for the first, at most
        ``SILENCE_SECONDS`` without a message (then ``TransientDatabaseError``)."""
        while True:
            kind, *rest = self._next()
            if kind == CHANGE:
                batch.add(*rest)
                continue
            if kind == ERROR:
                raise _error(*rest)
            mark = Mark(*rest)
            if mark.idle or batch.rows() >= most or not (self._items or
                                                         self._messages.qsize()):
                return mark

    def close(self) -> None:
        """Stop the reader process and the thread draining its pipe."""
        self._closed.set()
        self._proc.kill()  # it ignores SIGTERM (see ``_read``)
        self._proc.join(5)


FATAL = {"purged": PurgedPositionError, "partial": PartialImageError,
         "permanent": PermanentDatabaseError}


def _error(kind: str, message: str) -> FarmError:
    return FATAL.get(kind, TransientDatabaseError)(message)


def _read(dsn: DSN, start: str, send) -> None:
    """The reader process: stream, reduce, send; an error is sent as the last message."""
    for sig in (signal.SIGINT, signal.SIGTERM):  # sent to the group: the parent stops, and
        signal.signal(sig, signal.SIG_IGN)        # stops this one when it is done
    out: list = []
    try:
        for item in stream(dsn, start, JUDGED):
            if isinstance(item, Change):
                out.append([CHANGE, item.table, item.before, item.after])
                if len(out) < SEND_ITEMS:
                    continue
            else:
                out.append([MARK, item.position, item.timestamp, item.idle])
            send.send_bytes(orjson.dumps(out, default=str))
            out = []
        out.append([ERROR, "ended", f"the binlog stream of {dsn.host}:{dsn.port} ended: "
                                    "run farm sync again"])
    except (PurgedPositionError, PartialImageError) as exc:
        out.append([ERROR, next(k for k, c in FATAL.items() if isinstance(exc, c)), str(exc)])
    except (BrokenPipeError, EOFError):
        return  # the parent is gone
    except pymysql.MySQLError as exc:  # named as every other connection's (TLS refused, ...)
        err = translate(exc, where(dsn))
        kind = "permanent" if isinstance(err, PermanentDatabaseError) else "other"
        out.append([ERROR, kind, f"reading the binlog: {err}"])
    except Exception as exc:  # noqa: BLE001 - sent to the parent, which raises it
        out.append([ERROR, "other", f"reading the binlog of {dsn.host}:{dsn.port}: "
                                    f"{type(exc).__name__}: {exc}"])
    with suppress(OSError):
        send.send_bytes(orjson.dumps(out, default=str))
