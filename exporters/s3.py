"""``s3://`` destinations: a streaming multipart upload per part (one PUT when small),
completed only at ``publish``, aborted on error; sizes of many parts from one listing.

Every call is bounded: the client's timeouts and retries come from
``shardfarm.bounds.s3_client_options`` (a worker's, or a status view's quick look), and an
endpoint that does not answer in time is a retryable ``DestinationError``."""

from __future__ import annotations

import hashlib
import logging
from typing import Any
from urllib.parse import urlsplit

from botocore.config import Config
from botocore.exceptions import ConnectTimeoutError, ReadTimeoutError

from exporters.destinations import Destination, DestinationError, Fence, PartWriter, _no_fence
from shardfarm.bounds import s3_client_options
from shardfarm.errors import ConfigError

log = logging.getLogger(__name__)
MIN_PART = 5 * 1024 * 1024  # S3's smallest part but the last
PART_SIZE = 8 * 1024 * 1024
MAX_PARTS = 10_000
SHA256_META = "sha256"  # S3 user metadata of a single-PUT object: its content's sha256
CONFIG_CODES = frozenset({"NoSuchBucket", "AccessDenied", "InvalidAccessKeyId",
                          "SignatureDoesNotMatch", "AllAccessDisabled", "InvalidBucketName",
                          "403", "404"})
MISSING_CODES = frozenset({"404", "NoSuchKey"})


# -- s3:// ---------------------------------------------------------------------------------
def _code(exc: BaseException) -> str:
    """The S3 error code of a botocore error; empty for one that carries no response (a
    timeout, a refused connection: their ``response`` is ``None``)."""
    response = getattr(exc, "response", None) or {}
    return str((response.get("Error") or {}).get("Code") or "")


def _s3_error(exc: BaseException, what: str, client: Any = None) -> Exception:
    """A botocore error as a ``ConfigError`` (bucket, credentials) or a retryable one (a
    timeout names the endpoint and the time it was given, from ``client``'s config)."""
    code = _code(exc)
    if code in CONFIG_CODES:
        return ConfigError(f"S3 {what}: {code} (check the bucket, AWS credentials and "
                           "AWS_ENDPOINT_URL)")
    if isinstance(exc, ReadTimeoutError | ConnectTimeoutError):
        return DestinationError(f"S3 {what}: {_no_answer(exc, client)} (check "
                                "AWS_ENDPOINT_URL and the network)")
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return DestinationError(f"S3 {what}: {text}")


def _no_answer(exc: BaseException, client: Any) -> str:
    """``no answer from http://host:port within N s`` (or ``no connection …``) for a
    botocore timeout; the limit is the one ``client`` was configured with."""
    reading = isinstance(exc, ReadTimeoutError)
    url = urlsplit(str(getattr(exc, "kwargs", {}).get("endpoint_url") or ""))
    port = f":{url.port}" if url.port else ""
    where = f" from {url.scheme}://{url.hostname}{port}" if url.hostname else ""
    config = getattr(getattr(client, "meta", None), "config", None)
    limit = getattr(config, "read_timeout" if reading else "connect_timeout", None)
    within = f" within {limit:g} s" if isinstance(limit, int | float) else ""
    return f"{'no answer' if reading else 'no connection'}{where}{within}"


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
            raise _s3_error(exc, f"{what} {self.bucket}/{self.key}", self.client) from None

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
    ``AWS_ENDPOINT_URL`` included). ``quick``: a status view's look, which waits
    FARM_STATUS_TIMEOUT and does not retry (``shardfarm.bounds``)."""

    parallel_publish = True  # one HTTP request each: several at a time

    def __init__(self, bucket: str, prefix: str = "", client=None, quick: bool = False) -> None:
        self.bucket, self.prefix = bucket, prefix
        self.url = f"s3://{bucket}/{prefix}".rstrip("/")
        self._client = client
        self.quick = quick

    @property
    def client(self) -> Any:
        """A boto3 S3 client with bounded timeouts and retries, built on first use."""
        if self._client is None:
            import boto3
            self._client = boto3.client("s3", config=Config(**s3_client_options(self.quick)))
        return self._client

    def _error(self, exc: BaseException, call: str, path: str) -> Exception:
        """``_s3_error`` of ``call`` on ``path`` of the bucket."""
        return _s3_error(exc, f"{call} {self.bucket}/{path}", self.client)

    def _missing(self, exc: BaseException) -> bool:
        return _code(exc) in MISSING_CODES

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
            raise self._error(exc, "list_objects_v2", full) from None
        return out

    def sha256(self, key: str) -> str | None:
        """From the object's metadata (single PUTs carry it), else by reading it through."""
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        except Exception as exc:  # noqa: BLE001 - a missing object is a 404
            if self._missing(exc):
                return None
            raise self._error(exc, "head_object", self._key(key)) from None
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
            raise self._error(exc, "get_object", self._key(key)) from None

    def size(self, key: str) -> int | None:
        """Bytes in ``key``, or ``None`` if it does not exist."""
        try:
            return int(self.client.head_object(Bucket=self.bucket,
                                               Key=self._key(key))["ContentLength"])
        except Exception as exc:  # noqa: BLE001 - a missing object is a 404
            if self._missing(exc):
                return None
            raise self._error(exc, "head_object", self._key(key)) from None

    def read(self, key: str) -> bytes | None:
        """The content of ``key``, or ``None`` if it does not exist."""
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()
        except Exception as exc:  # noqa: BLE001 - a missing object is NoSuchKey
            if self._missing(exc):
                return None
            raise self._error(exc, "get_object", self._key(key)) from None

    def list(self, prefix: str) -> list[str]:
        """Keys of every object under ``prefix``, sorted."""
        full, out = self._key(prefix), []
        strip = len(self.prefix) + 1 if self.prefix else 0
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(
                    Bucket=self.bucket, Prefix=full):
                out += [o["Key"][strip:] for o in page.get("Contents", [])]
        except Exception as exc:  # noqa: BLE001 - translated
            raise self._error(exc, "list_objects_v2", full) from None
        return sorted(out)

    def delete(self, key: str) -> None:
        """Delete ``key`` (nothing if it does not exist)."""
        try:
            self.client.delete_object(Bucket=self.bucket, Key=self._key(key))
        except Exception as exc:  # noqa: BLE001 - translated
            raise self._error(exc, "delete_object", self._key(key)) from None

    def check(self) -> None:
        """Check the bucket is reachable, or one line saying why not."""
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except Exception as exc:  # noqa: BLE001 - translated
            err = _s3_error(exc, f"bucket {self.bucket}", self.client)
            raise err if isinstance(err, DestinationError) else ConfigError(str(err)) from None
