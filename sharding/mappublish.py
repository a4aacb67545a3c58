"""Writing a new version of the shard map where ``FARM_SHARDMAP`` says it lives.

A new map must be valid and its ``version`` exactly one more than the map in force;
the write is a compare-and-set (a ZooKeeper node version, or a locked file replaced
atomically), so of two operators publishing at once one is refused, in one line.
``amend`` is the same for a change computed from the map in force (the capacity
commands: open a range, move one, promote a slave).
"""

from __future__ import annotations

import copy
import fcntl
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from shardfarm.errors import ConfigError, ShardMapError, StaleStateError, UsageError
from sharding.shardmap import ShardMap


def _os_error(what: str, path: Path, exc: OSError) -> ConfigError:
    """A file-system failure on the map as one line (no traceback)."""
    return ConfigError(f"cannot {what} the shard map {path}: "
                       f"{exc.strerror or type(exc).__name__}; nothing written")


class FileStore:
    """A map file: read under an exclusive lock (``locked``), replaced atomically; a file
    system that refuses (permissions, a full or read-only disk) is a ``ConfigError``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @contextmanager
    def locked(self) -> Iterator[FileStore]:
        """Hold ``PATH.lock`` so a read-check-write of two publishers cannot interleave."""
        try:
            lock = open(f"{self.path}.lock", "a")  # noqa: SIM115 - held for the block
        except OSError as exc:
            raise _os_error("lock", self.path, exc) from None
        with lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield self

    def load(self) -> tuple[str | None, int]:
        """The file's text (``None`` if missing) and its stamp (its inode)."""
        try:
            return self.path.read_text(encoding="utf-8"), self.path.stat().st_ino
        except FileNotFoundError:
            return None, -1
        except (OSError, UnicodeDecodeError) as exc:
            raise _os_error("read", self.path, exc if isinstance(exc, OSError)
                            else OSError(0, "not UTF-8 text")) from None

    def write(self, text: str, stamp: int) -> None:
        """Replace the file atomically if it is still the one read (``StaleStateError``)."""
        now = self.path.stat().st_ino if self.path.exists() else -1
        if now != stamp:
            raise StaleStateError(f"shard map {self.path} was replaced meanwhile; nothing "
                                  "written (look again and retry)")
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError as exc:
            if tmp.is_file():
                tmp.unlink()
            raise _os_error("write", self.path, exc) from None

    def close(self) -> None:
        """Nothing to release."""


@contextmanager
def _store(spec: str, timeout: float) -> Iterator[FileStore]:
    if not spec:
        raise UsageError("FARM_SHARDMAP is not set (the built-in demo map cannot change): "
                         "set it to a file or zk://host:port/path")
    if spec.startswith("zk://"):
        from sharding.zkmap import ZkStore
        store = ZkStore(spec, timeout)
        try:
            yield store  # type: ignore[misc]
        finally:
            store.close()
        return
    with FileStore(Path(spec)).locked() as store:
        yield store


def _check_next(current: str | None, new: ShardMap, spec: str) -> None:
    if current is None:
        return
    try:
        was = ShardMap.from_json(current, spec).version
    except ShardMapError:
        return  # an invalid map in force may be replaced by any valid one
    if new.version != was + 1:
        raise StaleStateError(f"refused: the map has version {new.version}, but {spec} is at "
                              f"version {was}; publish version {was + 1}")


def publish(spec: str, text: str, timeout: float = 10.0) -> ShardMap:
    """Validate ``text`` and write it as the next version of the map at ``spec``."""
    new = ShardMap.from_json(text, "the new shard map")
    with _store(spec, timeout) as store:
        current, stamp = store.load()
        _check_next(current, new, spec)
        store.write(text, stamp)
    return new


def amend(spec: str, change: Callable[[dict], None], timeout: float = 10.0) -> ShardMap:
    """Apply ``change`` to a copy of the map document in force, bump its version, validate
    and write it (compare-and-set); returns the new map."""
    with _store(spec, timeout) as store:
        current, stamp = store.load()
        if current is None:
            raise ShardMapError(f"no shard map at {spec} to change")
        ShardMap.from_json(current, spec)  # a map in force that is not valid: one line
        doc = json.loads(current)
        new_doc = copy.deepcopy(doc)
        change(new_doc)
        new_doc["version"] = doc["version"] + 1
        new = ShardMap.from_dict(new_doc)
        store.write(json.dumps(new_doc, indent=2) + "\n", stamp)
    return new


def in_force(spec: str, timeout: float = 10.0) -> ShardMap | None:
    """The map at ``spec`` as its store holds it now (``None`` if there is none), read past
    every cache: what a caller whose write raised checks to learn whether it landed."""
    with _store(spec, timeout) as store:
        current, _ = store.load()
    return None if current is None else ShardMap.from_json(current, spec)
