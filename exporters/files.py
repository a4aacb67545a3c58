"""``file://`` destinations: a directory tree whose parts are written to a hidden temp file
beside their name, fsynced and renamed (nothing partial is ever visible).

What cannot be fixed by trying again fails at once, in one line naming the path: a
regular file where the tree needs a directory (or a directory where a part goes) is a
``PathInTheWayError``, and ``check()`` proves, before a run starts, that the root can be
created and written (a read-only mount stops root too, where permissions do not), as
``check_folders()`` does that no file stands where a table's folder goes.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import os
import secrets
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any, TypeVar

from exporters.destinations import Destination, Fence, PartWriter, _no_fence
from shardfarm.errors import ConfigError

F = TypeVar("F", bound=Callable[..., Any])


class PathInTheWayError(ConfigError):
    """A regular file stands where the export tree needs a directory (or a directory where a
    file goes): no later attempt can succeed until an operator moves it, so a chunk fails at
    once instead of being retried."""


def in_the_way(path: Path) -> Path:
    """The first of ``path`` and its parents (from the top) that exists but is not a
    directory: the file that keeps ``path`` from being made; ``path`` itself if none is."""
    for p in [*reversed(path.parents), path]:
        if not p.exists():
            break
        if not p.is_dir():
            return p
    return path


def _file_in_the_way(where: Path) -> PathInTheWayError:
    return PathInTheWayError(f"export path {where} is a file where a directory belongs: "
                             "move it away or export elsewhere")


def tree_errors(fn: F) -> F:
    """Let ``fn`` raise a ``PathInTheWayError`` naming the path (not the retryable OS error)
    when a file stands where a directory belongs, or a directory where a file does."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (NotADirectoryError, FileExistsError) as exc:
            raise _file_in_the_way(in_the_way(Path(exc.filename or "."))) from None
        except IsADirectoryError as exc:  # a rename names its target second
            raise PathInTheWayError(f"export path {exc.filename2 or exc.filename} is a "
                                    "directory where a file belongs: move it away or export "
                                    "elsewhere") from None
    return wrapper  # type: ignore[return-value]


class FileWriter(PartWriter):
    """A hidden temp file beside the target; fsync and ``os.replace`` at commit."""

    @tree_errors
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

    @tree_errors
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

    @tree_errors
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

    @tree_errors
    def sync(self, folder: str) -> None:
        """Make the names renamed into ``folder`` durable."""
        path = self._path(folder)
        if path.is_dir():
            sync_dir(path)

    @tree_errors
    def drop_leftovers(self, key: str) -> None:
        """Delete the temp files of ``key`` (a SIGKILLed writer cannot clean up). Only the
        attempt holding a part's chunk lease writes that part, so another temp file of it
        is a dead attempt's, or a fenced-out zombie's that fails its fence before the
        rename anyway (and then finds nothing to delete)."""
        target = self._path(key)
        for stale in target.parent.glob(f".{glob.escape(target.name)}.tmp-*"):
            with suppress(FileNotFoundError):
                stale.unlink()

    @tree_errors
    def sha256(self, key: str) -> str | None:
        """SHA-256 hex digest of ``key``'s bytes, or ``None`` if it does not exist."""
        try:
            with open(self._path(key), "rb") as f:
                return hashlib.file_digest(f, "sha256").hexdigest()
        except FileNotFoundError:
            return None

    @tree_errors
    def size(self, key: str) -> int | None:
        """Bytes in ``key``, or ``None`` if it does not exist."""
        try:
            return self._path(key).stat().st_size
        except FileNotFoundError:
            return None

    @tree_errors
    def read(self, key: str) -> bytes | None:
        """The content of ``key``, or ``None`` if it does not exist."""
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            return None

    @tree_errors
    def list(self, prefix: str) -> list[str]:
        """Keys of every file under ``prefix``, sorted."""
        base = self._path(prefix) if prefix else self.root
        if not base.is_dir():
            return []
        return sorted(str(p.relative_to(self.root)) for p in base.rglob("*") if p.is_file())

    @tree_errors
    def delete(self, key: str) -> None:
        """Delete ``key`` (nothing if it does not exist)."""
        with suppress(FileNotFoundError):
            self._path(key).unlink()

    def check_folders(self, folders: list[str]) -> None:
        """``PathInTheWayError`` naming the first file that stands where one of ``folders``
        (a table's ``users/dt=2026-11-21/``) needs a directory: a few ``stat`` calls per
        folder, before a run starts, instead of a failed chunk of each shard run."""
        for folder in folders:
            where = in_the_way(self._path(folder))
            if where.exists() and not where.is_dir():
                raise _file_in_the_way(where)

    def check(self) -> None:
        """Create the root directory and prove a file can be created and removed there (a
        read-only mount, a full disk or a directory of another owner fails here, not in
        every chunk), or one line saying why not."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"cannot create export directory {self.root}: "
                              f"{exc.strerror}") from None
        probe = self.root / f".farm-check-{os.getpid()}-{secrets.token_hex(3)}"
        try:
            os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            probe.unlink()
        except OSError as exc:
            raise ConfigError(f"cannot write to export directory {self.root}: "
                              f"{exc.strerror}") from None
