"""Waiting for enqueued items (jobs.itemwait, ``farm enqueue --wait``): real Redis, real
workers; an item counts as finished only once no live job carries it."""

import json

import pytest
import redis

from jobs import enqueue_many
from jobs.itemwait import ItemWatch
from tests.conftest import run_farm
from tests.farmkit import start_workers, stop
from tests.ttykit import Tty


def _items(n: int, bad: int = 0, tag: str = "w") -> str:
    lines = [{"key": f"{tag}{i}", "value": -1 if i < bad else i} for i in range(n)]
    return "".join(json.dumps(x) + "\n" for x in lines)


def test_items_are_open_until_workers_run_them(env):
    conn = redis.Redis.from_url(env["FARM_REDIS_URL"])
    watch = ItemWatch(conn, "iw")
    items = [{"key": f"k{i}", "value": -1 if i == 0 else i} for i in range(30)]
    enqueue_many("iw", "tests.kinds.record", items, connection=conn, batch=7, on_ids=watch.add)
    watch.add(["never-enqueued"])   # no job carries it: finished at once, not failed
    first = watch.poll()
    assert (first.total, first.done, first.failed, first.finished) == (31, 1, 0, False)
    start_workers(env, 1, "--burst", "--queues", "iw").wait(timeout=60)
    last = watch.poll()
    assert (last.done, last.failed, last.finished) == (30, 1, True)
    assert conn.hlen("test:record") == 29  # an independent count of what the workers did


@pytest.mark.slow
def test_enqueue_wait_exits_1_naming_farm_failed(env):
    workers = start_workers(env, 1, "--queues", "ew")
    try:
        out = run_farm(env, "enqueue", "ew", "tests.kinds.record", "--file", "-", "--wait",
                       "--batch", "5", input=_items(40, bad=2), timeout=120)
    finally:
        stop(workers)
    assert out.returncode == 1, out.stderr
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    assert doc == {"enqueued": 40, "duplicates": 0, "done": 38, "failed": 2}
    assert "2 item(s) failed: 'farm failed'" in out.stderr


@pytest.mark.slow
def test_enqueue_wait_on_a_terminal_shows_items_finishing(env, tmp_path):
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(_items(25, tag="t"))
    tty = Tty(env, "enqueue", "tw", "tests.kinds.record", "--file", str(jobs), "--wait")
    tty.expect("0/25 items finished")     # nothing runs them yet
    workers = start_workers(env, 1, "--queues", "tw")
    try:
        assert tty.wait() == 0
    finally:
        stop(workers)
    assert "25/25 items finished" in tty.plain
    assert tty.plain.strip().splitlines()[-1] == ("enqueued 25 item(s) on tw (0 duplicate(s)); "
                                                  "25 done, 0 failed")


def test_wait_needs_dedup(env):
    out = run_farm(env, "enqueue", "x", "tests.kinds.record", "--file", "-", "--wait",
                   "--no-dedup", input="")
    assert out.returncode == 2 and "drop --no-dedup" in out.stderr
