"""The supervisor's own promises (``workers/supervisor.py``): a burst whose worker ends badly
exits 1 and names it; a burst that ran a chunk, item or job that failed (or left one to try
again) exits 1 and says how many, counting only what it ran; a worker that fails as it starts
is restarted after a growing pause, not in a loop, while a killed one is replaced at once;
``--burst --count 0`` is refused."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time

import pytest
import redis
from rq import Worker

from farmcore import keys
from farmcore.ledger import ChunkSpec
from jobs import enqueue_many, runs
from shardfarm.errors import FarmError
from tests.conftest import park_unfinished_runs, run_farm
from tests.farmkit import children, output, start_workers, stop, until
from tests.servers import PrivateRedis, free_port
from workers import burst, maintenance, supervisor
from workers.supervisor import MAX_RESPAWN_PAUSE, MAX_WORKERS, Supervisor


def test_a_burst_of_no_workers_is_a_usage_error(farm_env):
    out = run_farm(farm_env, "workers", "--burst", "--count", "0", timeout=60)
    assert (out.returncode, out.stdout) == (2, ""), out
    assert out.stderr.splitlines() == [
        "farm: error: --burst with --count 0 would run nothing (give --count 1 or more) (see "
        "'farm workers --help')"]


@pytest.mark.usefixtures("park_leftover_runs")
def test_workers_on_a_queue_no_job_was_ever_queued_on_say_so(farm_env):
    """A typo in --queues used to wait silently for ever."""
    out = run_farm(farm_env, "workers", "--burst", "--count", "1", "--queues",
                   "farm,farmm", timeout=120)
    notes = [line for line in out.stderr.splitlines() if line.startswith("farm: note: no job")]
    assert notes == ["farm: note: no job was ever queued on 'farmm' here: these workers wait until "
                     "one is (check --queues; 'farm status' lists the queues in use)"], out.stderr
    out = run_farm(farm_env, "workers", "--burst", "--count", "1", "--queues", "farm",
                   timeout=120)
    assert "no job was ever queued" not in out.stderr, out.stderr


@pytest.mark.usefixtures("park_leftover_runs")
def test_a_burst_whose_worker_is_killed_mid_chunk_exits_1_naming_it(rt, env):
    """Before, the supervisor saw no worker left and exited 0: a burst that did not finish
    its work looked like one that did."""
    run_id = runs.start(rt, "test", "tests.kinds.sleepy", [ChunkSpec("nap", {"seconds": 300})])
    park_unfinished_runs(rt.ledger, keep={run_id})  # the worker takes this run's chunk
    proc = start_workers(env, 1, "--burst")
    try:
        until(lambda: rt.ledger.chunk(run_id, 0)["state"] == "running", timeout=60,
              what="the worker to claim the chunk")
        (worker,) = children(proc.pid)
        os.kill(worker, signal.SIGKILL)
        assert proc.wait(timeout=60) == 1
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    lines = [x for x in output(proc).splitlines() if x.startswith("farm: error:")]
    assert lines == [f"farm: error: 1 worker(s) ended badly (pid {worker}: killed by SIGKILL); "
                     "a chunk one held is taken over when its lease expires ('farm status', "
                     "'farm failed')"], output(proc)


def _burst(env: dict) -> tuple[int, list[str]]:
    """A real ``farm workers --count 1 --burst``: its exit code and its error lines."""
    proc = start_workers(env, 1, "--burst")
    try:
        code = proc.wait(timeout=120)
    finally:
        out = stop(proc)
    return code, [x for x in out.splitlines() if x.startswith("farm: error:")]


@pytest.mark.usefixtures("park_leftover_runs")
def test_a_burst_that_ran_failing_work_exits_1_counting_only_its_own(rt, env):
    """Before, a burst exited 0 whatever the chunks and items it ran did: a script running
    'farm workers --burst' took a burst that failed its work for one that did it."""
    run_id = runs.start(rt, "test", "tests.kinds.explode", [ChunkSpec("bad", {"fatal": True})])
    park_unfinished_runs(rt.ledger, keep={run_id})  # the burst runs this run's chunk only
    enqueue_many("farm", "tests.kinds.record", [{"key": "good", "value": 1},
                                                {"key": "bad", "value": -1}],
                 connection=rt.redis, id_key="key")
    code, errors = _burst(env)
    assert code == 1 and errors == [
        "farm: error: of what this burst ran, 1 chunk and 1 item failed ('farm failed' lists "
        "them)"], errors
    assert rt.ledger.chunk(run_id, 0)["state"] == "failed"
    assert rt.redis.hgetall("test:record") == {b"good": b"1"}
    # the next burst does only good work: what failed before it is not its own
    enqueue_many("farm", "tests.kinds.record", [{"key": "fine", "value": 2}],
                 connection=rt.redis, id_key="key")
    assert _burst(env) == (0, [])
    assert rt.redis.hget("test:record", "fine") == b"2"
    assert rt.redis.hexists("farm:failed:farm", "bad")  # still listed by 'farm failed'


@pytest.mark.usefixtures("park_leftover_runs")
def test_a_burst_that_leaves_a_chunk_to_try_again_exits_1_saying_so(rt, env):
    """A chunk whose attempt failed (a transient error) is pending again, its next attempt
    scheduled after a backoff: the burst ended with its work not done."""
    run_id = runs.start(rt, "test", "tests.kinds.explode", [ChunkSpec("bad", {"fatal": False})])
    park_unfinished_runs(rt.ledger, keep={run_id})
    code, errors = _burst(env)
    chunk = rt.ledger.chunk(run_id, 0)
    assert (chunk["state"], chunk["attempts"]) == ("pending", 1)
    assert code == 1 and errors == [
        "farm: error: of what this burst ran, 1 chunk failed an attempt and waits to be tried "
        "again after this burst ('farm status' shows what is pending)"], errors


def test_a_burst_counts_what_did_not_succeed_last_time_it_ran(rt, monkeypatch):
    """What a worker of the burst notes after each job: a thing that failed an attempt and
    then succeeded within the burst is not counted; the line names each kind."""
    key = burst.new_key("test:1")
    monkeypatch.setenv(burst.ENV_KEY, key)
    burst.record(rt.redis, {"r/0": ("chunk", "retrying"), "r/1": ("chunk", "failed"),
                            "a": ("item", "failed"), "b": ("item", "failed"),
                            "job:j": ("job", "failed"), "c": ("item", "retrying")})
    burst.record(rt.redis, {"r/0": ("chunk", "done"), "job:k": ("job", "done")})
    counts = burst.count(rt.redis, key)
    assert burst.summary_line(counts, key) == (
        "of what this burst ran, 1 chunk, 2 items and 1 job failed ('farm failed' lists "
        "them); 1 item failed an attempt and waits to be tried again after this burst "
        "('farm status' shows what is pending)")
    burst.record(rt.redis, {k: ("item", "done") for k in ("r/1", "a", "b", "job:j", "c")})
    assert burst.summary_line(burst.count(rt.redis, key), key) is None
    rt.redis.set(key, "not a hash")
    assert "is not a hash" in burst.summary_line(burst.count(rt.redis, key), key)


def test_a_burst_outcome_redis_refuses_to_note_is_not_taken_for_a_success(monkeypatch):
    """A Redis that refuses writes (here a replica) when a worker notes a failed chunk: the
    error ends the worker (its burst exits 1), where it used to be logged as "not a hash"
    and the burst, counting nothing, exited 0."""
    server = PrivateRedis.start()
    try:
        conn = redis.Redis.from_url(server.url())
        monkeypatch.setenv(burst.ENV_KEY, burst.new_key("test:1"))
        conn.execute_command("REPLICAOF", "127.0.0.1", str(free_port()))
        with pytest.raises(redis.exceptions.ReadOnlyError):
            burst.record(conn, {"r/1": ("chunk", "failed")})
    finally:
        server.stop()


def test_a_burst_count_redis_refuses_to_read_is_an_outage_not_a_foreign_key():
    """A replica cut off from its master that serves no stale data (``MASTERDOWN``) when the
    burst counts what its workers noted: an outage to wait out, where it used to be read as
    a key something else wrote (exit 1, "cannot tell")."""
    server = PrivateRedis.start()
    try:
        conn = redis.Redis.from_url(server.url())
        key = burst.new_key("test:1")
        conn.hset(key, "r/1", "chunk:failed")
        conn.config_set("replica-serve-stale-data", "no")
        conn.execute_command("REPLICAOF", "127.0.0.1", str(free_port()))
        with pytest.raises(redis.exceptions.MasterDownError):
            burst.count(conn, key)
    finally:
        server.stop()


def _ended(sup: Supervisor, *code: str, ran_for: float = 0.0) -> subprocess.Popen:
    """A real child of ``sup`` that ran ``code`` and has exited, reaped by ``sup``
    (``ran_for``: seconds it is taken to have run before it ended)."""
    child = subprocess.Popen([sys.executable, "-c", "\n".join(code)])
    sup._started[child.pid] = time.monotonic() - ran_for
    sup.children.append(child)
    child.wait(timeout=30)
    sup.alive()
    return child


def test_a_worker_that_fails_as_it_starts_is_restarted_after_a_growing_pause(settings):
    sup = Supervisor(settings, 1, ["farm"])
    first = _ended(sup, "raise SystemExit(1)")
    assert sup.ended_badly == [f"pid {first.pid}: exit code 1"]
    pause = sup._spawn_after - time.monotonic()
    assert 1 < pause <= 2
    sup.converge()
    assert sup.children == []  # not restarted during the pause
    _ended(sup, "raise SystemExit(3)")
    assert 2 < sup._spawn_after - time.monotonic() <= 4  # the pause grows
    for _ in range(10):
        _ended(sup, "raise SystemExit(1)")
    assert sup._spawn_after - time.monotonic() <= MAX_RESPAWN_PAUSE  # up to a bound


def test_a_worker_that_fails_long_after_it_started_resets_the_growing_pause(settings):
    """A worker that had started well and then exited 1 (rq ended its loop on an error) is
    not a failure to start: the next failure to start pauses 2 s again, not 2**n s."""
    sup = Supervisor(settings, 1, ["farm"])
    for _ in range(3):
        _ended(sup, "raise SystemExit(1)")
    _ended(sup, "raise SystemExit(1)", ran_for=supervisor.FAST_FAIL + 1)
    _ended(sup, "raise SystemExit(1)")
    assert 1 < sup._spawn_after - time.monotonic() <= 2


def test_no_worker_is_started_while_redis_is_out(settings, monkeypatch):
    """A worker started while Redis does not answer or refuses writes exits at once (rq
    registers it in Redis first): the supervisor waits for the outage's end instead of
    starting workers that fail and pausing as for a worker that cannot start."""
    sup = Supervisor(settings, 2, ["farm"])
    started: list[int] = []
    monkeypatch.setattr(sup, "spawn", lambda: started.append(1))
    try:
        sup.redis.since = time.monotonic()
        sup.converge()
        assert started == []
        sup.redis.since = None
        sup.converge()
        assert started == [1, 1]
    finally:
        sup.rt.close()


def test_a_worker_that_crashes_as_it_starts_is_restarted_after_a_pause(settings):
    """A crash signal (an abort, a segfault in an extension at import) soon after start is a
    failure to start like an error exit: before, such a worker was restarted every tick."""
    sup = Supervisor(settings, 1, ["farm"])
    crashed = _ended(sup, "import os", "os.abort()")
    assert sup.ended_badly == [f"pid {crashed.pid}: killed by SIGABRT"]
    assert 1 < sup._spawn_after - time.monotonic() <= 2
    sup.converge()
    assert sup.children == []  # not restarted during the pause


def test_a_killed_worker_is_replaced_at_once(settings):
    sup = Supervisor(settings, 1, ["farm"])
    killed = _ended(sup, "import os, signal", "os.kill(os.getpid(), signal.SIGKILL)")
    assert sup.ended_badly == [f"pid {killed.pid}: killed by SIGKILL"]
    assert sup._spawn_after <= time.monotonic()
    fine = _ended(sup, "pass")
    assert fine.returncode == 0 and len(sup.ended_badly) == 1


def test_a_worker_killed_by_a_signal_without_a_name_is_noted_not_a_crash(settings):
    """signal.Signals has no member for most real-time signals: the supervisor raised
    ValueError while reaping such a worker (its loop, or a stop signal's handler, died)."""
    sup = Supervisor(settings, 1, ["farm"])
    rt_signal = signal.SIGRTMIN + 6
    child = _ended(sup, "import os", f"os.kill(os.getpid(), {int(rt_signal)})")
    assert sup.ended_badly == [f"pid {child.pid}: killed by signal {int(rt_signal)}"]
    assert sup.children == []


def test_a_long_running_supervisor_notes_a_bounded_number_of_bad_ends(settings):
    """Every worker that ended badly was kept as a line for as long as the supervisor ran:
    memory that grew with each crash of a worker restarted for months."""
    sup = Supervisor(settings, 1, ["farm"])
    child = _ended(sup, "raise SystemExit(1)")
    for _ in range(MAX_WORKERS + 10):
        sup._reaped(child)
    assert len(sup.ended_badly) == MAX_WORKERS


def _group(pgid: int) -> list[int]:
    """PIDs still running in process group ``pgid``."""
    out = subprocess.run(["ps", "-o", "pid=", "-g", str(pgid)], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def test_a_control_database_that_refuses_the_supervisor_leaves_no_worker_behind(env):
    """Before, the supervisor started its workers, then met the refusal (a wrong password in
    FARM_CONTROL_DSN), printed it and exited 1: its worker ran on, unsupervised."""
    dsn = env["FARM_CONTROL_DSN"].replace("mysql://root@", "mysql://root:wrong-pw@")
    proc = start_workers({**env, "FARM_CONTROL_DSN": dsn}, 1)
    try:
        assert proc.wait(timeout=60) == 1, output(proc)
        time.sleep(1)  # a worker it started would be running now
        assert _group(proc.pid) == [], output(proc)
    finally:
        if _group(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
    errors = [x for x in output(proc).splitlines() if x.startswith("farm: error:")]
    assert len(errors) == 1 and "check FARM_CONTROL_DSN" in errors[0], output(proc)
    assert "wrong-pw" not in output(proc)


def test_a_supervisor_that_exits_on_an_error_stops_its_workers(settings):
    """An error the loop cannot handle (here a Redis reply it cannot take to the heartbeat)
    ended the supervisor and left every worker it had started running."""
    sup = Supervisor(settings, 1, ["farm"])

    def refused() -> None:
        raise redis.ResponseError("OOM command not allowed when used memory > 'maxmemory'")

    sup.report = refused  # type: ignore[method-assign]
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1,
                                              signal.SIGUSR2)}
    try:
        with pytest.raises(redis.ResponseError):
            sup.run()
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
        left = [c for c in sup.children if c.poll() is None]
        for c in left:
            c.kill()
    assert sup.children and left == []


def test_a_shard_map_the_supervisor_cannot_read_stops_it_in_one_line(env, tmp_path):
    """Before, 'farm workers' with FARM_SHARDMAP naming a missing file ran on without a word;
    its workers claimed chunks and left them 'running' (a burst exited 0)."""
    gone = tmp_path / "gone.json"
    proc = start_workers({**env, "FARM_SHARDMAP": str(gone)}, 1)
    try:
        assert proc.wait(timeout=30) == 1, output(proc)
    finally:
        if _group(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
    assert output(proc).splitlines() == [
        f"farm: error: cannot read shard map {gone}: No such file or directory"]


def _run_restoring_signals(sup: Supervisor) -> int:
    """``sup.run()``, the process's signal handlers put back after it."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1,
                                              signal.SIGUSR2)}
    try:
        return sup.run()
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


def test_an_error_during_a_warm_stop_does_not_cut_the_workers_chunks_short(settings):
    """The workers were told to finish their chunks and stop; an error then (a Redis reply
    the heartbeat cannot take) used to send them a second signal, which rq's workers take as
    'stop now', and kill them 3 s later."""
    sup = Supervisor(settings, 1, ["farm"])
    stopped: list[int] = []
    sup._stop_children = lambda: stopped.append(1)  # type: ignore[method-assign]

    def stop_then_refused() -> None:
        sup._on_stop(signal.SIGTERM, None)  # the warm stop reaches the worker
        raise redis.ResponseError("OOM command not allowed when used memory > 'maxmemory'")

    sup.report = stop_then_refused  # type: ignore[method-assign]
    with pytest.raises(redis.ResponseError):
        _run_restoring_signals(sup)
    assert sup.children and stopped == []
    for child in sup.children:  # it ends by itself, on the warm stop
        assert child.wait(timeout=60) is not None


def test_a_stop_asked_during_the_burst_checks_starts_no_worker(settings):
    """A Ctrl-C while the supervisor checked the shard map (a slow ZooKeeper, say) was
    ignored: the burst's workers started after it and ran to the end."""
    sup = Supervisor(settings, 2, ["farm"], burst=True)
    sup.rt.router.source.current = lambda: sup._on_stop(signal.SIGINT, None)
    started: list[int] = []
    sup.spawn = lambda: started.append(1)  # type: ignore[method-assign]
    _run_restoring_signals(sup)
    assert started == []


class _Outage:
    """A private Redis for an in-process supervisor, and a script run one step a
    housekeeping round (every tick: ``MAINTENANCE_EVERY`` 0): once the worker takes jobs
    (or at the first round: not ``wait_for_worker``; a burst's worker ends once the queues
    are empty), Redis is stopped; after ``rounds`` rounds without it, started again on its
    port (if ``back``); once the supervisor heartbeats there again, or after
    ``stop_after`` rounds without Redis, it is asked to stop (once). Counts the workers it
    spawned."""

    def __init__(self, settings, monkeypatch, burst: bool = False, rounds: int = 3,
                 back: bool = True, stop_after: int | None = None,
                 wait_for_worker: bool = True, replica: bool = False) -> None:
        monkeypatch.setattr(supervisor, "MAINTENANCE_EVERY", 0.0)
        self.server = PrivateRedis.start()
        self.replica = replica  # not stopped: made a replica of a master that is not there
        self.back_at = 0.0
        self.lived: list[int] = []  # workers alive when the outage ended
        self.port, self.rounds, self.back, self.stop_after = (self.server.port, rounds, back,
                                                              stop_after)
        self.conn = redis.Redis.from_url(self.server.url(), socket_timeout=5)
        self.sup = Supervisor(settings.with_(redis_url=self.server.url()), 1, ["farm"],
                              burst=burst)
        self.down: list[int] = []  # rounds without Redis, once it was stopped
        self.spawned: list[int] = []
        self.asked, self.wait_for_worker = False, wait_for_worker
        real_spawn, self.real_round = self.sup.spawn, maintenance.run_once

        def spawn() -> None:
            real_spawn()
            self.spawned.append(self.sup.children[-1].pid)
        monkeypatch.setattr(self.sup, "spawn", spawn)
        monkeypatch.setattr(maintenance, "run_once", self.round)

    def round(self, rt, owner: str, queues: list[str]) -> bool:
        if not self.down:
            if not self.wait_for_worker or Worker.count(connection=self.conn):
                self._begin()
                self.down.append(0)
        elif self._ongoing():
            self.down[0] += 1
            assert self.down[0] < 120, "a hang guard: the supervisor never ended the outage"
            if self.back and self.down[0] == self.rounds:
                self._end()
            elif self.down[0] == self.stop_after:
                self._ask_to_stop()
        elif self._heartbeat_since_back():  # it heartbeats in Redis again
            self._ask_to_stop()
        return self.real_round(rt, owner, queues)

    def _begin(self) -> None:
        if self.replica:  # writes now fail with READONLY; a blocked BLMOVE is unblocked
            self.conn.execute_command("REPLICAOF", "127.0.0.1", str(free_port()))
        else:
            self.server.stop()

    def _ongoing(self) -> bool:
        if self.replica:
            return self.conn.info("replication")["role"] != "master"
        return self.server.proc.poll() is not None

    def _end(self) -> None:
        self.back_at = time.time()
        self.lived = [c.pid for c in self.sup.children if c.poll() is None]
        if self.replica:
            self.conn.execute_command("REPLICAOF", "NO", "ONE")
        else:
            self.server = PrivateRedis.start(port=self.port)

    def _heartbeat_since_back(self) -> bool:
        beats = [json.loads(v) for v in self.conn.hvals(keys.supervisors())]
        return any(b["at"] > self.back_at for b in beats)

    def _ask_to_stop(self) -> None:
        if not self.asked:
            self.asked = True
            self.sup._on_stop(signal.SIGTERM, None)

    def run(self) -> int:
        """The supervisor's ``run()``; its workers killed and Redis stopped after it."""
        try:
            return _run_restoring_signals(self.sup)
        finally:
            for c in self.sup.children:
                if c.poll() is None:
                    c.kill()
            self.server.stop()


def test_a_redis_outage_leaves_the_workers_running_and_the_supervisor_takes_up_again(
        settings, monkeypatch, caplog):
    """Redis gone for three housekeeping rounds under a running supervisor: it says so once
    and keeps its worker (it used to stop them and exit at its first tick, though rq's
    workers ride an outage out); Redis back on its port: it says so, heartbeats there
    again, and stops cleanly when asked."""
    outage = _Outage(settings, monkeypatch)
    with caplog.at_level(logging.WARNING, logger="workers.outage"):
        assert outage.run() == 0
    assert outage.down == [3] and outage.asked
    assert len(outage.spawned) == 1  # the same worker throughout
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2, said
    assert said[0].startswith(f"Redis at redis://127.0.0.1:{outage.port}/0 does not answer (")
    assert said[1].startswith(f"Redis at redis://127.0.0.1:{outage.port}/0 answers again after")


def test_a_redis_that_refuses_writes_leaves_the_workers_running_and_the_supervisor_takes_up(
        settings, monkeypatch, caplog):
    """Redis made a replica (a failover that demoted it: every write refused with
    ``READONLY``, the worker's blocked dequeue unblocked with an error) for three housekeeping
    rounds: the supervisor says so once and rides it out like an outage, its worker with it
    (before, the supervisor's heartbeat ended it, and the worker crashed at its dequeue);
    made master again: it says so, heartbeats again, and stops cleanly when asked."""
    outage = _Outage(settings, monkeypatch, replica=True)
    with caplog.at_level(logging.WARNING, logger="workers.outage"):
        assert outage.run() == 0
    assert outage.down == [3] and outage.asked
    assert outage.lived == outage.spawned and len(outage.spawned) == 1  # the same worker
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2, said
    where = f"Redis at redis://127.0.0.1:{outage.port}/0"
    assert said[0].startswith(f"{where} refuses writes (READONLY "), said
    assert said[1].startswith(f"{where} takes writes again after"), said


def test_a_burst_stops_once_redis_has_not_answered_for_the_limit(settings, monkeypatch):
    """A burst (a script waits on it) does not wait on a Redis that is gone: at
    ``BURST_OUTAGE_LIMIT`` seconds without an answer it stops its workers and says why in
    one error; a daemon supervisor waits on (the test above)."""
    monkeypatch.setattr(supervisor, "BURST_OUTAGE_LIMIT", 0.0)
    outage = _Outage(settings, monkeypatch, burst=True, back=False, wait_for_worker=False)
    with pytest.raises(FarmError) as caught:
        outage.run()
    assert str(caught.value).startswith(
        f"Redis at redis://127.0.0.1:{outage.port}/0 has not answered for 0 s; the burst stops")
    assert outage.down and len(outage.spawned) == 1


def test_the_burst_limit_counts_from_the_outage_start(settings):
    """Not before ``BURST_OUTAGE_LIMIT`` seconds of the outage, and at once after."""
    sup = Supervisor(settings, 1, ["farm"], burst=True)
    try:
        sup._give_up_on_redis()  # Redis answers
        sup.redis.since = time.monotonic() - supervisor.BURST_OUTAGE_LIMIT + 5
        sup._give_up_on_redis()  # 5 s to go
        sup.redis.since -= 5
        with pytest.raises(FarmError, match="has not answered for 300 s"):
            sup._give_up_on_redis()
    finally:
        sup.rt.close()


def test_a_burst_asked_to_stop_in_an_outage_stops_without_waiting_for_the_limit(
        settings, monkeypatch):
    """Asked to stop while Redis is gone, a burst whose workers ended says so at once (its
    count needs Redis), not once the outage limit has passed."""
    outage = _Outage(settings, monkeypatch, burst=True, back=False, stop_after=2,
                     wait_for_worker=False)
    with pytest.raises(FarmError) as caught:
        outage.run()
    assert str(caught.value).startswith(
        f"stopped while Redis at redis://127.0.0.1:{outage.port}/0 does not answer")
    assert outage.asked and outage.down[0] >= 2


def test_a_redis_refusing_the_heartbeat_deletes_no_heartbeats(settings, monkeypatch):
    """Only a key of another type is replaced; a Redis refusing writes (out of memory, a
    replica) used to have every supervisor's heartbeat deleted."""
    sup = Supervisor(settings, 1, ["farm"])
    deleted: list[str] = []

    def refused(*_args: object) -> None:
        raise redis.ResponseError("OOM command not allowed when used memory > 'maxmemory'.")
    monkeypatch.setattr(sup.conn, "hset", refused)
    monkeypatch.setattr(sup.conn, "delete", lambda *names: deleted.extend(names))
    try:
        with pytest.raises(redis.ResponseError, match="OOM"):
            sup.report()
    finally:
        sup.rt.close()
    assert deleted == []
