"""Mod-shard hash, checked against an independent computation.

The bucket of a key is the md5 of its UTF-8 bytes, as an integer, modulo the buckets.
"""

import hashlib

from hypothesis import given
from hypothesis import strategies as st

from sharding.modshard import bucket_of, legacy_key


def _independent(key: str, buckets: int) -> int:
    digest = hashlib.md5(key.encode("utf-8")).digest()
    return int.from_bytes(digest, "big") % buckets


def test_known_key():
    assert bucket_of("1.2.3.4") == _independent("1.2.3.4", 4096)
    assert 0 <= bucket_of("1.2.3.4") < 4096


@given(st.text(), st.integers(1, 70000))
def test_matches_independent(key, buckets):
    assert bucket_of(key, buckets) == _independent(key, buckets)


def test_legacy_key_shape():
    assert legacy_key("pin", 42) == "pin:42"
