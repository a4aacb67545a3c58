"""A ZooKeeper map source never outlives its use: every error while opening it closes its
kazoo client (whose threads otherwise keep running, reconnecting and logging), the farm's
runtime closes it even when something else fails to close, and no farm code runs on
kazoo's threads, which kazoo waits for at exit and in ``close()``: a reload guard that
hangs cannot keep a process from ending. Against a real ZooKeeper (``zk_server``)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import uuid

import pytest
from kazoo.client import KazooClient
from kazoo.security import make_digest_acl

from jobs.runtime import Runtime
from shardfarm.errors import ConfigError, ShardMapError
from sharding.mappublish import publish
from sharding.mapsource import open_source
from sharding.shardmap import demo_map_doc
from sharding.zkmap import parse_url
from tests.conftest import ROOT, run_farm
from tests.farmkit import until

KAZOO_THREADS = ("_thread_worker", "zk_loop")  # kazoo's callback workers and connection


def _doc(version: int) -> str:
    return json.dumps({**demo_map_doc(), "version": version})


def kazoo_threads() -> set[threading.Thread]:
    """The live threads that kazoo clients started."""
    return {t for t in threading.enumerate() if any(k in t.name for k in KAZOO_THREADS)}


def _no_new_kazoo_threads(before: set[threading.Thread]) -> None:
    until(lambda: not kazoo_threads() - before, timeout=15,
          what="the kazoo client's threads to end (the client was left open)")


@pytest.fixture
def url(zk_server) -> str:
    return zk_server.url(f"/close/{uuid.uuid4().hex}/map")


def _create(url: str, data: bytes, acl=None) -> KazooClient:
    """A started client that created the node of ``url`` with ``data``; stop it after."""
    owner = KazooClient(hosts=parse_url(url)[0], auth_data=[("digest", "owner:secret")])
    owner.start()
    owner.create(parse_url(url)[1], data, makepath=True, acl=acl)
    return owner


@pytest.mark.parametrize("data, error", [
    (b"\x00garbage{", "malformed JSON"),
    (b"[1, 2]", "bad shard map"),
    (json.dumps({**demo_map_doc(), "shards": [{"range": [0, 1], "master": "nobody",
                                                 "slave": "nobody"}]}).encode(),
     "unknown host"),
])
def test_a_bad_map_node_at_start_is_one_line_and_closes_the_client(url, data, error):
    owner = _create(url, data)
    try:
        before = kazoo_threads()
        with pytest.raises(ShardMapError, match=error) as caught:
            open_source(url, timeout=5)
        assert "\n" not in str(caught.value)
        _no_new_kazoo_threads(before)
    finally:
        owner.stop()
        owner.close()


def test_a_missing_node_and_an_acl_refusal_close_the_client(url):
    before = kazoo_threads()
    with pytest.raises(ShardMapError, match="farm shards publish"):
        open_source(url, timeout=5)
    _no_new_kazoo_threads(before)
    owner = _create(url, _doc(1).encode(), acl=[make_digest_acl("owner", "secret", all=True)])
    try:
        before = kazoo_threads()
        with pytest.raises(ConfigError, match="ACL"):
            open_source(url, timeout=5)
        _no_new_kazoo_threads(before)
    finally:
        owner.stop()
        owner.close()


def test_the_guard_runs_in_the_caller_never_on_kazoos_threads(url):
    publish(url, _doc(1))
    seen: list[str] = []

    def guard(old, new):
        seen.append(threading.current_thread().name)
        return None
    source = open_source(url, guard=guard)
    try:
        publish(url, _doc(2))
        until(lambda: source.current().version == 2, timeout=20, what="version 2")
        assert seen == [threading.current_thread().name], seen
    finally:
        source.close()


def test_a_process_whose_guard_hangs_still_exits(url):
    """A map published while a process holds the source open, never closed, and a guard that
    would hang if a watch ran it: before, kazoo's exit hook waited for the watch forever."""
    publish(url, _doc(1))
    script = textwrap.dedent(f"""
        import threading, time
        from sharding.mappublish import publish
        from sharding.mapsource import open_source
        entered = threading.Event()

        def guard(old, new):
            if threading.current_thread() is not threading.main_thread():
                entered.set()
                threading.Event().wait()  # a control database that never answers
            return None

        source = open_source({url!r}, guard=guard)
        publish({url!r}, {_doc(2)!r})
        while not (entered.is_set() or source.current().version == 2):
            time.sleep(0.05)
        print("applied" if not entered.is_set() else "guard ran on a kazoo thread", flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"the process did not exit: {out.strip()} {err.strip()[-300:]}")
    assert proc.returncode == 0 and out.strip() == "applied", (out, err)


def test_the_runtime_closes_the_source_even_when_a_pool_fails_to_close(settings, url,
                                                                       monkeypatch):
    publish(url, _doc(1))
    before = kazoo_threads()
    rt = Runtime(settings.with_(shardmap_url=url, shardmap_path=None))
    assert rt.router.shardmap.version == 1 and kazoo_threads() - before

    def broken() -> None:
        raise RuntimeError("a pool that fails to close")
    monkeypatch.setattr(rt.router, "close", broken)
    with pytest.raises(RuntimeError, match="fails to close"):
        rt.close()
    _no_new_kazoo_threads(before)


def test_farm_with_a_garbage_map_node_is_one_line(url, farm_env):
    owner = _create(url, b"not json")
    try:
        out = run_farm({**farm_env, "FARM_SHARDMAP": url}, "shards", "show", timeout=60)
    finally:
        owner.stop()
        owner.close()
    assert out.returncode == 1 and out.stderr.count("\n") == 1, out
    assert out.stderr.startswith(f"farm: error: {url}: malformed JSON"), out.stderr
