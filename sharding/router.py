"""Routing: a shard or mod bucket -> its host in the current map -> a pooled connection.

``Router.run(shard, fn)`` is the unit of work: ``fn(cursor)`` runs inside one
explicit transaction on the shard's master and the whole transaction is retried
on transient errors (gone away, deadlock, lock wait, refused connection; an
unreachable server only within FARM_CONNECT_TIMEOUT).

Connections are plain by default. A caller that needs a capability asks for it
and gets a connection from a separate pool: ``infile=True`` for ``LOAD DATA LOCAL
INFILE`` (the shard writer), ``multi=True`` for multi-statements (the mod writer, and
the shard writer's pipelined groups).
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager, suppress
from typing import Literal, TypeVar

import pymysql
import pymysql.cursors

from shardfarm.errors import StaleMapError
from shardfarm.mysql.dsn import Host
from shardfarm.mysql.pipeline import Pipeline
from shardfarm.mysql.pool import Pool, retried
from shardfarm.retry import TRANSIENT, RetryPolicy
from sharding import fencing
from sharding.mapsource import FixedSource, MapSource
from sharding.shardmap import ShardMap

T = TypeVar("T")
Role = Literal["master", "slave"]


class Router:
    """Finds the host of a shard and lends pooled connections, one pool per physical server."""

    def __init__(self, source: MapSource, *, pool_size: int = 16,
                 policy: RetryPolicy = TRANSIENT) -> None:
        self.source = source
        self.pool_size = pool_size
        self.policy = policy
        self._pools: dict[tuple, Pool] = {}
        self._lock = threading.Lock()

    @property
    def shardmap(self) -> ShardMap:
        """The current shard map (re-read when its file changes)."""
        return self.source.current()

    def pinned(self) -> Router:
        """A view of this router that routes with today's map until dropped (a chunk's
        router: one map version from start to end). It shares this router's pools."""
        view = copy.copy(self)
        view.source = FixedSource(self.shardmap)
        return view

    def host_for(self, shard: int, role: Role = "master") -> Host:
        """The host holding ``shard`` in the current map."""
        m = self.shardmap
        return m.master(shard) if role == "master" else m.slave(shard)

    def pool(self, host: Host, *, infile: bool = False, multi: bool = False) -> Pool:
        """The pool of the physical server behind ``host`` with these capabilities (created
        on first use): ``infile`` allows LOAD DATA LOCAL INFILE, ``multi`` multi-statements."""
        key = (*host.server, host.password, host.tls, infile, multi)
        with self._lock:
            pool = self._pools.get(key)
            if pool is None:
                pool = self._pools[key] = Pool(host, size=self.pool_size, infile=infile,
                                               multi=multi)
            return pool

    @contextmanager
    def connection(self, host: Host, shard: int | None = None, *, infile: bool = False,
                   multi: bool = False) -> Iterator[pymysql.Connection]:
        """A pooled autocommit connection to ``host`` (plain unless a capability is asked)."""
        with self.pool(host, infile=infile, multi=multi).connection(shard) as conn:
            yield conn

    @contextmanager
    def transaction(self, host: Host, shard: int | None = None,
                    cursor: type = pymysql.cursors.Cursor, *, infile: bool = False,
                    multi: bool = False) -> Iterator[pymysql.cursors.Cursor]:
        """One explicit transaction: committed on success, rolled back on any error."""
        with self.connection(host, shard, infile=infile, multi=multi) as conn:
            conn.begin()
            try:
                with conn.cursor(cursor) as cur:
                    yield cur
                conn.commit()
            except BaseException:
                with suppress(pymysql.MySQLError):
                    conn.rollback()
                raise

    def run_on(self, host: Host, fn: Callable[[pymysql.cursors.Cursor], T],
               shard: int | None = None, policy: RetryPolicy | None = None) -> T:
        """Run ``fn(cursor)`` in one transaction on ``host``, retried as a whole."""
        return retried(lambda: self.connection(host, shard), fn, transaction=True,
                       policy=policy or self.policy)

    def run(self, shard: int, fn: Callable[[pymysql.cursors.Cursor], T],
            role: Role = "master", policy: RetryPolicy | None = None, *,
            infile: bool = False) -> T:
        """Run ``fn(cursor)`` in one transaction on the shard's host, retried as a whole.

        The host is looked up again on every attempt, so a retried call follows a
        shard map that changed in between (a promoted slave, a moved shard). On the
        master the transaction first checks the shard's state (``fencing.check_map``):
        frozen for a move, or moved by a newer map than this attempt routed with.
        ``infile=True`` for a ``fn`` that runs ``LOAD DATA LOCAL INFILE``.
        """
        routed: list[int] = [0]  # the version of the map this attempt was routed with

        def connect() -> AbstractContextManager[pymysql.Connection]:
            m = self.shardmap
            routed[0] = m.version
            host = m.master(shard) if role == "master" else m.slave(shard)
            return self.connection(host, shard, infile=infile)

        def guarded(cur: pymysql.cursors.Cursor) -> T:
            if role == "master":
                self._check_map(cur, shard, routed[0])
            return fn(cur)
        return retried(connect, guarded, transaction=True, policy=policy or self.policy)

    def _check_map(self, cur: pymysql.cursors.Cursor, shard: int, routed: int) -> None:
        """``fencing.check_map`` on the shard's master; a map newer than the ``routed``
        version is fetched at once, so the retry routes with it."""
        try:
            fencing.check_map(cur, shard, routed)
        except StaleMapError:
            self.source.refresh()
            raise

    def server_groups(self, shards: list[int], parts: int = 1,
                      most: int = 128) -> list[list[int]]:
        """``shards`` in ascending groups of at most ``most`` whose masters are one physical
        server now, each server's shards cut into at least ``parts`` groups (so that as many
        threads have work)."""
        return _server_groups(shards, self.shardmap.master, parts, most)

    def mod_groups(self, buckets: Iterable[int], most: int = 128) -> list[list[int]]:
        """Mod ``buckets`` in ascending groups of at most ``most`` whose masters are one
        physical server now (for ``run_mod`` of the group's first bucket)."""
        return _server_groups(buckets, self.shardmap.mod_master, 1, most)

    def run_group(self, shards: list[int], fn: Callable[..., None],
                  policy: RetryPolicy | None = None, *,
                  infile: bool = False, pipelined: bool = False) -> None:
        """``fn(cursor, shard)`` for each of ``shards`` (one server's, ``server_groups``) in
        ascending order, all in one transaction on their master, retried as a whole; each
        shard is checked first as ``run`` checks it. One commit for many shards. If the map
        changed so that they no longer share a server, each shard gets its own transaction.

        ``pipelined=True``: ``fn(pipeline, shard)`` queues each shard's statements in one
        ``Pipeline`` after the shard's check (a connection allowed multi-statements), so
        the whole group takes a few round trips, not a few per shard.
        """
        routed: list[int] = [0]

        def connect() -> AbstractContextManager[pymysql.Connection]:
            m = self.shardmap
            routed[0] = m.version
            if len({m.master(s).server for s in shards}) > 1:
                raise _Regroup
            return self.connection(m.master(shards[0]), infile=infile, multi=pipelined)

        def guarded(cur: pymysql.cursors.Cursor) -> None:
            for shard in shards:
                self._check_map(cur, shard, routed[0])
                fn(cur, shard)

        def queued(cur: pymysql.cursors.Cursor) -> None:
            pipe = Pipeline(cur)
            for shard in shards:
                fencing.queue_check_map(pipe, shard, routed[0])
                fn(pipe, shard)
            try:
                pipe.flush()
            except StaleMapError:
                self.source.refresh()
                raise
        try:
            retried(connect, queued if pipelined else guarded, transaction=True,
                    policy=policy or self.policy)
        except _Regroup:
            for shard in shards:
                if pipelined:
                    self.run_group([shard], fn, policy, pipelined=True)
                else:
                    self.run(shard, lambda cur, s=shard: fn(cur, s), policy=policy,
                             infile=infile)

    def run_mod(self, bucket: int, fn: Callable[[pymysql.cursors.Cursor], T],
                policy: RetryPolicy | None = None, *, multi: bool = False) -> T:
        """Run ``fn(cursor)`` in one transaction on a mod bucket's master; ``multi=True``
        for a ``fn`` that sends several statements in one ``execute``."""
        return retried(lambda: self.connection(self.shardmap.mod_master(bucket), multi=multi),
                       fn, transaction=True, policy=policy or self.policy)

    def query(self, host: Host, sql: str, params: tuple | list = (), shard: int | None = None,
              policy: RetryPolicy | None = None) -> list[tuple]:
        """A read in autocommit (no explicit transaction), retried on transient errors."""
        def read(cur: pymysql.cursors.Cursor) -> list[tuple]:
            cur.execute(sql, params)
            return list(cur.fetchall())
        return retried(lambda: self.connection(host, shard), read, policy=policy or self.policy)

    def servers(self, role: Role = "master") -> dict[tuple, Host]:
        """One host per distinct physical server used by the map in ``role``."""
        m = self.shardmap
        out: dict[tuple, Host] = {}
        for r in [*m.shard_ranges, *m.mod_ranges]:
            h = m.hosts[r.master if role == "master" else r.slave]
            out.setdefault(h.server, h)
        return out

    def check_servers(self, role: Role = "master") -> None:
        """Every distinct server the map uses in ``role`` answers: each asked once (``SELECT
        1``, retried under the router's policy), all at once. A fleet-wide command calls
        this before it loops over shards or buckets, so a server that does not answer costs
        one retry budget (FARM_CONNECT_TIMEOUT) however many databases and host names it
        has, not one per database. Raises the first server's error (an ``UnreachableError``
        names its host in the map and ``user@host:port``)."""
        hosts = list(self.servers(role).values())
        with ThreadPoolExecutor(max_workers=max(1, len(hosts))) as pool:
            futures = [pool.submit(self.query, h, "SELECT 1") for h in hosts]
        for f in futures:
            f.result()

    def close(self) -> None:
        """Close every pooled connection."""
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for p in pools:
            p.close()


def _server_groups(numbers: Iterable[int], master: Callable[[int], Host], parts: int,
                   most: int) -> list[list[int]]:
    """Shard or bucket ``numbers`` in ascending groups of at most ``most`` on one server
    (``master(n).server``), each server's cut into at least ``parts`` groups."""
    by_server: dict[tuple, list[int]] = {}
    for n in sorted(set(numbers)):
        by_server.setdefault(master(n).server, []).append(n)
    out = []
    for group in by_server.values():
        size = max(1, min(most, -(-len(group) // max(1, parts))))
        out += [group[i:i + size] for i in range(0, len(group), size)]
    return out


class _Regroup(Exception):
    """A group's shards no longer share a server in the current map (not retried)."""
