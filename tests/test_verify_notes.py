"""``farm verify`` of a migrate run that has not loaded everything (chunks pending or running,
or failed): one note before its result says so, and that mismatches may be rows not loaded
yet; the exit code still says only whether the target matches the source."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from jobs import runs
from tests.conftest import ROOT, park_unfinished_runs, run_farm
from tests.farmkit import start_workers, stop
from tests.migratekit import last_json, truncate_target

USERS = 15


def _verify(env: dict, *args: str) -> tuple[int, list[str]]:
    """``farm verify`` off a terminal: its exit code and its lines, stderr and stdout in the
    order they were written."""
    out = subprocess.run([sys.executable, "-m", "scripts", "verify", *args], env=env, cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         timeout=600)
    return out.returncode, out.stdout.splitlines()


def _noted_before_the_result(lines: list[str], note: str) -> None:
    """``note`` is a line, before any mismatch and before the JSON summary (the last line)."""
    assert note in lines, "\n".join(lines)
    result = [i for i, x in enumerate(lines) if x.startswith("mismatch ")] + [len(lines) - 1]
    assert lines.index(note) < min(result), "\n".join(lines)


@pytest.mark.usefixtures("park_leftover_runs")
def test_verify_says_when_the_migrate_run_has_not_loaded_everything(env, rt, server_b):
    """Before, rows the run had not loaded yet (its chunks pending, or failed) came out as
    plain mismatches, and nothing said why: the operator looked for corruption."""
    made = run_farm(env, "legacy", "generate", "--users", str(USERS), "--seed", "5",
                    "--replace")
    assert made.returncode == 0, made.stderr
    truncate_target(server_b.port)
    started = run_farm(env, "migrate", "--chunk-size", "100")
    assert started.returncode == 0, started.stderr
    run_id = last_json(started.stdout)["run_id"]
    rt.ledger.set_paused(run_id, True)  # its chunks stay pending
    park_unfinished_runs(rt.ledger, keep={run_id})
    chunks = rt.ledger.run(run_id)["total_chunks"]
    workers = start_workers(env, 1)
    try:
        code, lines = _verify(env)  # of the latest migrate run: this one
        assert code == 1 and json.loads(lines[-1])["mismatches"] > 0, "\n".join(lines)
        said = (f"migrate run {run_id} had {chunks} chunk(s) pending or running when this "
                "verify started: mismatches may be rows it had not loaded yet ('farm status "
                f"--run {run_id}'; verify again once it is done)")
        _noted_before_the_result(lines, f"farm: note: {said}")
        assert json.loads(lines[-1])["note"] == said  # for a script that reads the last line

        assert rt.ledger.cancel(run_id) == chunks  # it ends, every chunk failed
        code, lines = _verify(env, "--run", run_id)
        assert code == 1, "\n".join(lines)
        _noted_before_the_result(lines, (
            f"farm: note: migrate run {run_id} ended with {chunks} failed chunk(s): mismatches "
            f"may be rows those chunks did not load ('farm failed --run {run_id}', then "
            f"'farm retry-failed --run {run_id}')"))

        rt.ledger.set_paused(run_id, False)
        assert run_farm(env, "retry-failed", "--run", run_id).returncode == 0
        assert runs.wait(rt, run_id, timeout=300) == "done"
        code, lines = _verify(env, "--run", run_id)
        assert code == 0 and not [x for x in lines if "not load" in x], "\n".join(lines)
        assert "note" not in json.loads(lines[-1])
    finally:
        stop(workers)
