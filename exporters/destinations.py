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

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote

from shardfarm.errors import ConfigError, FarmError, RetryableError
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

    def check_folders(self, folders: list[str]) -> None:
        """Fail with one line if one of ``folders`` (``users/dt=2026-11-21/``) cannot be made
        (nothing by default: an S3 key needs no folder)."""
        return None


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


def checked_destination(url: str, folders: list[str] | None = None) -> Destination:
    """The destination of ``url``, checked once as a status view looks (S3 calls wait
    FARM_STATUS_TIMEOUT, not retried), with the ``folders`` a run will write
    (``check_folders``): what ``farm export`` plans with and ``farm cron`` checks when it
    starts. A destination that cannot be used is one line naming it (its password hidden):
    a ``DestinationError`` if a later look may succeed, else a ``ConfigError``."""
    dest = open_destination(url, quick=True)
    try:
        dest.check()
        dest.check_folders(list(folders or []))
    except FarmError as exc:
        error = DestinationError if isinstance(exc, RetryableError) else ConfigError
        raise error(f"export destination {redact_url(url)} cannot be used: {exc}") from None
    return dest


from exporters.files import FileDestination, FileWriter, PathInTheWayError  # noqa: E402 - so does file://
from exporters.s3 import S3Destination, S3Writer  # noqa: E402 - S3 builds on the above

__all__ = ["Destination", "DestinationError", "FileDestination", "FileWriter", "PartWriter",
           "PathInTheWayError", "S3Destination", "S3Writer", "checked_destination",
           "open_destination"]
