"""Where exports go: one small interface, one short class per backend (``s3://``, ``file://``).

A part is written through ``open_part(key, fence)``, a writer with ``write(bytes)``,
``commit()`` and ``abort()``. Nothing is visible under ``key`` before
``commit()``: a file is written beside its final name (a hidden ``.tmp`` file),
fsynced and renamed; an S3 object is a multipart upload completed only at
commit (or one PUT when it is small), aborted on error. ``fence`` (a chunk's
lease check) runs immediately before the rename, completion or PUT, after every
slow step: an attempt that lost its lease never makes anything visible. Keys are relative to
the destination's root (``users/dt=2026-11-21/part-00007.jsonl.gz``).
"""

from __future__ import annotations

import glob
import hashlib
import logging
import os
import secrets
from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from urllib.parse import unquote

from shardfarm.errors import ConfigError, RetryableError
from shardfarm.redact import redact_url
from shardfarm.settings import export_url_problem

log = logging.getLogger(__name__)
Fence = Callable[[], None]


def _no_fence() -> None:
    """No lease to check (tools, benchmarks)."""


class DestinationError(RetryableError):
    """The destination failed in a way a later attempt may not see (network, 5xx)."""


class PartWriter(ABC):
    """An object being written: visible under its key only after ``commit()``."""

    @abstractmethod
    def write(self, data: bytes) -> None:
        """Append bytes."""

    def commit(self) -> None:
        """Make the whole object visible at once (``prepare`` then ``publish``)."""
        self.prepare()
        self.publish()

    @abstractmethod
    def prepare(self) -> None:
        """Make everything written durable where it waits, still invisible."""

    @abstractmethod
    def publish(self) -> None:
        """After ``prepare``: the fence, then the object becomes visible whole."""

    @abstractmethod
    def abort(self) -> None:
        """Drop everything written; nothing becomes visible (safe to call twice)."""

    def __enter__(self) -> PartWriter:
        return self

    def __exit__(self, exc_type, *exc: object) -> None:
        if exc_type is not None:
            self.abort()


class Destination(ABC):
    """An export root: write parts atomically, read small objects back, list, delete."""

    url: str
    parallel_publish = False  # whether several parts are best made visible at once

    @abstractmethod
    def open_part(self, key: str, fence: Fence = _no_fence) -> PartWriter:
        """A writer whose bytes become the object ``key`` at ``commit()``; ``fence`` runs
        immediately before they become visible (and may raise to prevent it)."""

    @abstractmethod
    def sha256(self, key: str) -> str | None:
        """The hex sha256 of the object's content, or ``None`` if it does not exist."""

    @abstractmethod
    def size(self, key: str) -> int | None:
        """The object's size in bytes, or ``None`` if it does not exist."""

    @abstractmethod
    def read(self, key: str) -> bytes | None:
        """A (small) object's bytes, or ``None`` if it does not exist."""

    @abstractmethod
    def list(self, prefix: str) -> list[str]:
        """Keys under ``prefix`` (a folder such as ``users/dt=2026-11-21/``), sorted."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove an object if it exists."""

    def exists(self, key: str) -> bool:
        """Whether the object exists."""
        return self.size(key) is not None

    def sizes(self, folder: str, names: list[str]) -> dict[str, int]:
        """The size of each of ``names`` (files of ``folder``) that exists."""
        return {n: size for n in names if (size := self.size(folder + n)) is not None}

    def sync(self, folder: str) -> None:
        """After a group of parts of ``folder`` was published: make their names durable
        (nothing by default)."""
        return None

    def drop_leftovers(self, key: str) -> None:
        """Before an export part is written again: remove what earlier, dead attempts at
        ``key`` left behind (nothing by default: an unfinished S3 upload is invisible)."""
        return None

    def drop_leftovers_of(self, folder: str, names: list[str]) -> None:
        """``drop_leftovers`` of each of ``names`` in ``folder``."""
        for name in names:
            self.drop_leftovers(folder + name)

    def put(self, key: str, data: bytes, fence: Fence = _no_fence) -> None:
        """Write a small object whole (manifest, ``_SUCCESS``), ``fence`` checked last."""
        with self.open_part(key, fence) as w:
            w.write(data)
            w.commit()

    @abstractmethod
    def check(self) -> None:
        """Fail with one line if the destination cannot be used (called before a run starts)."""


def open_destination(url: str, quick: bool = False) -> Destination:
    """The destination of ``s3://bucket/prefix`` or ``file:///abs/dir`` (checked as
    ``FARM_EXPORT_URL`` and ``--dest`` are: ``export_url_problem``); ``quick``: for a
    status view's look, whose S3 calls wait FARM_STATUS_TIMEOUT and are not retried."""
    problem = export_url_problem(url)
    if problem:
        raise ConfigError(f"bad export destination {redact_url(url)} ({problem})")
    if url.startswith("file://"):
        return FileDestination(Path(unquote(url[len("file://"):])))
    bucket, _, prefix = url[len("s3://"):].partition("/")
    return S3Destination(bucket, prefix.strip("/"), quick=quick)


# -- file:// -------------------------------------------------------------------------------
class FileWriter(PartWriter):
    """A hidden temp file beside the target; fsync and ``os.replace`` at commit."""

    def __init__(self, target: Path, fence: Fence = _no_fence) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        self.target, self.fence = target, fence
        self.tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}-{secrets.token_hex(3)}")
        self.f = open(self.tmp, "wb")  # noqa: SIM115 - closed at commit or abort

    def write(self, data: bytes) -> None:
        """Append ``data`` to the temp file."""
        self.f.write(data)

    def commit(self) -> None:
        """Publish the part, then make its name durable (fsync of the directory)."""
        super().commit()
        sync_dir(self.target.parent)

    def prepare(self) -> None:
        """Make the temp file's bytes durable and close it."""
        self.f.flush()
        os.fsync(self.f.fileno())
        self.f.close()

    def publish(self) -> None:
        """Check the fence, then rename the temp file over the part."""
        self.fence()  # the last word before the rename: nothing slow may come between
        os.replace(self.tmp, self.target)

    def abort(self) -> None:
        """Close and delete the temp file; the part is left as it was."""
        with suppress(OSError):
            self.f.close()
        with suppress(FileNotFoundError):
            self.tmp.unlink()


def sync_dir(path: Path) -> None:
    """fsync a directory: the names renamed into it are durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FileDestination(Destination):
    """A directory tree (the embedded default, ``file://<cwd>/exports``)."""

    def __init__(self, root: Path) -> None:
        # one directory, one name: ``..``, ``.`` and symlinks resolved, so the folder that
        # one run at a time may write (``PartLog.claim``, ``refuse_overlap``) is the same
        # however the operator spells it
        self.root = Path(os.path.realpath(root))
        self.url = f"file://{self.root}"

    def _path(self, key: str) -> Path:
        """The path of ``key`` under the root; a key that could leave it (absolute, ``..``,
        empty) is refused by its text, without asking the file system."""
        parts = key.split("/")
        if not key or key.startswith("/") or ".." in parts or "\0" in key:
            raise ConfigError(f"export key {key!r} leaves {self.root}")
        return self.root.joinpath(*[p for p in parts if p not in ("", ".")])

    def open_part(self, key: str, fence: Fence = _no_fence) -> PartWriter:
        """A writer of the part at ``key``, published by ``commit``."""
        return FileWriter(self._path(key), fence)

    def drop_leftovers_of(self, folder: str, names: list[str]) -> None:
        """One scan of the folder for the temp files of ``names``."""
        path, prefixes = self._path(folder), tuple(f".{n}.tmp-" for n in names)
        try:
            stale = [e.path for e in os.scandir(path) if e.name.startswith(prefixes)]
        except FileNotFoundError:
            return
        for p in stale:
            with suppress(FileNotFoundError):
                os.unlink(p)

    def sync(self, folder: str) -> None:
        """Make the names renamed into ``folder`` durable."""
        path = self._path(folder)
        if path.is_dir():
            sync_dir(path)

    def drop_leftovers(self, key: str) -> None:
        """Delete the temp files of ``key`` (a SIGKILLed writer cannot clean up). Only the
        attempt holding a part's chunk lease writes that part, so another temp file of it
        is a dead attempt's, or a fenced-out zombie's that fails its fence before the
        rename anyway (and then finds nothing to delete)."""
        target = self._path(key)
        for stale in target.parent.glob(f".{glob.escape(target.name)}.tmp-*"):
            with suppress(FileNotFoundError):
                stale.unlink()

    def sha256(self, key: str) -> str | None:
        """SHA-256 hex digest of ``key``'s bytes, or ``None`` if it does not exist."""
        try:
            with open(self._path(key), "rb") as f:
                return hashlib.file_digest(f, "sha256").hexdigest()
        except FileNotFoundError:
            return None

    def size(self, key: str) -> int | None:
        """Bytes in ``key``, or ``None`` if it does not exist."""
        try:
            return self._path(key).stat().st_size
        except FileNotFoundError:
            return None

    def read(self, key: str) -> bytes | None:
        """The content of ``key``, or ``None`` if it does not exist."""
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            return None

    def list(self, prefix: str) -> list[str]:
        """Keys of every file under ``prefix``, sorted."""
        base = self._path(prefix) if prefix else self.root
        if not base.is_dir():
            return []
        return sorted(str(p.relative_to(self.root)) for p in base.rglob("*") if p.is_file())

    def delete(self, key: str) -> None:
        """Delete ``key`` (nothing if it does not exist)."""
        with suppress(FileNotFoundError):
            self._path(key).unlink()

    def check(self) -> None:
        """Create the root directory, or one line saying why it cannot be."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"cannot create export directory {self.root}: "
                              f"{exc.strerror}") from None


from exporters.s3 import S3Destination, S3Writer  # noqa: E402 - S3 builds on the above

__all__ = ["Destination", "DestinationError", "FileDestination", "FileWriter", "PartWriter",
           "S3Destination", "S3Writer", "open_destination"]
