"""Real `farm workers` against whatever anyone can write into Redis: nothing foreign runs,
nothing foreign is imported, and every refused job is listed by `farm failed`."""

from __future__ import annotations

import json
import signal
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis
from rq import Callback, Queue, Worker
from rq.exceptions import StopRequested
from rq.registry import StartedJobRegistry, clean_registries
from rq.serializers import JSONSerializer

from jobs import enqueue_many
from jobs.queue import rq_queue
from shardfarm.settings import Settings
from tests.conftest import run_farm
from tests.farmkit import output, spawn, start_workers, stop, until
from tests.servers import PrivateRedis, free_port
from workers.maintenance import promote_scheduled
from workers.worker import IDLE_BOOKKEEPING_SECONDS, build

ITEMS = [["i1", {"key": "a", "value": 1}]]


@pytest.fixture
def env(farm_env, ledger, tmp_path):
    e = {**farm_env, "FARM_TEST_IMPORT_MARKER": str(tmp_path / "imported")}
    redis.Redis.from_url(e["FARM_REDIS_URL"]).flushdb()
    yield e
    redis.Redis.from_url(e["FARM_REDIS_URL"]).flushdb()


@pytest.fixture
def conn(env):
    return redis.Redis.from_url(env["FARM_REDIS_URL"])


def _failed(env) -> list[dict]:
    out = run_farm(env, "failed", "--json")
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    return [r for r in rows if "where" in r]  # items and jobs (chunks of other tests' runs too)


def test_enqueue_refuses_a_function_outside_the_allow_list_in_one_line(env, conn, tmp_path):
    out = run_farm(env, "enqueue", "farm", "os.system", "--file", "-",
                   input=json.dumps({"command": f"touch {tmp_path / 'ran'}"}))
    assert out.returncode == 1 and "not allowed" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
    assert not conn.exists("rq:queue:farm")


@pytest.mark.slow
def test_workers_never_run_or_import_what_is_written_into_redis(env, conn, tmp_path):
    """A raw rq job of any function, a farm batch of a forbidden function, a farm batch that
    names a callback, a pickle, and a dead worker's job whose failure callback names a
    module: none runs, no module outside the list is imported, each is in `farm failed`."""
    ran = tmp_path / "ran"
    q = Queue("farm", connection=conn, serializer=JSONSerializer)
    q.enqueue("os.system", f"touch {ran}-os")
    q.enqueue("tests.evil_import.run", "x")
    q.enqueue("jobs.items.run_items", function="subprocess.getoutput",
              items=[["g1", {"cmd": f"touch {ran}-getoutput"}]])
    q.enqueue("jobs.items.run_items", function="tests.evil_import.run", items=ITEMS)
    q.enqueue("jobs.items.run_items", function="tests.kinds.record",
              items=[["c1", {"key": "c", "value": 3}]],
              on_success=Callback("tests.evil_import.run"))
    pickled = Queue("farm", connection=conn).enqueue("os.system", f"touch {ran}-pickle")
    dead = q.enqueue("jobs.items.run_items", function="tests.kinds.record",
                     items=[["d1", {"key": "d", "value": 4}]],
                     on_failure=Callback("tests.evil_import.run"))
    q.remove(dead.id)  # as if a worker took it and died: STARTED, heartbeat long expired
    conn.hset(dead.key, "status", "started")
    conn.zadd(StartedJobRegistry("farm", connection=conn).key, {f"{dead.id}:x": time.time() - 60})
    proc = start_workers(env, 1)
    try:
        until(lambda: len(_failed(env)) >= 7, timeout=60, what="seven refusals in farm failed")
    finally:
        out = stop(proc)
    assert not list(tmp_path.glob("ran*")), "a foreign function ran"
    assert not (tmp_path / "imported").exists(), "a module outside the list was imported"
    failed = {f["where"].split()[-1]: f for f in _failed(env)}
    assert f"{pickled.id}" in failed and "not JSON" in failed[pickled.id]["last_error"]
    reasons = " | ".join(f["last_error"] for f in failed.values())
    assert "not the farm's entry point" in reasons and "not allowed" in reasons
    assert "callback" in reasons and "AbandonedJobError" in reasons
    assert failed["g1"]["args"] == {"cmd": f"touch {ran}-getoutput"}
    assert conn.hlen("test:record") == 0 and "Traceback" not in out


@pytest.mark.slow
def test_status_names_every_worker_host(env, conn):
    proc = start_workers(env, 1)
    try:
        until(lambda: Worker.count(connection=conn) == 1, what="a worker")
        for key in conn.smembers("rq:workers"):  # rq's record loses the host (seen as '?')
            conn.hdel(key, "hostname")
        out = run_farm(env, "status", "--json")
    finally:
        stop(proc)
    workers = json.loads(out.stdout)["workers"]
    assert list(workers) == [socket.gethostname()] and "?" not in workers


@pytest.mark.slow
def test_a_scale_target_that_overrides_count_is_said(env, conn):
    assert run_farm(env, "scale", "2").returncode == 0
    proc = start_workers(env, 1)
    try:
        until(lambda: Worker.count(connection=conn) == 2, what="two workers (the target)")
    finally:
        out = stop(proc)
        run_farm(env, "scale", "--clear")
    said = [line for line in out.splitlines() if "overridden" in line]
    assert len(said) == 1 and "--count 1" in said[0] and "2 workers" in said[0]


@pytest.mark.slow
def test_workers_started_before_shards_init_say_so_once_and_wait(env, conn):
    env = {**env, "FARM_CONTROL_DSN": env["FARM_CONTROL_DSN"] + "_not_made_yet"}
    proc = start_workers(env, 1)
    try:
        until(lambda: Worker.count(connection=conn) == 1, what="a worker")
        time.sleep(7)  # two more housekeeping rounds (every 3 s) that fail the same way
        assert proc.poll() is None and Worker.count(connection=conn) == 1  # still waiting
    finally:
        out = stop(proc)
    said = [line for line in out.splitlines() if "farm shards init" in line]
    assert len(said) == 1 and "Traceback" not in out, out
    assert "_not_made_yet" in said[0] or "1049" in said[0]


def _work_restoring_signals(worker) -> None:
    """``worker.work(burst=True)`` here (rq installs its signal handlers: put back after)."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        worker.work(burst=True, with_scheduler=False)
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


def test_a_worker_rq_ended_on_an_error_exits_1_not_0(env, conn, monkeypatch):
    """rq logs an exception nothing handled (here one raised as a job is taken up, outside
    the job), ends its loop and returns as if it had ended well: the worker exited 0, and a
    burst whose worker quit so, its job not done, exited 0. A burst that found no job left,
    and a worker asked to stop, end 0."""
    settings = Settings.from_env(env)
    for stop_asked in (False, True):  # True: a warm stop came while the job ran
        rq_queue(conn, "unhandled").enqueue("builtins.print", "never run")
        worker = build(settings, ["unhandled"])

        def broken(job, queue, w=worker, asked=stop_asked) -> None:
            w.ended_as_asked = asked
            raise RuntimeError("a fault outside any job")
        monkeypatch.setattr(worker, "_execute", broken)
        _work_restoring_signals(worker)
        assert worker.exit_status() == 1, stop_asked
    worker = build(settings, ["unhandled"])  # the queue is empty now
    _work_restoring_signals(worker)
    assert worker.exit_status() == 0
    worker = build(settings, ["unhandled"])
    with pytest.raises(StopRequested):
        worker.request_stop(signal.SIGTERM, None)
    assert worker.exit_status() == 0


@contextmanager
def _worker_of(env: dict, server: PrivateRedis) -> Iterator:
    """A worker process of queue ``ro`` on ``server``; killed after the block if it still
    runs, and the server stopped."""
    proc = spawn([sys.executable, "-m", "workers.worker", "--queues", "ro"],
                 {**env, "FARM_REDIS_URL": server.url()})
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        server.stop()


def _stopped_with_one_unrecorded_end(proc, says: str) -> None:
    """Stop the worker: exit 1 (a job's end went unrecorded), no traceback, one line of it."""
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 1, output(proc)
    out = output(proc)
    assert "Traceback" not in out, out
    (line,) = [ln for ln in out.splitlines() if "its end may not be recorded" in ln]
    assert says in line and "delivers it again" in line, line


def _outlast_the_suspension_check() -> None:
    """Keep the held job running past the worker's 2 s skip of rq's suspension check, so
    that after the job that check meets the outage too (a job shorter than that never did)."""
    time.sleep(IDLE_BOOKKEEPING_SECONDS + 0.5)


def test_a_job_that_ends_while_redis_refuses_writes_leaves_the_worker_running(env, tmp_path):
    """A job ends while Redis refuses writes (a failover's demoted master): rq cannot record
    its end, and used to quit with a traceback. Now the worker says so in one line and waits
    out the refusal as a dequeue does; once Redis takes writes it takes the next job, and
    the job that ended unrecorded is delivered again by rq's registry cleanup (housekeeping),
    not lost. Its exit status then says a job's end went unrecorded (1)."""
    server = PrivateRedis.start()
    with _worker_of(env, server) as proc:
        conn = redis.Redis.from_url(server.url())
        first, second = tmp_path / "first", tmp_path / "second"
        runs = lambda gate: len(Path(f"{gate}.held").read_text().splitlines())  # noqa: E731
        enqueue_many("ro", "tests.kinds.gated", [{"gate": str(first)}], connection=conn)
        until(lambda: Path(f"{first}.held").exists(), timeout=60, what="the first job")
        conn.execute_command("REPLICAOF", "127.0.0.1", str(free_port()))
        _outlast_the_suspension_check()
        Path(f"{first}.go").touch()
        until(lambda: "Redis refuses writes" in output(proc), timeout=30,
              what="the worker to meet the refusal")
        assert proc.poll() is None, output(proc)
        conn.execute_command("REPLICAOF", "NO", "ONE")
        queue = rq_queue(conn, "ro")  # housekeeping, once the job's heartbeat expired (15 s)
        until(lambda: clean_registries(queue) or promote_scheduled(conn, queue)
              or runs(first) == 2, timeout=60, what="the unrecorded job to be delivered again")
        enqueue_many("ro", "tests.kinds.gated", [{"gate": str(second)}], connection=conn)
        Path(f"{second}.go").touch()
        until(lambda: Path(f"{second}.held").exists(), timeout=60, what="the next job")
        _stopped_with_one_unrecorded_end(proc, "refuses writes")
        assert runs(first) == 2 and runs(second) == 1


def test_a_job_that_ends_while_redis_is_down_leaves_the_worker_running(env, tmp_path):
    """A job ends while Redis does not answer (stopped, restarted empty on the same port):
    one line, the worker waits for Redis and then takes the next job (rq quit with a
    traceback)."""
    server = PrivateRedis.start()
    with _worker_of(env, server) as proc:
        first, second = tmp_path / "first", tmp_path / "second"
        enqueue_many("ro", "tests.kinds.gated", [{"gate": str(first)}],
                     connection=redis.Redis.from_url(server.url()))
        until(lambda: Path(f"{first}.held").exists(), timeout=60, what="the first job")
        server.stop()
        _outlast_the_suspension_check()
        Path(f"{first}.go").touch()
        until(lambda: "Redis does not answer" in output(proc), timeout=30,
              what="the worker to find Redis gone")
        assert proc.poll() is None, output(proc)
        server.proc = PrivateRedis.start(port=server.port).proc  # stopped with the block
        enqueue_many("ro", "tests.kinds.gated", [{"gate": str(second)}],
                     connection=redis.Redis.from_url(server.url()))
        Path(f"{second}.go").touch()
        until(lambda: Path(f"{second}.held").exists(), timeout=60, what="the next job")
        _stopped_with_one_unrecorded_end(proc, "does not answer")


def test_a_worker_stopped_while_redis_refuses_writes_says_so_in_one_line(env):
    """A warm stop while Redis refuses writes (a failover's demoted master, here a replica of
    a master that is not there): rq's teardown cannot unregister the worker. It used to end
    in a traceback out of ``work()``; now one line names Redis, exit 1 (its registration
    expires with its TTL)."""
    server = PrivateRedis.start()
    with _worker_of(env, server) as proc:
        conn = redis.Redis.from_url(server.url())
        # idle: past rq's start-up writes (outside any error handling), in its dequeue
        until(lambda: [w.get_state() for w in Worker.all(connection=conn)] == ["idle"],
              timeout=60, what="the worker to wait for a job")
        conn.execute_command("REPLICAOF", "127.0.0.1", str(free_port()))
        until(lambda: "Redis refuses writes" in output(proc), timeout=30,
              what="the worker to meet the refusal")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 1, output(proc)
    out = output(proc)
    assert "Traceback" not in out, out
    (line,) = [ln for ln in out.splitlines() if "could not register or unregister" in ln]
    assert server.url() in line or f":{server.port}" in line, line
