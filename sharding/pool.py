"""Connection pools: one per physical MySQL server (not per shard), in one place.

Connections are utf8mb4, autocommit by default (transactions are explicit) and
allowed ``LOAD DATA LOCAL INFILE``. Each session has a short ``wait_timeout``
(``IDLE_TIMEOUT``): a worker frozen or cut off in the middle of a transaction
has it rolled back by the server within that time, so the row locks it held
(its chunk's fence row, the rows it was writing) do not block the worker that
took its chunk over. The pool never hands out a connection idle that long.
PyMySQL errors are translated into the ``FarmError`` tree here, naming host and
shard but never bind values.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import pymysql
from pymysql.constants import CLIENT, SERVER_STATUS

from shardfarm.errors import (
    FarmError,
    PermanentDatabaseError,
    TransientDatabaseError,
    UnreachableError,
)
from sharding.shardmap import Host

log = logging.getLogger(__name__)

# 2006 gone away, 2013 lost connection, 1213 deadlock, 1205 lock wait timeout,
# 1927 connection killed, 1053 server shutdown, 4031 idle disconnect, 2014 out of sync.
TRANSIENT_CODES = frozenset({2006, 2013, 1213, 1205, 1927, 1053, 4031, 2014, 2055, 1040})
UNREACHABLE_CODES = frozenset({2002, 2003})
IDLE_TIMEOUT = 30  # seconds; a session's idle limit on the server (see the module docstring)
CONNECTION_LOST = frozenset({2006, 2013, 1927, 1053, 4031, 2014, 2055})


def _scrub(message: str) -> str:
    """Drop quoted values from a server message (``Duplicate entry 'x'`` -> ``'?'``)."""
    return re.sub(r"'(?:[^'\\]|\\.)*'", "'?'", message)[:300]


def translate(exc: BaseException, host: str, shard: int | None) -> FarmError:
    """Map a PyMySQL/OS error to a transient, unreachable or plain ``DatabaseError``."""
    if isinstance(exc, FarmError):
        return exc
    code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
    text = str(exc.args[1]) if len(exc.args) > 1 else type(exc).__name__
    where = f"{host}" + (f" (shard {shard})" if shard is not None else "")
    if code in UNREACHABLE_CODES or isinstance(exc, (ConnectionError, TimeoutError)):
        return UnreachableError(f"cannot reach MySQL {where}: error {code}", host=host,
                                shard=shard, code=code)
    msg = f"MySQL error {code} on {where}: {_scrub(text)}"
    if code in TRANSIENT_CODES or isinstance(exc, pymysql.err.InterfaceError):
        return TransientDatabaseError(msg, host=host, shard=shard, code=code)
    return PermanentDatabaseError(msg, host=host, shard=shard, code=code)


class Pool:
    """A bounded LIFO pool of connections to one server; safe across threads, reset after fork."""

    def __init__(self, host: Host, size: int = 16, connect_timeout: float = 5.0,
                 database: str | None = None) -> None:
        self.host = host
        self.database = database
        self.size = size
        self.connect_timeout = connect_timeout
        self._idle: list[tuple[pymysql.Connection, float]] = []  # (connection, idle since)
        self._lock = threading.Lock()
        self._sem = threading.BoundedSemaphore(size)
        self._pid = os.getpid()

    def _connect(self) -> pymysql.Connection:
        try:
            return pymysql.connect(
                host=self.host.host, port=self.host.port, user=self.host.user,
                password=self.host.password, database=self.database,
                charset="utf8mb4", autocommit=True,
                local_infile=True, connect_timeout=self.connect_timeout,
                client_flag=CLIENT.MULTI_STATEMENTS,
                init_command=f"SET SESSION wait_timeout = {IDLE_TIMEOUT}",
            )
        except (pymysql.MySQLError, OSError) as exc:
            raise translate(exc, self.host.name, None) from None

    def _check_fork(self) -> None:
        if self._pid != os.getpid():
            self._idle = []  # sockets belong to the parent; never reuse them
            self._sem = threading.BoundedSemaphore(self.size)
            self._pid = os.getpid()

    @contextmanager
    def connection(self, shard: int | None = None) -> Iterator[pymysql.Connection]:
        """Check a connection out; it goes back to the pool unless an error broke it."""
        self._check_fork()
        self._sem.acquire()
        conn = None
        try:
            conn = self._take_idle()
            if conn is None:
                conn = self._connect()
            try:
                yield conn
            except pymysql.MySQLError as exc:
                _close_quietly(conn)  # maybe mid-transaction or mid-result: never reused
                if _lost(exc):  # the server went away or killed us: the idle ones died too
                    self.close()
                raise translate(exc, self.host.name, shard) from None
            except BaseException:
                _close_quietly(conn)  # unknown state (e.g. half-read result): do not reuse
                raise
            if conn.server_status & SERVER_STATUS.SERVER_STATUS_IN_TRANS:
                _close_quietly(conn)  # left a transaction open: the server rolls it back
                return
            with self._lock:
                self._idle.append((conn, time.monotonic()))
        finally:
            self._sem.release()

    def _take_idle(self) -> pymysql.Connection | None:
        """The most recently used idle connection, unless the server may have closed it
        (then it and every older one are dropped)."""
        with self._lock:
            if not self._idle:
                return None
            conn, since = self._idle.pop()
            if time.monotonic() - since < IDLE_TIMEOUT - 5:
                return conn
            stale, self._idle = [conn, *(c for c, _ in self._idle)], []
        for c in stale:
            _close_quietly(c)
        return None

    def close(self) -> None:
        """Close every idle connection."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn, _ in idle:
            _close_quietly(conn)


def _lost(exc: BaseException) -> bool:
    return bool(exc.args) and exc.args[0] in CONNECTION_LOST


def _close_quietly(conn: pymysql.Connection | None) -> None:
    if conn is None:
        return
    with suppress(Exception):
        conn.close()
