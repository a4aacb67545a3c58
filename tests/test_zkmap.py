"""The shard map in a real ZooKeeper: read, watched, switched, published with compare-and-set."""

from __future__ import annotations

import json
import uuid

import pytest
from kazoo.client import KazooClient
from kazoo.security import make_acl, make_digest_acl

from shardfarm.errors import ConfigError, ShardMapError, StaleStateError
from sharding.mappublish import publish
from sharding.mapsource import open_source
from sharding.shardmap import demo_map_doc
from sharding.zkmap import ZkStore, parse_url
from tests.conftest import run_farm
from tests.farmkit import until


def _doc(version: int, master: str = "MySQL001A") -> str:
    doc = demo_map_doc()
    doc["version"] = version
    doc["shards"][0]["master"] = master
    return json.dumps(doc)


@pytest.fixture
def url(zk_server) -> str:
    return zk_server.url(f"/t/{uuid.uuid4().hex}/map")


def test_a_missing_node_says_to_publish_one(url):
    with pytest.raises(ShardMapError, match="farm shards publish"):
        open_source(url)


def test_a_bad_url_and_a_dead_server_are_one_line_config_errors():
    with pytest.raises(ConfigError, match="zk://host:port/path"):
        parse_url("zk://127.0.0.1:2181")
    from tests.servers import free_port
    with pytest.raises(ConfigError, match="does not answer"):
        open_source(f"zk://127.0.0.1:{free_port()}/map", timeout=1)


@pytest.mark.parametrize(("url", "says"), [
    ("zk://127.0.0.1:abc/map", "Port could not be cast to integer value as 'abc'"),
    ("zk://127.0.0.1:99999/map", "Port out of range 0-65535"),
    ("zk://[::1/map", "Invalid IPv6 URL")])
def test_a_host_list_kazoo_cannot_read_is_one_line_before_connecting(farm_env, url, says):
    """A port that is not a number or out of range, an unclosed IPv6 bracket: kazoo's
    ``ValueError`` came out of ``farm`` as a traceback."""
    with pytest.raises(ConfigError, match="expected zk://host:port") as err:
        parse_url(url)
    assert says in str(err.value)
    out = run_farm({**farm_env, "FARM_SHARDMAP": url}, "shards", "show", timeout=60)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("farm: error: bad FARM_SHARDMAP") and says in line, line


def test_a_watching_source_switches_to_each_published_version(url):
    publish(url, _doc(1))
    source = open_source(url)
    try:
        assert source.current().version == 1
        publish(url, _doc(2, master="MySQL001B"))
        m = until(lambda: source.current().version == 2 and source.current(), timeout=20,
                  what="the watch to deliver version 2")
        assert m.shard_range(0).master == "MySQL001B"
    finally:
        source.close()


def test_a_stale_or_skipping_version_is_refused_in_one_line(url):
    publish(url, _doc(1))
    for v in (1, 3):
        with pytest.raises(StaleStateError, match="publish version 2") as exc:
            publish(url, _doc(v))
        assert "\n" not in str(exc.value)
    publish(url, _doc(2))


def test_an_invalid_map_is_never_written(url):
    publish(url, _doc(1))
    bad = json.loads(_doc(2))
    bad["shards"][0]["master"] = "nobody"
    with pytest.raises(ShardMapError, match="unknown host"):
        publish(url, json.dumps(bad))
    store = ZkStore(url)
    try:
        assert json.loads(store.load()[0])["version"] == 1
    finally:
        store.close()


def test_of_two_publishers_that_read_the_same_version_one_is_refused(url):
    publish(url, _doc(1))
    first, second = ZkStore(url), ZkStore(url)
    try:
        _, stamp1 = first.load()
        _, stamp2 = second.load()
        first.write(_doc(2), stamp1)
        with pytest.raises(StaleStateError, match=r"published .* meanwhile"):
            second.write(_doc(2, master="MySQL001B"), stamp2)
    finally:
        first.close()
        second.close()


def test_a_guard_holds_a_new_version_back(url):
    publish(url, _doc(1))
    calls = []

    def guard(old, new):
        calls.append(new.version)
        return "a run is active"
    source = open_source(url, guard=guard)
    try:
        publish(url, _doc(2))
        # the watch only keeps the new data: the reader offers it to the guard
        until(lambda: source.current() and calls, timeout=20, what="the guard to be asked")
        assert source.current().version == 1
    finally:
        source.close()


def test_a_node_deleted_and_published_again_is_picked_up(url):
    """A map node deleted (by hand, a lost ensemble) and published again restarts its
    ZooKeeper version at 0: a watcher that compared node versions kept the old map."""
    publish(url, _doc(1))
    source = open_source(url)
    store = ZkStore(url)
    try:
        store.client.delete(store.node)
        publish(url, _doc(2, master="MySQL001B"))  # node version 0 again, as the first was
        source.refresh()  # the node read now (the watch may deliver it first: same result)
        assert source.current().version == 2
        assert source.current().shard_range(0).master == "MySQL001B"
    finally:
        store.close()
        source.close()


def test_a_node_its_acl_keeps_from_us_is_one_line(url):
    """A map node whose ACL lets this process not read (or not write) it: one line naming
    the node and the ACL, for the watcher and for ``farm shards publish`` (before: a
    kazoo NoAuthError traceback)."""
    owner = KazooClient(hosts=parse_url(url)[0], auth_data=[("digest", "owner:secret")])
    owner.start()
    try:
        node = parse_url(url)[1]
        owner.create(node, _doc(1).encode(), makepath=True,
                     acl=[make_digest_acl("owner", "secret", all=True)])
        with pytest.raises(ConfigError, match=r"refuses to let this process read .* ACL"):
            open_source(url)
        with pytest.raises(ConfigError, match=r"refuses to let this process read .* ACL"):
            publish(url, _doc(2))
        owner.set_acls(node, [make_digest_acl("owner", "secret", all=True),
                              make_acl("world", "anyone", read=True)])
        source = open_source(url)
        assert source.current().version == 1
        source.close()
        with pytest.raises(ConfigError, match=r"refuses to let this process write .* ACL"):
            publish(url, _doc(2))
    finally:
        owner.stop()
        owner.close()


def test_a_dead_zookeeper_is_one_line_from_the_command(farm_env):
    """Before, 'farm shards show' against a ZooKeeper that does not answer printed a kazoo
    WARNING per retry (nine lines in 10 s) before its one error line."""
    from tests.conftest import run_farm
    from tests.servers import free_port
    port = free_port()
    out = run_farm({**farm_env, "FARM_SHARDMAP": f"zk://127.0.0.1:{port}/map",
                    "FARM_CONNECT_TIMEOUT": "3"}, "shards", "show", timeout=60)
    assert (out.returncode, out.stdout) == (1, ""), out
    assert out.stderr.splitlines() == [
        f"farm: error: ZooKeeper 127.0.0.1:{port} does not answer within 3 s (FARM_SHARDMAP "
        f"zk://127.0.0.1:{port}/map)"]
