"""Shard map: validation messages name the entry; lookups; reload when the file changes."""

import copy
import json
import logging
import os
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardfarm.errors import ShardMapError, UnknownShardError
from sharding.mapsource import ShardMapSource
from sharding.shardmap import ShardMap, demo_map_doc

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
    ("open not backed", lambda d: d.update(open=[[0, 2047]]), "open[0]",
     "not backed by shards in 'shards' (shard 1024..2047 is in no range)"),
    ("mod gap", lambda d: d["mod"]["ranges"][0].update(range=[0, 4000]), "mod.ranges",
     "bucket 4001..4095 is in no range"),
    ("mod hole", lambda d: d["mod"].update(ranges=[
        {"range": [0, 99], "master": "MySQL001A", "slave": "MySQL001B"},
        {"range": [101, 4095], "master": "MySQL001A", "slave": "MySQL001B"}]), "mod.ranges",
     "bucket 100 is in no range"),
    ("mod past buckets", lambda d: d["mod"]["ranges"][0].update(range=[0, 4096]),
     "mod.ranges[0]", "4095"),
    ("reversed range", lambda d: d["shards"][0].update(range=[10, 2]), "shards[0]", "empty"),
    ("bad port", lambda d: d["hosts"]["MySQL001A"].update(port=70000), "hosts.MySQL001A.port",
     "70000"),
    ("no host", lambda d: d["hosts"]["MySQL002B"].pop("host"), "hosts.MySQL002B.host",
     "got nothing (the key is missing)"),
    ("range not list", lambda d: d["shards"][0].update(range="0-511"), "shards[0].range", ""),
    ("no version", lambda d: d.pop("version"), "version", "the key is missing"),
    ("no mod", lambda d: d.pop("mod"), "mod", "the key is missing"),
    ("no hosts", lambda d: d.pop("hosts"), "hosts", "the key is missing"),
    ("null hosts", lambda d: d.update(hosts=None), "hosts", "got null"),
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


# -- any JSON shape: a ShardMapError of one line, never another exception -----------------
KEYS = ["version", "hosts", "shards", "open", "mod", "range", "master", "slave", "host", "ssl_ca",
        "port", "user", "password", "buckets", "ranges", "MySQL001A", "MySQL002B"]
SCALARS = (st.none() | st.booleans() | st.integers() | st.integers(-2, 70000)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12)
           | st.sampled_from(["MySQL001A", "", "10.0.0.1", "a\nb", "x" * 300]))
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=8), inner, max_size=5),
    max_leaves=25)
DELETE = object()


def _paths(doc, prefix=()):
    """Every position in a document: dict keys and list indexes, recursively."""
    yield prefix
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(
        doc, list) else ()
    for k, v in items:
        yield from _paths(v, (*prefix, k))


SECRET_PW = "Zq9-map-secret-Zq9"
SECRET_MAP = bad(lambda d: d["hosts"]["MySQL002A"].update(password=SECRET_PW))
PATHS = [p for p in _paths(SECRET_MAP) if p]


def _mutated(path, value):
    doc = copy.deepcopy(SECRET_MAP)
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    if value is DELETE:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return doc


def _only_shard_map_errors(parse) -> None:
    try:
        parse()
    except ShardMapError as exc:
        msg = str(exc)
        assert "\n" not in msg and len(msg) < 400 and SECRET_PW not in msg
        assert msg.startswith(("bad shard map: ", "shard map: ", "x.json: "))


SLOW = settings(max_examples=300, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])


@SLOW
@given(JSON)
def test_any_json_value_is_a_map_or_one_shard_map_error(doc):
    _only_shard_map_errors(lambda: ShardMap.from_dict(doc))
    _only_shard_map_errors(lambda: ShardMap.from_json(json.dumps(doc)))


@SLOW
@given(st.sampled_from(PATHS), JSON | st.just(DELETE))
def test_a_valid_map_with_anything_anywhere_is_a_map_or_one_error(path, value):
    doc = _mutated(path, value)
    _only_shard_map_errors(lambda: ShardMap.from_dict(doc))
    _only_shard_map_errors(lambda: ShardMap.from_json(json.dumps(doc)))


@SLOW
@given(st.text(max_size=60) | st.sampled_from(['{"version": 1e999}', "[" * 100000,
                                               "1" * 5000, '{"a": NaN}', "\ud800"]))
def test_any_text_is_a_map_or_one_error(text):
    _only_shard_map_errors(lambda: ShardMap.from_json(text, source="x.json"))


def test_wrong_type_for_a_host_name_names_the_entry():
    with pytest.raises(ShardMapError) as exc:
        ShardMap.from_dict(bad(lambda d: d["shards"][0].update(master=["x"])))
    assert str(exc.value) == ("bad shard map: shards[0].master must be a host name, "
                              "got a list")


def test_reload_keeps_the_last_good_map_whatever_the_new_file_holds(tmp_path, caplog):
    path = tmp_path / "map.json"
    path.write_text(json.dumps(GOOD))
    src = ShardMapSource(path, interval=0)
    bad_files = [json.dumps(bad(lambda d: d["shards"][0].update(master=["x"]))).encode(),
                 json.dumps(bad(lambda d: d.update(hosts={"a\nb": {}}))).encode(),
                 b"\xff\xfe not utf-8", b"[" * 100000, b"1" * 5000, b"", b"null"]
    for i, content in enumerate(bad_files, start=1):
        path.write_bytes(content)
        os.utime(path, ns=(time.time_ns(), time.time_ns() + i * 10**9))
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="sharding.shardmap"):
            assert src.current().version == 1 and src.current().master(600).name == "MySQL002A"
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 1 and "\n" not in lines[0], (i, lines)
        assert "keeping the previous shard map" in lines[0]


def test_hosts_may_ask_for_tls():
    doc = bad(lambda d: d["hosts"]["MySQL001A"].update(ssl_ca="/etc/ca.pem", ssl_verify=1))
    host = ShardMap.from_dict(doc).hosts["MySQL001A"]
    assert host.tls_args() == {"ssl_ca": "/etc/ca.pem", "ssl_verify_cert": True,
                               "ssl_verify_identity": True}
    assert ShardMap.from_dict(GOOD).hosts["MySQL001A"].tls_args() == {}
    for change, words in [({"ssl_ca": 5}, "hosts.MySQL001A.ssl_ca must be a path"),
                          ({"ssl_verify": 1}, "ssl_verify needs ssl_ca"),
                          ({"ssl_ca": "/a", "ssl_verify": "yes please"}, "0 or 1"),
                          ({"ssl_cert": "/c.pem"}, "go together")]:
        with pytest.raises(ShardMapError, match=words):
            ShardMap.from_dict(bad(lambda d, c=change: d["hosts"]["MySQL001A"].update(c)))
