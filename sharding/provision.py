"""Create every shard and mod bucket database of the map, idempotently, in parallel across hosts."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass

import pymysql.cursors

from shardfarm.mysql.dsn import Host
from shardfarm.mysql.pool import retried
from sharding.router import Router
from sharding.schema import mod_ddl, shard_ddl
from sharding.slots import raise_counters


@dataclass(frozen=True)
class ProvisionReport:
    """What ``init_databases`` did."""

    shards: int
    buckets: int
    servers: int
    seconds: float


Work = tuple[Host, list[str], int | None]  # host, DDL, the shard (None: a mod bucket)


def _plan(router: Router) -> list[Work]:
    m = router.shardmap
    work: list[Work] = [(m.master(s), shard_ddl(s), s) for s in m.shards()]
    work += [(m.mod_master(b), mod_ddl(b), None) for b in range(m.buckets)]
    return work


def _interleave(work: list[Work]) -> list[Work]:
    """Round-robin across servers so every server is busy from the start."""
    by_server: dict[tuple, list] = {}
    for item in work:
        by_server.setdefault(item[0].server, []).append(item)
    queues = list(by_server.values())
    out = []
    while any(queues):
        for q in queues:
            if q:
                out.append(q.pop(0))
    return out


def _run_ddl(router: Router, host: Host, statements: list[str], shard: int | None) -> None:
    """Create one database's tables; on a shard, lift object tables' AUTO_INCREMENT that
    is still below 2**35 (tables made before the local ID space was split)."""
    def work(cur: pymysql.cursors.Cursor) -> None:
        for sql in statements:
            cur.execute(sql)
        if shard is not None:
            raise_counters(cur, shard)
    retried(lambda: router.connection(host), work, policy=router.policy)


def create_shard(router: Router, host: Host, shard: int) -> None:
    """Create one shard database and its tables on ``host`` (safe to run again)."""
    _run_ddl(router, host, shard_ddl(shard), shard)


def init_databases(router: Router, threads_per_server: int = 4,
                   progress: Callable[[int], None] | None = None) -> ProvisionReport:
    """Create every database and table of the map on its master; safe to run again.

    Every master is asked once first (``Router.check_servers``), and the first database
    that fails stops the rest: a server that does not answer costs one retry budget, not
    one per database on it.
    """
    start = time.monotonic()
    router.check_servers()
    work = _interleave(_plan(router))
    servers = {item[0].server for item in work}
    with ThreadPoolExecutor(max_workers=max(1, threads_per_server * len(servers))) as pool:
        futures = [pool.submit(_run_ddl, router, *item) for item in work]
        try:
            for f in as_completed(futures):
                f.result()
                if progress:
                    progress(1)
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)  # only those in flight finish
            raise
    m = router.shardmap
    return ProvisionReport(m.shard_count(), m.buckets, len(servers), time.monotonic() - start)


def tables_per_server(router: Router) -> dict[tuple, tuple[Host, int]]:
    """How many tables the map puts on each master server."""
    from sharding.schema import MOD_FARM_TABLES, MOD_TABLES, SHARD_TABLES
    m = router.shardmap
    out: dict[tuple, tuple[Host, int]] = {}
    for host, n in [(m.master(s), len(SHARD_TABLES)) for s in m.shards()] + [
            (m.mod_master(b), len(MOD_TABLES) + len(MOD_FARM_TABLES))
            for b in range(m.buckets)]:
        prev = out.get(host.server, (host, 0))
        out[host.server] = (prev[0], prev[1] + n)
    return out


# A shard host's redo log: a migration or reverse rebuild writes a few GB of redo; with
# MariaDB's default (96 MiB) InnoDB checkpoints every few seconds and writes the same pages
# again and again (measured: the migration's target-server CPU 24 s with 96 MiB against
# 18 s with 1 GiB, for the same rows). MariaDB 10.11 resizes it online (SET GLOBAL).
REDO_MIN = 1 << 30
_REDO_VARIABLES = ("innodb_log_file_size", "innodb_redo_log_capacity")  # MariaDB; MySQL 8.0.30+


def server_advice(router: Router, tune: bool = False, redo: bool = True) -> list[str]:
    """One line per server whose table caches are smaller than the tables it holds, and
    (with ``redo``) per server whose redo log is under ``REDO_MIN``.

    With ``tune`` both are raised (``SET GLOBAL``, until the server restarts).
    """
    advice = []
    for host, n in tables_per_server(router).values():
        with router.connection(host) as conn, conn.cursor() as cur:
            where = f"server {host.host}:{host.port}"
            advice += _cache_advice(cur, where, n, tune)
            if redo:
                advice += _redo_advice(cur, where, tune)
    return advice


def _cache_advice(cur: pymysql.cursors.Cursor, where: str, n: int, tune: bool) -> list[str]:
    """The table-cache line of one server (``cur``) holding ``n`` tables, if any."""
    cur.execute("SELECT @@table_open_cache, @@table_definition_cache")
    open_cache, def_cache = cur.fetchone()
    if min(open_cache, def_cache) >= n:
        return []
    if tune:
        want = n + 1000
        cur.execute(f"SET GLOBAL table_open_cache = {max(open_cache, want)}")
        cur.execute(f"SET GLOBAL table_definition_cache = {max(def_cache, want)}")
        return [f"raised table_open_cache and table_definition_cache of {where} to {want} "
                f"for its {n} tables (until it restarts)"]
    return [f"{where} holds {n} tables but table_open_cache={open_cache}, "
            f"table_definition_cache={def_cache}: raise both to at least {n} for fast loads "
            "('farm shards init --tune', or README 'Sizing the MySQL servers')"]


def _redo_advice(cur: pymysql.cursors.Cursor, where: str, tune: bool) -> list[str]:
    """The redo-log line of one server (``cur``), if its redo log is under ``REDO_MIN``."""
    marks = ",".join(["%s"] * len(_REDO_VARIABLES))
    cur.execute(f"SHOW GLOBAL VARIABLES WHERE Variable_name IN ({marks})", _REDO_VARIABLES)
    found = dict(cur.fetchall())
    name = next((v for v in reversed(_REDO_VARIABLES) if v in found), None)
    if name is None or int(found[name]) >= REDO_MIN:
        return []
    size = f"{name}={int(found[name]) >> 20}M"
    if tune:
        try:
            cur.execute(f"SET GLOBAL {name} = {REDO_MIN}")
            return [f"raised {name} of {where} from {size[len(name) + 1:]} to "
                    f"{REDO_MIN >> 20}M (until it restarts)"]
        except pymysql.err.MySQLError as e:
            return [f"{where} has {size} and refused to resize it online ({e.args[-1]}): "
                    f"set {name} = {REDO_MIN >> 20}M in its configuration and restart it"]
    return [f"{where} has {size}: bulk loads rewrite the same pages at every checkpoint; "
            f"raise it to at least {REDO_MIN >> 20}M ('farm shards init --tune', or README "
            "'Sizing the MySQL servers')"]
