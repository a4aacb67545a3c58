"""``s3://`` destinations: a streaming multipart upload per part (one PUT when small),
completed only at ``publish``, aborted on error; sizes of many parts from one listing."""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from exporters.destinations import Destination, DestinationError, Fence, PartWriter, _no_fence
from shardfarm.errors import ConfigError

log = logging.getLogger(__name__)
MIN_PART = 5 * 1024 * 1024  # S3's smallest part but the last
PART_SIZE = 8 * 1024 * 1024
MAX_PARTS = 10_000
SHA256_META = "sha256"  # S3 user metadata of a single-PUT object: its content's sha256


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
        """Buffer ``data``; a full buffer goes up as the next part of the multipart upload."""
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
        """Send the buffered rest as the last part of a multipart upload (an object that never
        filled a part goes up whole at ``publish``)."""
        if self.upload_id is not None and (self.buf or not self.parts):
            self._flush_part()

    def publish(self) -> None:
        """Check the fence, then complete the upload: the object appears at once, whole."""
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
        """Abort the multipart upload; nothing appears."""
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
    def client(self) -> Any:
        """A boto3 S3 client, built on first use."""
        if self._client is None:
            import boto3
            self._client = boto3.client("s3")
        return self._client

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def open_part(self, key: str, fence: Fence = _no_fence) -> PartWriter:
        """A writer of the object at ``key``, published by ``commit``."""
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
        """Bytes in ``key``, or ``None`` if it does not exist."""
        try:
            return int(self.client.head_object(Bucket=self.bucket,
                                               Key=self._key(key))["ContentLength"])
        except Exception as exc:  # noqa: BLE001 - a missing object is a 404
            if getattr(exc, "response", {}).get("Error", {}).get("Code") in ("404", "NoSuchKey"):
                return None
            raise _s3_error(exc, f"head_object {self.bucket}/{self._key(key)}") from None

    def read(self, key: str) -> bytes | None:
        """The content of ``key``, or ``None`` if it does not exist."""
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()
        except Exception as exc:  # noqa: BLE001 - a missing object is NoSuchKey
            if getattr(exc, "response", {}).get("Error", {}).get("Code") in ("404", "NoSuchKey"):
                return None
            raise _s3_error(exc, f"get_object {self.bucket}/{self._key(key)}") from None

    def list(self, prefix: str) -> list[str]:
        """Keys of every object under ``prefix``, sorted."""
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
        """Delete ``key`` (nothing if it does not exist)."""
        try:
            self.client.delete_object(Bucket=self.bucket, Key=self._key(key))
        except Exception as exc:  # noqa: BLE001 - translated
            raise _s3_error(exc, f"delete_object {self.bucket}/{self._key(key)}") from None

    def check(self) -> None:
        """Check the bucket is reachable, or one line saying why not."""
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except Exception as exc:  # noqa: BLE001 - translated
            err = _s3_error(exc, f"bucket {self.bucket}")
            raise ConfigError(str(err)) from None
