"""Shard map: validation messages name the entry; lookups; reload when the file changes."""

import copy
import json
import os
import time

import pytest

from shardfarm.errors import ShardMapError, UnknownShardError
from sharding.shardmap import ShardMap, ShardMapSource, demo_map_doc

GOOD = {
    "version": 1,
    "hosts": {"MySQL001A": {"host": "10.0.0.1", "port": 3306, "user": "root", "password": "pw"},
              "MySQL001B": {"host": "10.0.0.2", "port": 3306, "user": "root", "password": "pw"},
              "MySQL002A": {"host": "10.0.0.3", "port": 3307, "user": "root", "password": ""},
              "MySQL002B": {"host": "10.0.0.4", "port": 3306, "user": "root", "password": ""}},
    "shards": [{"range": [0, 511], "master": "MySQL001A", "slave": "MySQL001B"},
               {"range": [512, 1023], "master": "MySQL002A", "slave": "MySQL002B"}],
    "open": [[0, 1023]],
    "mod": {"buckets": 4096,
            "ranges": [{"range": [0, 4095], "master": "MySQL001A", "slave": "MySQL001B"}]},
}


def bad(mutate):
    doc = copy.deepcopy(GOOD)
    mutate(doc)
    return doc


def test_good_map_lookups():
    m = ShardMap.from_dict(GOOD)
    assert m.master(0).name == "MySQL001A"
    assert m.master(511).name == "MySQL001A"
    assert m.master(512).name == "MySQL002A"
    assert m.slave(1023).name == "MySQL002B"
    assert m.mod_master(4095).name == "MySQL001A"
    assert m.shard_count() == 1024
    assert len(m.open_shards()) == 1024
    with pytest.raises(UnknownShardError, match="1024"):
        m.master(1024)


def test_password_not_in_repr():
    m = ShardMap.from_dict(GOOD)
    assert "pw" not in repr(m) and "pw" not in repr(m.hosts["MySQL001A"])


CASES = [
    ("overlap", lambda d: d["shards"][1].update(range=[500, 1023]), "shards[1]", "overlaps"),
    ("unknown host", lambda d: d["shards"][0].update(master="MySQL009A"), "shards[0].master",
     "MySQL009A"),
    ("unknown slave", lambda d: d["shards"][1].update(slave="nope"), "shards[1].slave", "nope"),
    ("past 65535", lambda d: d["shards"][1].update(range=[512, 65536]), "shards[1]", "65535"),
    ("open not backed", lambda d: d.update(open=[[0, 2047]]), "open[0]", "not backed"),
    ("mod gap", lambda d: d["mod"]["ranges"][0].update(range=[0, 4000]), "mod.ranges",
     "cover"),
    ("mod past buckets", lambda d: d["mod"]["ranges"][0].update(range=[0, 4096]),
     "mod.ranges[0]", "4095"),
    ("reversed range", lambda d: d["shards"][0].update(range=[10, 2]), "shards[0]", "empty"),
    ("bad port", lambda d: d["hosts"]["MySQL001A"].update(port=70000), "hosts.MySQL001A.port",
     "70000"),
    ("no host", lambda d: d["hosts"]["MySQL002B"].pop("host"), "hosts.MySQL002B.host", ""),
    ("range not list", lambda d: d["shards"][0].update(range="0-511"), "shards[0].range", ""),
    ("no version", lambda d: d.pop("version"), "version", ""),
    ("no mod", lambda d: d.pop("mod"), "mod", ""),
]


@pytest.mark.parametrize("name,mutate,entry,words", CASES, ids=[c[0] for c in CASES])
def test_bad_maps_name_the_entry(name, mutate, entry, words):
    with pytest.raises(ShardMapError) as exc:
        ShardMap.from_dict(bad(mutate))
    msg = str(exc.value)
    assert entry in msg and words in msg
    assert "\n" not in msg and "pw" not in msg


def test_malformed_json_names_position():
    with pytest.raises(ShardMapError, match="line 1 column"):
        ShardMap.from_json('{"version": 1,,}')


def test_demo_map_is_valid():
    m = ShardMap.from_dict(demo_map_doc())
    assert m.buckets == 4096 and m.shard_count() == 16


def test_reload_on_change_keeps_last_good(tmp_path):
    path = tmp_path / "map.json"
    path.write_text(json.dumps(GOOD))
    src = ShardMapSource(path, interval=0)
    assert src.current().master(600).name == "MySQL002A"
    moved = bad(lambda d: d["shards"][1].update(master="MySQL002B", slave="MySQL002A"))
    moved["version"] = 2
    path.write_text(json.dumps(moved))
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert src.current().master(600).name == "MySQL002B"
    assert src.current().version == 2
    path.write_text("{ broken")
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 2 * 10**9))
    assert src.current().version == 2  # a bad new file never replaces a good map
