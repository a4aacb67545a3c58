"""Slow a run down while a target server is busy (``Threads_running`` above a limit)."""

from __future__ import annotations

import os
import time

from farmcore import keys
from jobs.runtime import Runtime
from shardfarm.mysql.dsn import Host

PAUSE_SECONDS = 5.0
CACHE_SECONDS = 2.0
_cache: dict[tuple, tuple[float, int]] = {}


def limit_of(run: dict) -> int:
    """The run's ``max_threads_running`` (or ``FARM_MAX_THREADS_RUNNING``); 0 means no throttle."""
    return int(run["params"].get("max_threads_running")
               or os.environ.get("FARM_MAX_THREADS_RUNNING") or 0)


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


def reason(rt: Runtime, run: dict) -> str | None:
    """Why the run should wait now (recorded in Redis for ``farm status``), or ``None``."""
    limit = limit_of(run)
    if not limit:
        return None
    for host in rt.router.servers().values():
        n = threads_running(rt, host)
        if n > limit:
            why = f"{host.name} Threads_running {n} > {limit}"
            rt.redis.set(keys.throttle(run["run_id"]), why, ex=int(PAUSE_SECONDS * 3))
            return why
    return None
