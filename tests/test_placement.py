"""New users' placement over open ranges: by weight, deterministic, independent of earlier IDs."""

from __future__ import annotations

import copy
from collections import Counter

import pytest

from shardfarm.errors import ConfigError, ShardMapError
from sharding.placement import place_user
from sharding.shardmap import ShardMap, demo_map_doc


def _map(open_: list) -> ShardMap:
    doc = copy.deepcopy(demo_map_doc())
    doc["open"] = open_
    return ShardMap.from_dict(doc)


def test_weights_decide_the_share_of_each_open_range():
    m = _map([[0, 7, 1], [8, 15, 3]])
    counts = Counter(place_user(m, k) >= 8 for k in range(8000))
    assert 0.72 < counts[True] / 8000 < 0.78  # 3 of 4
    assert {place_user(m, k) for k in range(8000)} == set(range(16))


def test_without_weights_every_open_shard_gets_an_equal_share():
    m = _map([[0, 3], [8, 15]])
    counts = Counter(place_user(m, k) for k in range(12000))
    assert set(counts) == {0, 1, 2, 3, *range(8, 16)}
    assert min(counts.values()) > 800 and max(counts.values()) < 1200


def test_the_same_map_places_the_same_key_on_the_same_shard():
    a, b = _map([[0, 7], [8, 15, 5]]), _map([[0, 7], [8, 15, 5]])
    assert [place_user(a, k) for k in range(500)] == [place_user(b, k) for k in range(500)]


def test_no_open_range_and_bad_weights_are_refused():
    with pytest.raises(ConfigError, match="no open shards"):
        place_user(_map([]), 1)
    with pytest.raises(ShardMapError, match=r"open\[0\] weight 0"):
        _map([[0, 7, 0]])
    with pytest.raises(ShardMapError, match="weight"):
        _map([[0, 7, "x"]])
