"""Following a run on a terminal (a real pty, the real ``farm`` command): bars by rows from
the first moment, one whole-run ETA, then a few lines for a person, or the JSON line with
--json; off a terminal the JSON line is last, as scripts expect."""

import json

import pytest

from farmcore.ledger import ChunkSpec
from jobs import runs
from tests.conftest import SHARDS_A, run_farm
from tests.farmkit import start_workers, stop
from tests.ttykit import Tty

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("park_leftover_runs")]


def _start(rt, base: int, n: int = 4, rows: int = 100, pause: float = 0.0) -> str:
    chunks = [ChunkSpec("edges", {"shard": SHARDS_A[0] + 5, "start": base + i * rows,
                                  "count": rows, "pause": pause}, rows=rows) for i in range(n)]
    return runs.start(rt, "test", "tests.kinds.write_edges", chunks)


def _ended_by_a_worker(tty: Tty, env: dict) -> str:
    """Start a worker, let the followed run end (the command exits 0), stop the worker; what
    the terminal showed."""
    workers = start_workers(env, 1)
    try:
        assert tty.wait() == 0
    finally:
        stop(workers)
    return tty.plain


def test_wait_on_a_terminal_counts_rows_then_prints_a_summary(rt, env):
    run_id = _start(rt, 7_000_000, pause=0.1)
    tty = Tty(env, "resume", run_id, "--wait")
    # before any worker runs: rows are known, so the bar counts them from the start
    tty.expect("0/400 rows · 0/4 chunks")
    out = _ended_by_a_worker(tty, env)
    assert "edges [####################] 400/400 rows · 4/4 chunks" in out
    assert "400/400 rows · 4/4 chunks ·" in out and "ETA" in out
    assert "rows=" not in out and "s/chunks" not in out
    last = out.strip().splitlines()[-2:]
    assert last[0].startswith(f"test run {run_id} done in ") and "400 rows at" in last[0]
    assert last[1].strip() == "loaded       edges 400"
    assert not out.strip().endswith("}")


def test_json_on_a_terminal_and_off_one(rt, env):
    run_id = _start(rt, 7_100_000, n=2)
    workers = start_workers(env, 1)
    try:
        tty = Tty(env, "resume", run_id, "--wait", "--json")
        assert tty.wait() == 0
        doc = json.loads(tty.plain.strip().splitlines()[-1])
        assert doc["run_id"] == run_id and doc["loaded"] == {"edges": 200}
        out = run_farm(env, "resume", run_id, "--wait")
    finally:
        stop(workers)
    assert out.returncode == 0 and json.loads(out.stdout.strip().splitlines()[-1])["status"] == \
        "done"
    assert "\x1b[" not in out.stderr  # no bars drawn off a terminal


def test_a_run_cancelled_while_followed_on_a_terminal_says_so_and_exits_1(rt, env):
    """Before, the bars ended 'ended, 2 failed' and the summary named 'farm failed'."""
    run_id = runs.start(rt, "test", "tests.kinds.sleepy",
                        [ChunkSpec("nap", {"seconds": 0}) for _ in range(2)],
                        queue="cancel-tests-nobody-listens")
    tty = Tty(env, "resume", run_id, "--wait")
    tty.expect("0/2 chunks")
    assert json.loads(run_farm(env, "cancel", run_id).stdout)["cancelled_chunks"] == 2
    assert tty.wait() == 1
    out = tty.plain
    assert "· cancelled, 2 not done" in out and "ended, 2 failed" not in out, out
    last = out.strip().splitlines()[-1]
    assert last.startswith("  cancelled by the operator at ") and last.endswith(
        f"UTC; 2 chunk(s) not done; 'farm retry-failed --run {run_id}' takes it up again")
    assert f"test run {run_id} cancelled in " in out and "farm failed" not in out


def test_a_wait_with_no_worker_on_its_queue_says_so_once_then_goes_on(rt, env):
    """No ``farm workers`` running (or only on other queues): the bars sat at 0 and nothing
    said why. Now one note, below the bars, names the queue and what to start; the wait
    goes on and ends when workers come."""
    run_id = _start(rt, 7_300_000, n=2)
    queue = rt.ledger.run(run_id)["queue"]
    tty = Tty(env, "resume", run_id, "--wait")
    tty.expect("0/200 rows · 0/2 chunks")
    said = (f"farm: note: no worker has taken jobs from queue '{queue}' for 10 s: start some "
            f"with 'farm workers --queues {queue}'; still waiting")
    tty.expect(said, timeout=30)
    out = _ended_by_a_worker(tty, env)
    assert out.count(said) == 1, out
    assert "200/200 rows · 2/2 chunks" in out.split(said, 1)[1], out  # drawn below it
