"""Mod shard: buckets for lookups by something that is not an ID (username, email, legacy ID)."""

from __future__ import annotations

try:  # CPython's own MD5: the same digest as OpenSSL's, without its per-call set-up
    from _md5 import md5  # (measured: 0.25 us a short key, hashlib's 0.7 us)
except ImportError:  # a Python built without it
    from hashlib import md5

DEFAULT_BUCKETS = 4096


def bucket_of(key: str, buckets: int = DEFAULT_BUCKETS) -> int:
    """``int(md5(key_utf8).hexdigest(), 16) % buckets`` which every implementation must agree on
    (the same number read from the digest's bytes: no hex text to make and parse; a
    migration hashes every object it writes)."""
    return int.from_bytes(md5(key.encode("utf-8")).digest(), "big") % buckets


def legacy_key(type_name: str, legacy_id: int) -> str:
    """The mod-shard key of a legacy ID: ``"{type_name}:{legacy_id}"``."""
    return f"{type_name}:{legacy_id}"
