"""Slow a run down while a target server is busy (``Threads_running`` above a limit) or a
slave lags (``Seconds_Behind_Master`` above the run's ``max_lag``, like gh-ost's
``--max-lag-millis``; only the slaves of what the run writes when it names them,
``lag_hosts``): its chunks wait and ``farm status`` says THROTTLED, host and lag."""

from __future__ import annotations

import logging
import math
import time

import pymysql.cursors

from farmcore import keys
from jobs.runtime import Runtime
from shardfarm import tuning
from shardfarm.errors import FarmError
from shardfarm.mysql.dsn import Host

log = logging.getLogger(__name__)

PAUSE_SECONDS = 5.0
CACHE_SECONDS = 2.0
_cache: dict[tuple, tuple[float, float | None]] = {}


def limit_of(run: dict) -> int:
    """The run's ``max_threads_running`` (or ``FARM_MAX_THREADS_RUNNING``); 0 means no throttle."""
    return int(run["params"].get("max_threads_running") or tuning.max_threads_running())


def threads_running(rt: Runtime, host: Host) -> int:
    """``Threads_running`` of ``host``'s server, cached for a couple of seconds per process."""
    hit = _cache.get(host.server)
    if hit and time.monotonic() - hit[0] < CACHE_SECONDS:
        return hit[1]
    with rt.router.connection(host) as conn, conn.cursor() as cur:
        cur.execute("SHOW GLOBAL STATUS LIKE 'Threads_running'")
        value = int(cur.fetchone()[1])
    _cache[host.server] = (time.monotonic(), value)
    return value


def slave_lag(rt: Runtime, host: Host) -> float | None:
    """``Seconds_Behind_Master`` of ``host`` (``None``: not replicating, or not known), cached
    for a couple of seconds per process. A stopped SQL thread counts as lagging forever."""
    key = ("lag", *host.server)
    hit = _cache.get(key)
    if hit and time.monotonic() - hit[0] < CACHE_SECONDS:
        return hit[1]
    try:
        with rt.router.connection(host) as conn, conn.cursor(pymysql.cursors.DictCursor) as cur:
            cur.execute("SHOW SLAVE STATUS")
            row = cur.fetchone()
    except (FarmError, pymysql.MySQLError) as exc:  # e.g. no REPLICATION CLIENT privilege
        log.warning("lag of %s unknown: %s", host.name, str(exc).splitlines()[0][:200])
        row = None
    lag = None
    if row:
        lag = (math.inf if row.get("Slave_SQL_Running") != "Yes"
               else None if row.get("Seconds_Behind_Master") is None
               else float(row["Seconds_Behind_Master"]))
    _cache[key] = (time.monotonic(), lag)
    return lag


def watched_slaves(rt: Runtime, run: dict) -> list[Host]:
    """The slaves whose lag holds ``run`` back: those its params name (``lag_hosts``: the
    slaves of the servers it writes, e.g. a move's new pair), else every slave of the map."""
    names = run["params"].get("lag_hosts")
    if not names:
        return list(rt.router.servers("slave").values())
    hosts = rt.router.shardmap.hosts
    return [hosts[n] for n in names if n in hosts]


def _lagging(rt: Runtime, run: dict) -> str | None:
    max_lag = float(run["params"].get("max_lag") or 0)
    if not max_lag:
        return None
    for host in watched_slaves(rt, run):
        lag = slave_lag(rt, host)
        if lag is not None and lag > max_lag:
            return f"{host.name} lag {lag:g} s > {max_lag:g} s"
    return None


def _busy(rt: Runtime, run: dict) -> str | None:
    limit = limit_of(run)
    if not limit:
        return None
    for host in rt.router.servers().values():
        n = threads_running(rt, host)
        if n > limit:
            return f"{host.name} Threads_running {n} > {limit}"
    return None


def reason(rt: Runtime, run: dict) -> str | None:
    """Why the run should wait now (recorded in Redis for ``farm status``), or ``None``."""
    why = _busy(rt, run) or _lagging(rt, run)
    if why:
        rt.redis.set(keys.throttle(run["run_id"]), why, ex=int(PAUSE_SECONDS * 3))
    return why
