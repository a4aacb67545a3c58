"""The shard map in ZooKeeper: ``FARM_SHARDMAP=zk://host:port[,host:port]/path``.

The node holds the map's JSON. ``ZkSource`` reads it once and then watches it: a
new version is validated and offered to the process's guard (``GuardedMap``), and
chunks pick it up when they start (each chunk routes with the map it started
with). ``ZkStore`` is what ``farm shards publish`` and the capacity commands write
through: a compare-and-set on the node's version, so two publishers cannot both win.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError,
    KazooException,
    NoAuthError,
    NodeExistsError,
    NoNodeError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.hosts import collect_hosts

from shardfarm.errors import ConfigError, ShardMapError, StaleStateError
from shardfarm.redact import redact_url
from sharding.mapsource import Guard, GuardedMap
from sharding.shardmap import ShardMap

log = logging.getLogger(__name__)
_URL = re.compile(r"^zk://([A-Za-z0-9_.:,\[\]-]+)(/[A-Za-z0-9_./-]*[A-Za-z0-9_-])$")


def parse_url(url: str) -> tuple[str, str]:
    """``zk://hosts/path`` -> ``(hosts, path)``; a malformed URL is a ``ConfigError``."""
    m = _URL.match(url)
    why = "" if m and "//" not in m.group(2) else "expected zk://host:port/path"
    if not why:
        try:
            collect_hosts(m.group(1))  # kazoo's own reading: a port that is not one
        except ValueError as exc:
            why = f"{str(exc).rstrip('.')}: expected zk://host:port[,host:port]/path"
    if why:
        raise ConfigError(f"bad FARM_SHARDMAP {redact_url(url)[:80]!r} ({why})")
    return m.group(1), m.group(2)


def connect(url: str, timeout: float) -> tuple[KazooClient, str]:
    """A started client of the ZooKeeper ensemble of ``url``, and the node's path."""
    hosts, node = parse_url(url)
    client = KazooClient(hosts=hosts, timeout=timeout)
    kazoo_log = logging.getLogger("kazoo.client")
    kazoo_log.addFilter(_quiet)  # its retries are ours to report, in one line
    try:
        client.start(timeout=timeout)
    except (KazooTimeoutError, KazooException, OSError):
        client.stop()
        client.close()
        raise ConfigError(f"ZooKeeper {hosts} does not answer within {timeout:g} s "
                          f"(FARM_SHARDMAP {url})") from None
    finally:
        kazoo_log.removeFilter(_quiet)
    return client, node


def _quiet(record: logging.LogRecord) -> bool:
    """A logging filter that drops kazoo's WARNING per failed attempt to connect (a dozen
    lines before the one error line, while ``connect`` waits)."""
    return record.levelno > logging.WARNING


@contextmanager
def answered(url: str, what: str) -> Iterator[None]:
    """A ZooKeeper call on the node of ``url`` whose refusal (the node's ACL) or failure
    (the ensemble lost meanwhile) is one ``ConfigError`` line, never a traceback.
    ``NoNodeError`` and the compare-and-set's errors pass: callers answer them."""
    try:
        yield
    except (NoNodeError, BadVersionError, NodeExistsError):
        raise
    except NoAuthError:
        raise ConfigError(f"ZooKeeper refuses to let this process {what} {redact_url(url)}: "
                          "the node's ACL does not allow it") from None
    except (KazooException, KazooTimeoutError) as exc:
        raise ConfigError(f"ZooKeeper could not {what} {redact_url(url)}: "
                          f"{type(exc).__name__} (is it up?)") from None


class ZkSource:
    """The map of a ZooKeeper node, switched to each new valid version as it is published.

    kazoo runs the node's watch on its own threads, and at exit (an ``atexit`` hook) and in
    ``close()`` it waits for them to finish: so the watch only keeps the newest node data,
    and the map is parsed and offered to the guard (which may ask the control database)
    by whoever calls ``current()``. A guard that hangs then never holds up a process's exit
    or ``close()``. Every error of the constructor closes the client before it is raised.
    """

    path = None

    def __init__(self, url: str, guard: Guard | None = None, timeout: float = 10.0) -> None:
        self.spec = url
        self.client, self.node = connect(url, timeout)
        self._lock = threading.Lock()  # applying a version (parse, guard): callers of current()
        self._slot = threading.Lock()  # the newest data the watch saw: held for a swap only
        self._pending: tuple[bytes, int] | None = None
        try:
            self._held = self._first(guard)
            self.client.DataWatch(self.node, self._changed)
        except BaseException:
            self.close()
            raise

    def _first(self, guard: Guard | None) -> GuardedMap:
        """The node's map now, as the map in force (one line if there is none or it is bad)."""
        try:
            with answered(self.spec, "read"):
                data, stat = self.client.get(self.node)
        except NoNodeError:
            raise ShardMapError(f"no shard map at {self.spec}: publish one with "
                                "'farm shards publish FILE'") from None
        self._seen = stat.mzxid  # not the version: a node deleted and made again restarts at 0
        return GuardedMap(ShardMap.from_json(data.decode("utf-8", "replace"), self.spec),
                          guard, self.spec)

    def _changed(self, data: bytes | None, stat: object) -> None:
        """The watch (on kazoo's thread): keep the newest data for ``current()``, nothing
        slow here."""
        if data is None:
            log.error("shard map node %s is gone; keeping the map in force", self.spec)
            return
        with self._slot:  # zxids only grow: a late, older reading never replaces a newer
            if self._pending is None or self._pending[1] < stat.mzxid:
                self._pending = (data, stat.mzxid)

    def _apply(self) -> None:
        """Offer the newest data the watch saw (if it is a new change) to the guard."""
        with self._lock:
            with self._slot:
                pending, self._pending = self._pending, None
            if pending is None or pending[1] <= self._seen:  # the zxid of its last change
                return
            data, self._seen = pending
            try:
                new = ShardMap.from_json(data.decode("utf-8", "replace"), self.spec)
            except ShardMapError as exc:
                log.error("keeping the previous shard map: %s", exc)
                return
            self._held.offer(new, self._seen)

    def current(self) -> ShardMap:
        """The newest map this process accepted (a version the watch saw is offered now)."""
        self._apply()
        self._held.retry_due()
        return self._held.current

    def refresh(self) -> None:
        """Read the node now (the watch may not have fired yet)."""
        try:
            data, stat = self.client.get(self.node)
        except (KazooException, KazooTimeoutError):
            return
        self._changed(data, stat)
        self._apply()

    def close(self) -> None:
        """Stop watching and disconnect."""
        self.client.stop()
        self.client.close()


class ZkStore:
    """Read and compare-and-set the map node (for publishing)."""

    def __init__(self, url: str, timeout: float = 10.0) -> None:
        self.url = url
        self.client, self.node = connect(url, timeout)

    def load(self) -> tuple[str | None, int]:
        """The node's text (``None`` if there is none yet) and its version stamp."""
        try:
            with answered(self.url, "read"):
                data, stat = self.client.get(self.node)
        except NoNodeError:
            return None, -1
        return data.decode("utf-8", "replace"), stat.version

    def write(self, text: str, stamp: int) -> None:
        """Replace the node if it is still at ``stamp``; ``StaleStateError`` if not."""
        try:
            with answered(self.url, "write"):
                if stamp < 0:
                    self.client.create(self.node, text.encode("utf-8"), makepath=True)
                else:
                    self.client.set(self.node, text.encode("utf-8"), version=stamp)
        except (BadVersionError, NodeExistsError):
            raise StaleStateError(f"another shard map was published at {self.url} meanwhile;"
                                  " nothing written (look again and retry)") from None

    def close(self) -> None:
        """Disconnect."""
        self.client.stop()
        self.client.close()
