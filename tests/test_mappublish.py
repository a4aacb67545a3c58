"""Publishing a shard map file: the next version only, validated, replaced atomically."""

from __future__ import annotations

import json

import pytest

from shardfarm.errors import ShardMapError, StaleStateError, UsageError
from sharding.mappublish import FileStore, amend, publish
from sharding.shardmap import ShardMap, demo_map_doc


def _doc(version: int) -> dict:
    return {**demo_map_doc(), "version": version}


def test_the_next_version_replaces_the_file_and_others_are_refused(tmp_path):
    path = tmp_path / "map.json"
    path.write_text(json.dumps(_doc(4)))
    with pytest.raises(StaleStateError, match="publish version 5"):
        publish(str(path), json.dumps(_doc(4)))
    assert publish(str(path), json.dumps(_doc(5))).version == 5
    assert ShardMap.load(path).version == 5


def test_amend_bumps_the_version_and_validates(tmp_path):
    path = tmp_path / "map.json"
    path.write_text(json.dumps(_doc(1)))
    new = amend(str(path), lambda d: d["open"].clear())
    assert (new.version, new.open_ranges) == (2, [])

    def bad(d: dict) -> None:
        d["shards"][0]["slave"] = "ghost"
    with pytest.raises(ShardMapError, match="unknown host"):
        amend(str(path), bad)
    assert ShardMap.load(path).version == 2


def test_a_file_replaced_between_read_and_write_is_refused(tmp_path):
    path = tmp_path / "map.json"
    path.write_text(json.dumps(_doc(1)))
    store = FileStore(path)
    _, stamp = store.load()
    publish(str(path), json.dumps(_doc(2)))
    with pytest.raises(StaleStateError, match="replaced meanwhile"):
        store.write(json.dumps(_doc(3)), stamp)


def test_the_built_in_map_cannot_be_published():
    with pytest.raises(UsageError, match="FARM_SHARDMAP is not set"):
        publish("", json.dumps(_doc(2)))


def test_a_map_file_that_cannot_be_written_or_read_is_one_line(tmp_path, monkeypatch):
    """The file system refuses the new version (here its temporary file's name is taken by
    a directory, as a full or read-only disk would refuse it): a ``ConfigError`` line, the
    map in force untouched; a map in force that is not JSON is refused likewise."""
    import os

    from shardfarm.errors import ConfigError
    path = tmp_path / "map.json"
    path.write_text(json.dumps(_doc(1)))
    (tmp_path / f".map.json.{os.getpid()}.tmp").mkdir()
    with pytest.raises(ConfigError, match=r"cannot write the shard map .*nothing written"):
        amend(str(path), lambda d: d["open"].clear())
    assert ShardMap.load(path).version == 1
    path.write_text("{not json")
    with pytest.raises(ShardMapError, match="malformed JSON"):
        amend(str(path), lambda d: d["open"].clear())
