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

log = logging.getLogger(__name__)
MIN_PART = 5 * 1024 * 1024  # S3's smallest part but the last
PART_SIZE = 8 * 1024 * 1024
MAX_PARTS = 10_000
SHA256_META = "sha256"  # S3 user metadata of a single-PUT object: its content's sha256
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

    def put(self, key: str, data: bytes, fence: Fence = _no_fence) -> None:
        """Write a small object whole (manifest, ``_SUCCESS``), ``fence`` checked last."""
        with self.open_part(key, fence) as w:
            w.write(data)
            w.commit()

    @abstractmethod
    def check(self) -> None:
        """Fail with one line if the destination cannot be used (called before a run starts)."""


def open_destination(url: str) -> Destination:
    """The destination of ``s3://bucket/prefix`` or ``file:///abs/dir``."""
    if url.startswith("file://"):
        path = unquote(url[len("file://"):])
        if not path.startswith("/"):
            raise ConfigError(f"bad export destination {url} (file:// needs an absolute path)")
        return FileDestination(Path(path))
    if url.startswith("s3://"):
        bucket, _, prefix = url[len("s3://"):].partition("/")
        if not bucket:
            raise ConfigError(f"bad export destination {url} (expected s3://bucket/prefix)")
        return S3Destination(bucket, prefix.strip("/"))
    raise ConfigError(f"bad export destination {url} (expected s3://bucket/prefix "
                      "or file:///abs/dir)")


# -- file:// -------------------------------------------------------------------------------
class FileWriter(PartWriter):
    """A hidden temp file beside the target; fsync and ``os.replace`` at commit."""

    def __init__(self, target: Path, fence: Fence = _no_fence) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        self.target, self.fence = target, fence
        self.tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}-{secrets.token_hex(3)}")
        self.f = open(self.tmp, "wb")  # noqa: SIM115 - closed at commit or abort

    def write(self, data: bytes) -> None:
        self.f.write(data)

    def commit(self) -> None:
        super().commit()
        sync_dir(self.target.parent)

    def prepare(self) -> None:
        self.f.flush()
        os.fsync(self.f.fileno())
        self.f.close()

    def publish(self) -> None:
        self.fence()  # the last word before the rename: nothing slow may come between
        os.replace(self.tmp, self.target)

    def abort(self) -> None:
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
        self.root = root
        self.url = f"file://{root}"

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if self.root.resolve() not in path.parents:
            raise ConfigError(f"export key {key!r} leaves {self.root}")
        return path

    def open_part(self, key: str, fence: Fence = _no_fence) -> PartWriter:
        return FileWriter(self._path(key), fence)

    def sync(self, folder: str) -> None:
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
        try:
            with open(self._path(key), "rb") as f:
                return hashlib.file_digest(f, "sha256").hexdigest()
        except FileNotFoundError:
            return None

    def size(self, key: str) -> int | None:
        try:
            return self._path(key).stat().st_size
        except FileNotFoundError:
            return None

    def read(self, key: str) -> bytes | None:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            return None

    def list(self, prefix: str) -> list[str]:
        base = self._path(prefix) if prefix else self.root
        if not base.is_dir():
            return []
        root = self.root.resolve()
        return sorted(str(p.relative_to(root)) for p in base.rglob("*") if p.is_file())

    def delete(self, key: str) -> None:
        with suppress(FileNotFoundError):
            self._path(key).unlink()

    def check(self) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"cannot create export directory {self.root}: "
                              f"{exc.strerror}") from None


# -- s3:// ---------------------------------------------------------------------------------
def _s3_error(exc: BaseException, what: str) -> Exception:
    """A botocore error as a ``ConfigError`` (bucket, credentials) or a retryable one."""
    code = getattr(exc, "response", {}).get("Error", {}).get("Code", "")
    if code in ("NoSuchBucket", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch",
                "AllAccessDisabled", "InvalidBucketName", "403", "404"):
        return ConfigError(f"S3 {what}: {code} (check the bucket, AWS credentials and "
                           "AWS_ENDPOINT_URL)")
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return DestinationError(f"S3 {what}: {text}")


class S3Writer(PartWriter):
    """A streaming multipart upload: at most one part in memory, completed only at commit.

    An object smaller than one part is sent as a single PUT at commit. Parts
    grow (8 MiB, doubling every 1,000 parts) so a shard never runs out of the
    10,000 parts S3 allows.
    """

    def __init__(self, client, bucket: str, key: str, part_size: int = PART_SIZE,
                 fence: Fence = _no_fence) -> None:
        self.client, self.bucket, self.key, self.fence = client, bucket, key, fence
        self.part_size = max(part_size, MIN_PART)
        self.buf = bytearray()
        self.upload_id: str | None = None
        self.parts: list[dict] = []
        self.closed = False

    def _call(self, what: str, fn, **kwargs):
        try:
            return fn(Bucket=self.bucket, Key=self.key, **kwargs)
        except Exception as exc:  # noqa: BLE001 - translated, first line only
            raise _s3_error(exc, f"{what} {self.bucket}/{self.key}") from None

    def write(self, data: bytes) -> None:
        self.buf += data
        if len(self.buf) >= self.part_size:
            self._flush_part()

    def _flush_part(self) -> None:
        if self.upload_id is None:
            self.upload_id = self._call("create_multipart_upload",
                                        self.client.create_multipart_upload)["UploadId"]
        number = len(self.parts) + 1
        body = bytes(self.buf)
        self.buf.clear()
        resp = self._call("upload_part", self.client.upload_part, UploadId=self.upload_id,
                          PartNumber=number, Body=body)
        self.parts.append({"ETag": resp["ETag"], "PartNumber": number})
        if number % 1000 == 0 and number < MAX_PARTS:
            self.part_size *= 2

    def prepare(self) -> None:
        if self.upload_id is not None and (self.buf or not self.parts):
            self._flush_part()

    def publish(self) -> None:
        if self.upload_id is None:
            body = bytes(self.buf)
            meta = {SHA256_META: hashlib.sha256(body).hexdigest()}
            self.fence()  # the last word before the object appears
            self._call("put_object", self.client.put_object, Body=body, Metadata=meta)
        else:
            self.fence()  # the last word before the upload completes
            self._call("complete_multipart_upload", self.client.complete_multipart_upload,
                       UploadId=self.upload_id, MultipartUpload={"Parts": self.parts})
        self.closed = True
        self.buf = bytearray()

    def abort(self) -> None:
        if self.upload_id is not None and not self.closed:
            try:
                self._call("abort_multipart_upload", self.client.abort_multipart_upload,
                           UploadId=self.upload_id)
            except Exception:
                log.warning("could not abort multipart upload of %s", self.key, exc_info=True)
        self.closed = True
        self.buf = bytearray()


class S3Destination(Destination):
    """A bucket and prefix through boto3 (endpoint and credentials as boto3 reads them,
    ``AWS_ENDPOINT_URL`` included)."""

    parallel_publish = True  # one HTTP request each: several at a time

    def __init__(self, bucket: str, prefix: str = "", client=None) -> None:
        self.bucket, self.prefix = bucket, prefix
        self.url = f"s3://{bucket}/{prefix}".rstrip("/")
        self._client = client

    @property
    def client(self):
        """A boto3 S3 client, built on first use."""
        if self._client is None:
            import boto3
            self._client = boto3.client("s3")
        return self._client

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def open_part(self, key: str, fence: Fence = _no_fence) -> PartWriter:
        return S3Writer(self.client, self.bucket, self._key(key), fence=fence)

    def sizes(self, folder: str, names: list[str]) -> dict[str, int]:
        """One listing of ``folder`` from just before the first of ``names`` to the last."""
        if not names:
            return {}
        full, want, out = self._key(folder), set(names), {}
        first, last = min(names), max(names)
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=full, StartAfter=full + first[:-1])
            for page in pages:
                for o in page.get("Contents", []):
                    name = o["Key"][len(full):]
                    if name > last:
                        return out
                    if name in want:
                        out[name] = int(o["Size"])
        except Exception as exc:  # noqa: BLE001 - translated
            raise _s3_error(exc, f"list_objects_v2 {self.bucket}/{full}") from None
        return out

    def sha256(self, key: str) -> str | None:
        """From the object's metadata (single PUTs carry it), else by reading it through."""
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        except Exception as exc:  # noqa: BLE001 - a missing object is a 404
            if getattr(exc, "response", {}).get("Error", {}).get("Code") in ("404", "NoSuchKey"):
                return None
            raise _s3_error(exc, f"head_object {self.bucket}/{self._key(key)}") from None
        known = head.get("Metadata", {}).get(SHA256_META)
        if known:
            return known
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"]
            h = hashlib.sha256()
            for block in body.iter_chunks(1 << 20):
                h.update(block)
            return h.hexdigest()
        except Exception as exc:  # noqa: BLE001 - translated
            raise _s3_error(exc, f"get_object {self.bucket}/{self._key(key)}") from None

    def size(self, key: str) -> int | None:
        try:
            return int(self.client.head_object(Bucket=self.bucket,
                                               Key=self._key(key))["ContentLength"])
        except Exception as exc:  # noqa: BLE001 - a missing object is a 404
            if getattr(exc, "response", {}).get("Error", {}).get("Code") in ("404", "NoSuchKey"):
                return None
            raise _s3_error(exc, f"head_object {self.bucket}/{self._key(key)}") from None

    def read(self, key: str) -> bytes | None:
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()
        except Exception as exc:  # noqa: BLE001 - a missing object is NoSuchKey
            if getattr(exc, "response", {}).get("Error", {}).get("Code") in ("404", "NoSuchKey"):
                return None
            raise _s3_error(exc, f"get_object {self.bucket}/{self._key(key)}") from None

    def list(self, prefix: str) -> list[str]:
        full, out = self._key(prefix), []
        strip = len(self.prefix) + 1 if self.prefix else 0
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(
                    Bucket=self.bucket, Prefix=full):
                out += [o["Key"][strip:] for o in page.get("Contents", [])]
        except Exception as exc:  # noqa: BLE001 - translated
            raise _s3_error(exc, f"list_objects_v2 {self.bucket}/{full}") from None
        return sorted(out)

    def delete(self, key: str) -> None:
        try:
            self.client.delete_object(Bucket=self.bucket, Key=self._key(key))
        except Exception as exc:  # noqa: BLE001 - translated
            raise _s3_error(exc, f"delete_object {self.bucket}/{self._key(key)}") from None

    def check(self) -> None:
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except Exception as exc:  # noqa: BLE001 - translated
            err = _s3_error(exc, f"bucket {self.bucket}")
            raise ConfigError(str(err)) from None
