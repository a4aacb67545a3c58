"""Operating runs from the command line: status, runs, pause, throttle, failed, retry-failed."""

import json
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pymysql
import pytest

from farmcore.ledger import ChunkSpec
from jobs import runs
from jobs.queue import rq_queue
from jobs.status import serving
from shardfarm.errors import FencedError
from tests.conftest import SHARDS_A, park_unfinished_runs, run_farm
from tests.farmkit import output, spawn, start_workers, stop, until
from workers.worker import build

pytestmark = [pytest.mark.slow,  # end-to-end: real workers, servers or long waits
              pytest.mark.usefixtures("park_leftover_runs")]


def edges(base, n, count=50, **params):
    return [ChunkSpec("edges", {"shard": SHARDS_A[0] + 4, "start": base + i * count,
                                "count": count}) for i in range(n)]


def test_status_json_and_table(rt, env):
    run_id = runs.start(rt, "test", "tests.kinds.write_edges", edges(5_000_000, 4))
    out = run_farm(env, "status", "--json", "--run", run_id)
    doc = json.loads(out.stdout)
    kind = doc["runs"][0]["kinds"][0]
    assert (kind["kind"], kind["done"], kind["total"]) == ("edges", 0, 4)
    assert doc["queues"]["farm"]["jobs"] == 4 and doc["runs"][0]["status"] == "running"
    proc = start_workers(env, 1, "--burst")
    proc.wait(timeout=60)
    out = run_farm(env, "status", "--run", run_id)
    assert out.returncode == 0 and f"run {run_id}" in out.stdout
    assert "edges" in out.stdout and "4/4" in out.stdout


def test_pause_then_unpause(rt, env):
    run_id = runs.start(rt, "test", "tests.kinds.write_edges", edges(6_000_000, 3))
    assert run_farm(env, "pause", run_id).returncode == 0
    proc = start_workers(env, 1, "--burst")
    proc.wait(timeout=60)
    assert rt.ledger.progress(run_id)[0]["done"] == 0  # nothing taken while paused
    out = run_farm(env, "unpause", run_id)
    assert json.loads(out.stdout)["enqueued"] == 3
    proc = start_workers(env, 1, "--burst")
    proc.wait(timeout=60)
    assert rt.ledger.refresh_status(run_id) == "done"


def test_throttle_waits_while_server_busy(rt, env, settings):
    stop_sleep = threading.Event()

    def busy():
        c = pymysql.connect(host="127.0.0.1", user="root")
        with c.cursor() as cur:
            while not stop_sleep.is_set():
                cur.execute("SELECT SLEEP(0.5)")
        c.close()
    sleepers = [threading.Thread(target=busy) for _ in range(4)]
    for t in sleepers:
        t.start()
    try:
        run_id = runs.start(rt, "test", "tests.kinds.write_edges", edges(7_000_000, 2),
                            params={"max_threads_running": 3})
        proc = start_workers(env, 1)
        try:
            reason = until(lambda: json.loads(run_farm(env, "status", "--json", "--run", run_id)
                                              .stdout)["runs"][0]["throttled"],
                           what="throttled status")
            assert "Threads_running" in reason and "> 3" in reason
            assert rt.ledger.progress(run_id)[0]["done"] == 0
            stop_sleep.set()
            assert runs.wait(rt, run_id, timeout=60) == "done"
        finally:
            stop(proc)
    finally:
        stop_sleep.set()
        for t in sleepers:
            t.join()


def test_failed_and_retry_failed(rt, env):
    run_id = runs.start(rt, "test", "tests.kinds.explode", [ChunkSpec("bad", {"fatal": True})])
    proc = start_workers(env, 1, "--burst")
    proc.wait(timeout=60)
    out = run_farm(env, "failed", "--run", run_id)
    assert "FatalError: boom on purpose" in out.stdout and "1 attempts" in out.stdout
    assert 'arguments: {"fatal": true}' in out.stdout  # what the chunk was asked to do
    assert rt.ledger.refresh_status(run_id) == "failed"
    out = run_farm(env, "retry-failed", "--run", run_id)
    assert json.loads(out.stdout) == {"chunks": 1, "items": 0, "not_retried": 0}
    assert rt.ledger.chunk(run_id, 0)["state"] == "pending"
    out = run_farm(env, "resume", "nope-run")
    assert out.returncode == 1 and "no run 'nope-run'" in out.stderr


def test_failed_says_so_when_a_chunk_has_no_reason_recorded(rt, env):
    """A chunk marked failed with no last error (by hand, or by an older farm)."""
    run_id = runs.start(rt, "test", "tests.kinds.explode", [ChunkSpec("bad", {"fatal": True})])
    rt.ledger.pool.run(lambda cur: cur.execute(
        "UPDATE chunks SET state = 'failed', last_error = NULL WHERE run_id = %s", (run_id,)))
    try:
        out = run_farm(env, "failed", "--run", run_id)
    finally:  # no later 'farm retry-failed' of another test meets it
        rt.ledger.pool.run(lambda cur: cur.execute(
            "UPDATE chunks SET state = 'done' WHERE run_id = %s", (run_id,)))
        rt.ledger.refresh_status(run_id)
    assert out.returncode == 0, out.stderr
    assert "None" not in out.stdout
    assert f"{run_id} chunk 0 (bad, 0 attempts): no reason recorded" in out.stdout


def test_transient_failure_backs_off_then_fails_after_bounded_attempts(rt, env):
    env = {**env, "FARM_CHUNK_ATTEMPTS": "2"}
    run_id = runs.start(rt, "test", "tests.kinds.explode", [ChunkSpec("bad", {"fatal": False})])
    proc = start_workers(env, 1)
    try:
        assert runs.wait(rt, run_id, timeout=90) == "failed"
    finally:
        stop(proc)
    chunk = rt.ledger.chunk(run_id, 0)
    assert chunk["attempts"] == 2 and "RetryableError" in chunk["last_error"]


def test_runs_lists_every_run_newest_first_with_its_chunks(rt, env):
    made = [runs.start(rt, "listing", "tests.kinds.write_edges", edges(7_000_000 + 1000 * i, 2))
            for i in range(7)]  # more than 'farm status' shows
    rt.ledger.set_paused(made[-1], True)
    out = run_farm(env, "runs", "--kind", "listing", "--limit", "6", "--json")
    assert out.returncode == 0, out.stderr
    listed = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["run_id"] for r in listed] == made[::-1][:6]
    assert all((r["kind"], r["total_chunks"], r["chunks_done"]) == ("listing", 2, 0)
               for r in listed)
    assert listed[0]["paused"] and not listed[1]["paused"]
    table = run_farm(env, "runs", "--kind", "listing")
    assert table.returncode == 0 and all(run_id in table.stdout for run_id in made)
    assert "0/2" in table.stdout and "farm unpause RUN_ID" in table.stdout
    assert "no runs" in run_farm(env, "runs", "--kind", "nothing-of-this-kind").stdout


def test_runs_of_a_kind_there_is_none_of_names_the_kinds_there_are(rt, env):
    """Before, 'farm runs --kind migration' (for migrate) said only 'no runs', exit 0, as if
    nothing had ever run."""
    runs.start(rt, "listing", "tests.kinds.write_edges", edges(7_100_000, 1))
    out = run_farm(env, "runs", "--kind", "migration")
    assert out.returncode == 0 and out.stdout.splitlines()[0] == "no runs", out
    (line,) = out.stderr.splitlines()
    assert line.startswith("farm: note: no run has kind 'migration' (the kinds there are: ")
    assert "listing" in line.split("kinds there are: ")[1], line


def _interrupted(env: dict, *args: str, ready) -> tuple[int, str]:
    """``farm ARGS`` as a subprocess, sent SIGINT (Ctrl-C) once ``ready(output)`` holds:
    its exit code and output."""
    import signal
    import sys

    from tests.farmkit import output, spawn
    proc = spawn([sys.executable, "-m", "scripts", *args], env)
    try:
        until(lambda: ready(output(proc)), timeout=60, what="the command to be waiting")
        proc.send_signal(signal.SIGINT)
        return proc.wait(timeout=30), output(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_ctrl_c_during_wait_says_the_run_goes_on(rt, env):
    """Before, Ctrl-C during '--wait' printed 'farm: aborted': nothing said whether the run
    was stopped too (it is not) or how to stop it."""
    run_id = runs.start(rt, "test", "tests.kinds.sleepy", [ChunkSpec("nap", {"seconds": 0})])
    rt.ledger.set_paused(run_id, True)  # resume --wait then waits until interrupted
    code, out = _interrupted(env, "resume", run_id, "--wait",
                             ready=lambda out: "re-enqueued" in out)
    assert code == 130, out
    assert out.strip().splitlines()[-1] == (
        f"farm: stopped waiting; {run_id} goes on on the workers ('farm status --run "
        f"{run_id}' shows it, 'farm pause {run_id}' stops it)")
    assert "Traceback" not in out and rt.ledger.run(run_id)["status"] == "running"


def test_ctrl_c_during_enqueue_wait_says_the_items_stay_queued(rt, env, tmp_path):
    """Before, Ctrl-C during 'farm enqueue --wait' printed 'farm: aborted' and not the
    {"enqueued": n} line: a script could not tell what it had queued."""
    items = tmp_path / "items.jsonl"
    items.write_text("".join(json.dumps({"key": "ctrl-c", "value": i}) + "\n" for i in range(3)))
    queue = rq_queue(rt.redis, "ctrlc")
    code, out = _interrupted(env, "enqueue", "ctrlc", "tests.kinds.record", "--file",
                             str(items), "--wait", ready=lambda _: queue.count >= 1)
    assert code == 130, out
    assert out.strip().splitlines()[-2:] == [
        '{"enqueued": 3, "duplicates": 0}',
        "farm: stopped waiting; the items stay queued on ctrlc ('farm status' shows the "
        "queue, 'farm failed' any that fail)"]


@contextmanager
def _waiting(env: dict, *args: str) -> Iterator[tuple]:
    """``farm ARGS`` as a subprocess, and a list for the workers the block starts: the
    command killed if it still runs after the block, the workers stopped."""
    proc = spawn([sys.executable, "-m", "scripts", *args], env)
    workers: list = []
    try:
        yield proc, workers
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for w in workers:
            stop(w)


def test_an_enqueue_wait_with_no_worker_on_its_queue_says_so_then_ends_when_one_comes(
        rt, env, tmp_path):
    """A typo in the queue, or no ``farm workers``: ``farm enqueue --wait`` sat at 0 items
    saying nothing. Now one note names the queue and what to start, and the wait goes on."""
    items = tmp_path / "items.jsonl"
    items.write_text("".join(json.dumps({"key": f"u{i}", "value": i}) + "\n" for i in range(3)))
    said = ("farm: note: no worker has taken jobs from queue 'unserved' for 10 s: start some "
            "with 'farm workers --queues unserved'; still waiting")
    with _waiting(env, "enqueue", "unserved", "tests.kinds.record", "--file", str(items),
                  "--wait") as (proc, workers):
        until(lambda: said in output(proc), timeout=40, what="the note")
        workers.append(start_workers(env, 1, "--queues", "unserved"))
        assert proc.wait(timeout=60) == 0, output(proc)
    out = output(proc)
    assert out.count(said) == 1 and "Traceback" not in out, out
    assert json.loads(out.strip().splitlines()[-1])["done"] == 3, out


def test_a_wait_says_when_its_run_is_paused_and_unpaused_from_elsewhere(rt, env):
    """``farm pause`` from another shell: the waiting command went silent for as long as the
    pause lasted. Now a note says the run is paused and what unpauses it, another when it
    is unpaused, and the wait ends when the run does."""
    # a nap of 2 s: the wait (polls every 0.2 s) sees the run unpaused before it ends
    run_id = runs.start(rt, "test", "tests.kinds.sleepy", [ChunkSpec("nap", {"seconds": 2})])
    with _waiting(env, "resume", run_id, "--wait") as (proc, workers):
        until(lambda: "re-enqueued" in output(proc), timeout=60, what="the wait")
        assert run_farm(env, "pause", run_id).returncode == 0
        until(lambda: f"{run_id} is paused: no chunk of it is dispatched until 'farm unpause "
              f"{run_id}'; still waiting" in output(proc), timeout=30, what="the pause note")
        workers.append(start_workers(env, 1))
        assert run_farm(env, "unpause", run_id).returncode == 0
        assert proc.wait(timeout=60) == 0, output(proc)
    out = output(proc)
    assert out.count("is paused") == 1 and f"farm: note: {run_id} is unpaused" in out, out


def test_a_failed_run_waited_on_off_a_terminal_says_so_on_stderr(rt, env):
    """Off a terminal the JSON line was all: exit 1 with nothing on stderr saying what
    failed or what to run next."""
    run_id = runs.start(rt, "test", "tests.kinds.explode", [ChunkSpec("boom", {"fatal": True})])
    workers = start_workers(env, 1)
    try:
        out = run_farm(env, "resume", run_id, "--wait", timeout=120)
    finally:
        stop(workers)
    assert out.returncode == 1 and json.loads(out.stdout.splitlines()[-1])["status"] == "failed"
    assert out.stderr.strip().splitlines()[-1] == (
        f"farm: error: {run_id} ended failed with 1 chunk(s) not done: 'farm failed --run "
        f"{run_id}' says why, 'farm retry-failed --run {run_id}' tries them again"), out.stderr


def test_serving_counts_the_live_workers_of_a_queue(rt, env):
    """What the note above reads: a worker registered on the queue counts (on another queue
    not), and an entry whose worker hash is gone (a dead worker's, or forged) does not."""
    worker = build(rt.settings, ["servedq", "alsoq"])
    worker.register_birth()
    try:
        assert (serving(rt.redis, "servedq"), serving(rt.redis, "alsoq")) == (1, 1)
        assert serving(rt.redis, "otherq") == 0
        rt.redis.sadd("rq:workers:otherq", "rq:worker:gone")
        assert serving(rt.redis, "otherq") == 0
        rt.redis.delete(worker.key)  # its hash expired with its TTL
        assert serving(rt.redis, "servedq") == 0
    finally:
        worker.register_death()
        rt.redis.delete("rq:workers:otherq")


def _paused(rt, run_id):
    rt.ledger.set_paused(run_id, True)


def _failed(rt, run_id):
    rt.ledger.fail(rt.ledger.claim(run_id, 0, "me", 60), "boom", None)


@pytest.mark.parametrize(("make", "says"), [
    (_paused, "{r} is paused: no chunk of it is dispatched until 'farm unpause {r}'"),
    (_failed, "1 failed chunk(s) of {r} are not resumed: 'farm retry-failed --run {r}' tries "
              "them again")], ids=["paused", "failed"])
def test_resume_says_what_it_leaves(rt, env, make, says):
    """Before, 'farm resume' of a paused or failed run said only 're-enqueued 0 unfinished
    chunk(s)' (its help: 'every chunk … that is not done'); with --wait it then waited without
    a word (paused) or exited 1 without saying why (failed)."""
    run_id = runs.start(rt, "test", "tests.kinds.sleepy", [ChunkSpec("nap", {"seconds": 0})])
    make(rt, run_id)
    out = run_farm(env, "resume", run_id)
    assert out.returncode == 0, out.stderr
    assert out.stderr.splitlines() == [f"re-enqueued 0 unfinished chunk(s) of {run_id}",
                                       f"farm: note: {says.format(r=run_id)}"]


def test_cancel_ends_a_run_and_only_a_retry_of_that_run_takes_it_up(rt, env):
    run_id = runs.start(rt, "test", "tests.kinds.write_edges", edges(8_000_000, 3))
    held = rt.ledger.claim(run_id, 1, "a-worker")  # a worker holds one chunk
    out = run_farm(env, "cancel", run_id)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"run_id": run_id, "cancelled_chunks": 3}
    with pytest.raises(FencedError):  # the holder stops at its next renewal
        rt.ledger.renew(held)
    proc = start_workers(env, 1, "--burst")  # the run's queued jobs run nothing
    proc.wait(timeout=60)
    assert [c["state"] for c in map(lambda i: rt.ledger.chunk(run_id, i), range(3))] == \
        ["failed"] * 3
    out = run_farm(env, "failed", "--run", run_id)
    assert out.stdout.count("cancelled by the operator (farm cancel)") == 3, out.stdout
    assert _statuses(env, run_id) == ["cancelled"] * 3
    summary = json.loads(run_farm(env, "summary", run_id, "--json").stdout)
    assert (summary["status"], summary["failed_chunks"]) == ("cancelled", 3)
    said = run_farm(env, "status", "--run", run_id).stdout
    assert "cancelled by the operator at " in said and "farm failed" not in said, said
    assert f"UTC; 3 chunk(s) not done; 'farm retry-failed --run {run_id}' takes it up" in said
    park_unfinished_runs(rt.ledger)  # the session's other runs: a retry of all would revive them
    run_farm(env, "retry-failed")  # every run's failures: not a cancelled run's
    assert rt.ledger.chunk(run_id, 0)["state"] == "failed"
    out = run_farm(env, "retry-failed", "--run", run_id)
    assert json.loads(out.stdout)["chunks"] == 3
    proc = start_workers(env, 1, "--burst")
    proc.wait(timeout=60)
    assert rt.ledger.refresh_status(run_id) == "done"
    assert _statuses(env, run_id) == ["done"] * 3  # taken up again: its own status
    again = run_farm(env, "cancel", run_id)  # nothing left: said, not an error
    assert again.returncode == 0 and "had no chunk left to cancel" in again.stderr
    out = run_farm(env, "cancel", "nope-run")
    assert out.returncode == 1 and "no run 'nope-run'" in out.stderr


def _statuses(env, run_id):
    """The run's status as 'farm runs --json', 'farm status --json' and the end of 'farm
    status' tell it."""
    listed = [json.loads(line) for line in run_farm(env, "runs", "--json").stdout.splitlines()]
    view = json.loads(run_farm(env, "status", "--json", "--run", run_id).stdout)
    line = run_farm(env, "status", "--run", run_id).stdout.splitlines()[0]
    return [next(r["status"] for r in listed if r["run_id"] == run_id),
            view["runs"][0]["status"], line.split()[3]]


def test_a_run_cancelled_while_waited_for_ends_the_wait_with_exit_1(rt, env):
    """'--wait' exits 0 only if every chunk finished: a cancelled run's ends it with 1 and a
    summary that says ``cancelled`` (before: ``failed``)."""
    run_id = runs.start(rt, "test", "tests.kinds.sleepy",
                        [ChunkSpec("nap", {"seconds": 0}) for _ in range(2)],
                        queue="cancel-tests-nobody-listens")
    waiting = spawn([sys.executable, "-m", "scripts", "resume", run_id, "--wait"], env)
    try:
        time.sleep(2)  # waiting: no worker takes its chunks
        assert waiting.poll() is None, output(waiting)
        assert json.loads(run_farm(env, "cancel", run_id).stdout)["cancelled_chunks"] == 2
        assert waiting.wait(timeout=60) == 1, output(waiting)
        lines = output(waiting).strip().splitlines()  # stdout and stderr, in one
    finally:
        stop(waiting)
    doc = json.loads([x for x in lines if x.startswith("{")][-1])
    (error,) = [x for x in lines if x.startswith("farm: error:")]
    assert (doc["run_id"], doc["status"], doc["failed_chunks"]) == (run_id, "cancelled", 2)
    assert error == (f"farm: error: {run_id} ended cancelled with 2 chunk(s) not done: 'farm "
                     f"failed --run {run_id}' says why, 'farm retry-failed --run {run_id}' "
                     "tries them again")
