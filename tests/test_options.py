"""The options ``farm`` commands share (``scripts.options``): a bad value is one line, exit 2."""

from __future__ import annotations

import pytest

from tests.conftest import run_farm


@pytest.mark.parametrize("command", ["retry-failed", "status", "failed", "verify", "mismatches",
                                     "quarantine"])
def test_an_empty_run_id_is_refused_not_taken_for_every_run(farm_env, command):
    """``--run "$RUN"`` with the variable unset: ``retry-failed`` retried every run's failed
    chunks, ``status`` and ``failed`` showed every run."""
    for value in ("", " "):
        out = run_farm(farm_env, command, "--run", value, timeout=60)
        assert (out.returncode, out.stdout) == (2, ""), (out.returncode, out.stdout, out.stderr)
        assert out.stderr.splitlines() == [
            f"farm: error: bad --run {value!r}: the run ID is empty (give one: 'farm runs' "
            "lists them; or leave --run out)"]


@pytest.mark.parametrize("args", [("workers", "--burst", "--count", "1"),
                                  ("enqueue", "q", "tests.kinds.record", "--file", "-")])
def test_a_malformed_allow_module_is_a_usage_error(farm_env, args):
    """A flag's bad value is a usage mistake (exit 2): it was exit 1, as for the
    environment variable, with a line naming both."""
    out = run_farm(farm_env, *args, "--allow-module", "tests,os;rm", input="", timeout=60)
    assert (out.returncode, out.stdout) == (2, ""), (out.returncode, out.stdout, out.stderr)
    assert out.stderr.splitlines() == [
        "farm: error: bad --allow-module 'os;rm' (expected dotted names such as "
        "'mycompany.jobs')"]
