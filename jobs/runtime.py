"""Per-process resources shared by every job a worker runs: built once, reused across jobs."""

from __future__ import annotations

import os
import threading
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import cached_property

import redis

from farmcore.ledger import Ledger
from jobs.policy import JobPolicy
from shardfarm.bounds import BULK, Bound
from shardfarm.errors import FarmError
from shardfarm.settings import Settings
from sharding.mapsource import bucket_change, open_source
from sharding.router import Router
from sharding.shardmap import ShardMap


@dataclass
class Runtime:
    """Settings plus lazily built router, ledger and Redis connection. ``bound``: how long a
    control-database statement may wait (``shardfarm.bounds``: status views are bounded,
    workers and commands that start runs are not); ``redis_seconds``: how long a Redis
    reply may take, if not the bound's (a supervisor's: it never waits on a queue)."""

    settings: Settings
    bound: Bound = field(default=BULK)
    redis_seconds: float | None = None

    @cached_property
    def router(self) -> Router:
        """Pooled shard connections (one pool per physical server)."""
        return Router(open_source(self.settings.shardmap_spec, guard=self.reload_guard,
                                  timeout=self.settings.connect_timeout))

    def reload_guard(self, old: ShardMap, new: ShardMap) -> str | None:
        """Why a new shard map must not replace ``old`` now: it re-buckets or moves mod
        buckets while a run is active (``None``: reload)."""
        change = bucket_change(old, new)
        if change is None:
            return None
        try:
            active = self.ledger.runs(limit=1, active_only=True)
        except FarmError as exc:
            return f"{change}, and whether a run is active is unknown ({exc})"
        if not active:
            return None
        return (f"{change} while run {active[0]} is active; the map is reloaded once no "
                "run is active ('farm status')")

    @cached_property
    def ledger(self) -> Ledger:
        """The chunk ledger in the control database."""
        return Ledger(self.settings.control_dsn, bound=self.bound)

    @cached_property
    def policy(self) -> JobPolicy:
        """Which code this process's jobs may run (``FARM_JOB_MODULES``)."""
        return JobPolicy.from_env()

    @cached_property
    def redis(self) -> redis.Redis:
        """The farm's Redis; a status view's waits for each reply as long as its bound."""
        return self.settings.redis(socket_timeout=self.redis_seconds
                                   if self.redis_seconds is not None
                                   else self.bound.socket_timeout)

    def close(self) -> None:
        """Release pooled connections that were opened, and the shard map source (a
        ZooKeeper client and its threads): each one even if another fails to close."""
        built = self.__dict__
        closers = [built[name].close for name in ("router", "ledger") if name in built]
        if "router" in built:
            closers.append(built["router"].source.close)
        with ExitStack() as stack:  # runs every callback, then raises what failed
            for close in reversed(closers):  # last in, first out: in the order above
                stack.callback(close)


_lock = threading.Lock()
_current: tuple[int, Runtime] | None = None


def get() -> Runtime:
    """This process's runtime, built from the environment on first use (and after a fork)."""
    global _current
    with _lock:
        if _current is None or _current[0] != os.getpid():
            _current = (os.getpid(), Runtime(Settings.from_env()))
        return _current[1]


def install(rt: Runtime) -> None:
    """Use ``rt`` as this process's runtime (workers and tests)."""
    global _current
    with _lock:
        _current = (os.getpid(), rt)
