"""Where the router gets its shard map: a file re-read when it changes, a ZooKeeper node
watched for new versions (``sharding.zkmap``), or a fixed map.

``open_source(spec)`` picks the backend from ``FARM_SHARDMAP``: empty (the built-in
demo map), ``zk://host:port/path`` or a file path.

A reload is refused (the running process keeps its map) when the new file is
invalid, or when a guard says no: workers refuse a map that changes
``mod.buckets`` or moves mod buckets to another server while a run is active,
since a chunk in flight would route part of its rows by the old map and part by
the new. A refused reload is said once and tried again every ``GUARD_RETRY``
seconds, so it takes effect when the runs end.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from shardfarm.errors import ShardMapError
from sharding.shardmap import ShardMap, demo_map_doc

log = logging.getLogger(__name__)
GUARD_RETRY = 10.0
Guard = Callable[[ShardMap, ShardMap], "str | None"]


def bucket_change(old: ShardMap, new: ShardMap) -> str | None:
    """How ``new`` re-buckets, moves or re-cuts the mod buckets of ``old`` (``None`` if it
    does not).

    A bucket range whose master becomes its former slave (a promotion) does not move. A
    range re-cut in place matters too: writes to mod buckets are fenced in the first bucket
    of their range (``sharding.fencing.mod_home``), so a chunk and its successor must see
    the same ranges.
    """
    if old.buckets != new.buckets:
        return f"mod.buckets changes from {old.buckets} to {new.buckets}"
    for lo in sorted({r.lo for r in old.mod_ranges} | {r.lo for r in new.mod_ranges}):
        was, now = old.mod_range(lo), new.mod_range(lo)
        target = new.hosts[now.master]
        if target.server not in (old.hosts[was.master].server, old.hosts[was.slave].server):
            return f"mod bucket {lo} moves from {was.master} to {now.master}"
    cuts = [[(r.lo, r.hi) for r in m.mod_ranges] for m in (old, new)]
    if cuts[0] != cuts[1]:
        return f"mod bucket ranges are re-cut from {_cuts(cuts[0])} to {_cuts(cuts[1])}"
    return None


def _cuts(ranges: list[tuple[int, int]]) -> str:
    return ", ".join(f"{lo}-{hi}" for lo, hi in ranges)


class FixedSource:
    """One map, never reloaded: what a chunk routes with from start to end."""

    path: Path | None = None
    spec = ""

    def __init__(self, shardmap: ShardMap) -> None:
        self._map = shardmap

    def current(self) -> ShardMap:
        """The fixed map."""
        return self._map

    def refresh(self) -> None:
        """Nothing to re-read: a fixed map never changes."""

    def close(self) -> None:
        """Nothing to release."""


class GuardedMap:
    """The map in force and the guard a new version must pass before it replaces it.

    A refused version is said once and offered again every ``GUARD_RETRY`` seconds
    (``retry_due``), so it takes effect when the runs end.
    """

    def __init__(self, shardmap: ShardMap, guard: Guard | None, where: str) -> None:
        self._map = shardmap
        self.guard = guard
        self.where = where
        self._refused: tuple | None = None
        self._refused_at = 0.0

    def offer(self, new: ShardMap, stamp: object) -> bool:
        """Switch to ``new`` unless the guard refuses it; returns whether it switched."""
        why = self.guard(self._map, new) if self.guard else None
        if why:
            if self._refused is None or self._refused[:2] != (stamp, why):
                log.error("not reloading shard map %s: %s", self.where, why)
            self._refused, self._refused_at = (stamp, why, new), time.monotonic()
            return False
        self._map, self._refused = new, None
        log.info("reloaded shard map %s: %r", self.where, new)
        return True

    @property
    def current(self) -> ShardMap:
        """The map in force."""
        return self._map

    def retry_due(self) -> None:
        """Offer a refused version again once ``GUARD_RETRY`` seconds have passed."""
        if self._refused and time.monotonic() - self._refused_at >= GUARD_RETRY:
            self.offer(self._refused[2], self._refused[0])


class ShardMapSource:
    """Caches the map and reloads it when the file changes (checked at most every ``interval``)."""

    def __init__(self, path: Path | None, interval: float = 1.0,
                 guard: Guard | None = None) -> None:
        self.path = path
        self.spec = str(path or "")
        self.interval = interval
        self.guard = guard
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._checked = 0.0
        self._refused: tuple | None = None
        self._map = ShardMap.load(path) if path else ShardMap.from_dict(demo_map_doc())
        if path:
            self._stamp = self._stat()

    def _stat(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path)  # type: ignore[arg-type]
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size)

    def current(self) -> ShardMap:
        """The newest valid map; a changed file is re-read, a bad or refused one is logged."""
        if self.path is None or time.monotonic() - self._checked < self.interval:
            return self._map
        with self._lock:
            self._checked = time.monotonic()
            stamp = self._stat()
            if stamp and stamp != self._stamp:
                self._reload(stamp)
        return self._map

    def _reload(self, stamp: tuple[int, int]) -> None:
        try:
            new = ShardMap.load(self.path)  # type: ignore[arg-type]
        except ShardMapError as exc:
            self._stamp = stamp
            log.error("keeping the previous shard map: %s", exc)
            return
        except Exception as exc:  # noqa: BLE001 - a running process keeps its map
            self._stamp = stamp
            log.error("keeping the previous shard map: %s could not be read (%s)",
                      self.path, type(exc).__name__)
            return
        why = self.guard(self._map, new) if self.guard else None
        if why:
            if self._refused != (stamp, why):
                log.error("not reloading shard map %s: %s", self.path, why)
            self._refused = (stamp, why)
            self._checked += GUARD_RETRY  # look again later: the runs may have ended
            return
        self._stamp, self._map, self._refused = stamp, new, None
        log.info("reloaded shard map %s: %r", self.path, self._map)

    def refresh(self) -> None:
        """Look at the file again on the next ``current()`` (a shard said the map is stale)."""
        self._checked = 0.0

    def close(self) -> None:
        """Nothing to release: the file is read, not held open."""


MapSource = ShardMapSource | FixedSource


def open_source(spec: str | Path | None, guard: Guard | None = None,
                timeout: float = 10.0) -> MapSource:
    """The map source ``FARM_SHARDMAP`` names: ``zk://host:port/path`` (watched in ZooKeeper),
    a file path (re-read when it changes), or empty (the built-in demo map)."""
    text = str(spec or "")
    if text.startswith("zk://"):
        from sharding.zkmap import ZkSource
        return ZkSource(text, guard=guard, timeout=timeout)  # type: ignore[return-value]
    return ShardMapSource(Path(text) if text else None, guard=guard)
