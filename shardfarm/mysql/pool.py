"""Connection pools: one per physical MySQL server and capability set, in one place.

Connections are utf8mb4 and autocommit by default (transactions are explicit).
They are plain unless the pool is asked for a capability: ``infile`` (``LOAD DATA
LOCAL INFILE``, for the shard writer) or ``multi`` (multi-statements, for the writers'
pipelined round trips), never both; a server can never read a file through any
other connection. Each session has a short ``wait_timeout`` (``IDLE_TIMEOUT``): a worker
frozen or cut off in the middle of a transaction has it rolled back by the server
within that time, so the row locks it held (its chunk's fence row, the rows it was
writing) do not block the worker that took its chunk over. The pool never hands
out a connection idle that long. A pool for status reads is given a ``Bound``
(``shardfarm.bounds``): its statements, lock waits and socket reads end within it, and a
call is retried only within it; bulk pools (the default, ``BULK``) have no such bound.
Every session is REPEATABLE READ whatever the
server's default: a writer that locks a slot it found empty (``FOR UPDATE``) relies
on the gap lock that level takes to keep another row out of it until it commits.
PyMySQL errors are translated into the ``FarmError`` tree
(``shardfarm.mysql.connect``), naming the host, its server and the shard but never
bind values or passwords.

Every query the farm retries goes through ``retried`` (``Pool.query``, ``execute``,
``executemany`` and ``run`` on one pool; the router's per-shard work on a host looked
up again each attempt): one place where a statement or a transaction meets the
``shardfarm.retry`` policy.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, suppress
from typing import TypeVar

import pymysql
import pymysql.cursors
from pymysql.constants import SERVER_STATUS

from shardfarm.bounds import BULK, Bound
from shardfarm.mysql.connect import (  # noqa: F401 - translate and the codes are used from here
    TRANSIENT_CODES,
    UNREACHABLE_CODES,
    Where,
    open_connection,
    refused_infile,
    translate,
)
from shardfarm.mysql.dsn import Host
from shardfarm.retry import TRANSIENT, RetryPolicy

T = TypeVar("T")
log = logging.getLogger(__name__)

IDLE_TIMEOUT = 30  # seconds; a session's idle limit on the server (see the module docstring)
REPEATABLE_READ = "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ"  # MySQL and MariaDB
CONNECTION_LOST = frozenset({2006, 2013, 1927, 1053, 4031, 2014, 2055})


class Pool:
    """A bounded LIFO pool of connections to one server; safe across threads, reset after fork."""

    def __init__(self, host: Host, size: int = 16, connect_timeout: float | None = None,
                 database: str | None = None, *, infile: bool = False,
                 multi: bool = False, bound: Bound = BULK) -> None:
        self.host = host
        self.database = database
        self.size = size
        self.connect_timeout = connect_timeout  # None: FARM_CONNECT_TIMEOUT
        self.infile, self.multi = infile, multi
        self.bound = bound  # how long a statement may wait for the server (none: BULK)
        self.policy = bound.policy()  # the retry policy of calls that name none
        self.where = Where(host.name, host.host, host.port, host.user, database)
        self._idle: list[tuple[pymysql.Connection, float]] = []  # (connection, idle since)
        self._lock = threading.Lock()
        self._sem = threading.BoundedSemaphore(size)
        self._pid = os.getpid()

    def _connect(self) -> pymysql.Connection:
        conn = open_connection(self.where, self.host.password, tls=self.host.tls_args(),
                               infile=self.infile, multi=self.multi,
                               timeout=self.connect_timeout, autocommit=True,
                               read_timeout=self.bound.socket_timeout,
                               write_timeout=self.bound.socket_timeout,
                               session=f", wait_timeout = {IDLE_TIMEOUT}{self.bound.session()}")
        try:
            with conn.cursor() as cur:  # whatever the server's default (module docstring)
                cur.execute(REPEATABLE_READ)
        except pymysql.MySQLError as exc:
            _close_quietly(conn)
            raise translate(exc, self.where) from None
        except BaseException:
            _close_quietly(conn)
            raise
        return conn

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
                if self.bound.timed_out(exc):
                    raise self.bound.error(self.where, shard) from None
                raise translate(exc, self.where, shard) from None
            except RuntimeError as exc:
                _close_quietly(conn)
                if refused_infile(exc):  # PyMySQL refused a server's LOAD DATA LOCAL request
                    raise translate(exc, self.where, shard) from None
                raise
            except BaseException:
                _close_quietly(conn)  # unknown state (e.g. half-read result): do not reuse
                raise
            if not conn.open:  # its user closed it (e.g. found it dead): never reused
                return
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

    def run(self, work: Callable[[pymysql.cursors.Cursor], T], *, transaction: bool = False,
            policy: RetryPolicy | None = None) -> T:
        """``work(cursor)`` on a pooled connection, retried as a whole (see ``retried``) under
        ``policy``, else the pool's own (its bound's)."""
        return retried(self.connection, work, transaction=transaction,
                       policy=policy or self.policy)

    def query(self, sql: str, params: tuple | list = ()) -> list[tuple]:
        """The rows of one read, retried on transient errors."""
        def work(cur: pymysql.cursors.Cursor) -> list[tuple]:
            cur.execute(sql, params)
            return list(cur.fetchall())
        return self.run(work)

    def execute(self, sql: str, params: tuple | list = ()) -> int:
        """One autocommit statement, retried on transient errors; returns the rows it changed
        (MySQL's affected rows: a row matched and left as it was is not counted). The caller
        makes it idempotent (it may have committed before a lost reply)."""
        return self.run(lambda cur: cur.execute(sql, params))

    def executemany(self, sql: str, rows: list[tuple] | list[list]) -> None:
        """An idempotent ``executemany`` in autocommit, retried on transient errors."""
        if rows:
            self.run(lambda cur: cur.executemany(sql, rows))

    def close(self) -> None:
        """Close every idle connection."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn, _ in idle:
            _close_quietly(conn)


def retried(open_conn: Callable[[], AbstractContextManager[pymysql.Connection]],
            work: Callable[[pymysql.cursors.Cursor], T], *, transaction: bool = False,
            policy: RetryPolicy | None = None, cursor: type = pymysql.cursors.Cursor) -> T:
    """Run ``work(cursor)`` on a connection from ``open_conn()``, retried as a whole.

    The one retried-query helper of the farm: each attempt takes a fresh connection
    (a broken one is never reused), transient errors are retried under ``policy``
    (``TRANSIENT`` by default, ``NO_RETRY`` for a statement that must not run twice).
    With ``transaction`` the work runs in one explicit transaction, committed on
    success and rolled back on any error; otherwise each statement autocommits.
    """
    def attempt() -> T:
        with open_conn() as conn:
            if not transaction:
                with conn.cursor(cursor) as cur:
                    return work(cur)
            conn.begin()
            try:
                with conn.cursor(cursor) as cur:
                    out = work(cur)
                conn.commit()
                return out
            except BaseException:
                with suppress(pymysql.MySQLError):
                    conn.rollback()
                raise
    return (policy or TRANSIENT).call(attempt)


def _lost(exc: BaseException) -> bool:
    return bool(exc.args) and exc.args[0] in CONNECTION_LOST


def _close_quietly(conn: pymysql.Connection | None) -> None:
    if conn is None:
        return
    with suppress(Exception):
        conn.close()
