"""ID codec: round trips over the whole valid space, boundaries, refusals."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardfarm.errors import InvalidIdError
from sharding import ids

shards = st.integers(0, 2**16 - 1)
types = st.integers(0, 2**10 - 1)
locals_ = st.integers(1, 2**36 - 1)


@given(shards, types, locals_)
def test_round_trip(shard, type_, local):
    i = ids.encode(shard, type_, local)
    assert 0 < i < 2**62  # top two bits stay zero
    d = ids.decode(i)
    assert (d.shard, d.type, d.local) == (shard, type_, local)
    assert ids.shard_of(i) == shard


@given(st.integers(1, 2**62 - 1).filter(lambda i: i % 2**36 != 0))
def test_decode_encode_inverse(i):
    d = ids.decode(i)
    assert ids.encode(d.shard, d.type, d.local) == i


@pytest.mark.parametrize("shard,type_,local", [
    (0, 0, 1), (65535, 1023, 2**36 - 1), (0, 1, 2**36 - 1), (65535, 0, 1), (1, 1, 1)])
def test_boundaries(shard, type_, local):
    d = ids.decode(ids.encode(shard, type_, local))
    assert (d.shard, d.type, d.local) == (shard, type_, local)


def test_layout_matches_contract():
    # Written by hand (shard << 46 | type << 36 | local): shard 1, type pin (1), local 1.
    assert ids.encode(1, "pin", 1) == 2**46 + 2**36 + 1
    assert ids.decode(2**46 * 3 + 2**36 * 2 + 7).as_dict() == {
        "id": 2**46 * 3 + 2**36 * 2 + 7, "shard": 3, "type": 2, "type_name": "board", "local": 7}


@pytest.mark.parametrize("args,words", [
    ((65536, 1, 1), "shard"), ((-1, 1, 1), "shard"), ((0, 1024, 1), "type"),
    ((0, 1, 0), "local"), ((0, 1, 2**36), "local"), ((0, "widget", 1), "unknown type")])
def test_encode_refuses(args, words):
    with pytest.raises(InvalidIdError, match=words):
        ids.encode(*args)


@pytest.mark.parametrize("value,words", [
    (-5, "negative"), (2**62, "reserved"), (2**64 - 1, "reserved"), (2**46, "local id 0"),
    (0, "local id 0")])
def test_decode_refuses(value, words):
    with pytest.raises(InvalidIdError, match=words):
        ids.decode(value)


@pytest.mark.parametrize("text", ["", "abc", "1.5", "0x", "12 34", "68_719_476_737",
                                  "0x_1000000001", "\u0663", "+68719476737", "1" * 400])
def test_parse_refuses_text(text):
    """ASCII digits only: Python's ``int`` also takes underscores, a sign and other scripts'
    digits (``'\u0663'`` is 3), and would spend quadratic time on a huge number."""
    with pytest.raises(InvalidIdError):
        ids.parse(text)


def test_parse_takes_decimal_and_hex_with_spaces_around():
    assert ids.parse(" 68719476737 ").local == ids.parse("0x1000000001").local == 1


def test_a_type_in_other_digits_is_unknown():
    with pytest.raises(InvalidIdError, match="unknown type"):
        ids.type_id("\u0663")
