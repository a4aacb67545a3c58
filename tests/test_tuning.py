"""Tuning variables (shardfarm.tuning): every FARM_* tuning value is checked in one place;
a bad one stops any command and any worker at its start with one line, never a traceback
per job and never a silent stall."""

from __future__ import annotations

import subprocess
import sys

import pytest

from jobs import throttle
from shardfarm import tuning
from shardfarm.errors import ConfigError, UsageError
from shardfarm.settings import Settings
from tests.conftest import ROOT, run_farm

BAD = [
    ("FARM_LEASE_SECONDS", "banana", "a number of seconds > 0"),
    ("FARM_LEASE_SECONDS", "0", "a number of seconds > 0"),
    ("FARM_LEASE_SECONDS", "nan", "a number of seconds > 0"),
    ("FARM_LEASE_SECONDS", "inf", "a number of seconds > 0"),
    ("FARM_CHUNK_ATTEMPTS", "0", "a whole number from 1 to 1000"),
    ("FARM_CHUNK_ATTEMPTS", "2.5", "a whole number from 1 to 1000"),
    ("FARM_MAX_THREADS_RUNNING", "abc", "a whole number of threads"),
    ("FARM_MAX_THREADS_RUNNING", "-1", "a whole number of threads"),
    ("FARM_CONNECT_TIMEOUT", "soon", "a number of seconds > 0, at most 3600"),
    ("FARM_LOG_LEVEL", "loud", "one of DEBUG"),
    ("FARM_LOG_FORMAT", "yaml", "one of text, json"),
    ("FARM_EXPORT_CRON", "every night", "5 cron fields"),
    ("FARM_EXPORT_CRON", "0 3 31 2 *", "of a date that exists"),  # never fires
]


def test_defaults_and_good_values():
    assert (tuning.lease_seconds({}), tuning.chunk_attempts({}),
            tuning.max_threads_running({}), tuning.connect_timeout({})) == (60, 5, 0, 10)
    env = {"FARM_LEASE_SECONDS": "0.5", "FARM_CHUNK_ATTEMPTS": "2",
           "FARM_MAX_THREADS_RUNNING": "40", "FARM_CONNECT_TIMEOUT": "2.5",
           "FARM_LOG_LEVEL": "info", "FARM_EXPORT_CRON": "30 4 * * 1"}
    tuning.check_environment(env)
    assert (tuning.lease_seconds(env), tuning.chunk_attempts(env),
            tuning.max_threads_running(env), tuning.connect_timeout(env)) == (0.5, 2, 40, 2.5)
    assert tuning.value("FARM_LOG_LEVEL", env) == "INFO"
    assert tuning.lease_seconds({"FARM_LEASE_SECONDS": ""}) == 60  # empty: the default


@pytest.mark.parametrize("name,text,expected", BAD)
def test_a_bad_value_is_one_line_naming_variable_value_and_range(name, text, expected):
    for check in (lambda: tuning.value(name, {name: text}),
                  lambda: tuning.check_environment({name: text}),
                  lambda: Settings.from_env({name: text})):
        with pytest.raises(ConfigError) as exc:
            check()
        assert not isinstance(exc.value, UsageError)  # the environment: exit 1, not 2
        assert str(exc.value) == f"bad {name}: {text!r} ({tuning.TUNABLES[name].expected})"
        assert expected in str(exc.value)


def test_a_bad_flag_value_is_a_usage_error_naming_the_flag():
    with pytest.raises(UsageError, match=r"^bad --at: 'x' \(5 cron fields"):
        tuning.value("FARM_EXPORT_CRON", {}, given="x", flag="--at")
    with pytest.raises(UsageError, match=r"^bad --log-level: ''"):
        tuning.value("FARM_LOG_LEVEL", {}, given="", flag="--log-level")


def test_the_throttle_limit_is_checked_not_a_stray_value_error(monkeypatch):
    monkeypatch.setenv("FARM_MAX_THREADS_RUNNING", "7")
    assert throttle.limit_of({"params": {}}) == 7
    assert throttle.limit_of({"params": {"max_threads_running": 3}}) == 3
    monkeypatch.setenv("FARM_MAX_THREADS_RUNNING", "abc")
    with pytest.raises(ConfigError, match="bad FARM_MAX_THREADS_RUNNING: 'abc'"):
        throttle.limit_of({"params": {}})


def _one_line(out: subprocess.CompletedProcess, code: int, line: str) -> None:
    assert out.returncode == code, (out.returncode, out.stderr)
    assert out.stderr.splitlines() == [line], out.stderr


@pytest.mark.parametrize("name,text,expected", [*BAD[::3], BAD[6]])
def test_any_command_refuses_a_bad_value_in_one_line(farm_env, name, text, expected):
    env = {**farm_env, name: text}
    line = f"farm: error: bad {name}: {text!r} ({tuning.TUNABLES[name].expected})"
    for args in (("migrate",), ("status",), ("id", "decode", "1")):
        _one_line(run_farm(env, *args), 1, line)


def test_workers_refuse_to_start_on_a_bad_value(farm_env):
    env = {**farm_env, "FARM_LEASE_SECONDS": "banana"}
    line = ("bad FARM_LEASE_SECONDS: 'banana' (a number of seconds > 0, at most 86400)")
    _one_line(run_farm(env, "workers", "--burst", "--count", "2"), 1, f"farm: error: {line}")
    alone = subprocess.run([sys.executable, "-P", "-m", "workers.worker", "--burst"], env=env,
                           cwd=ROOT, capture_output=True, text=True, timeout=60)
    _one_line(alone, 1, f"farm worker: error: {line}")


def test_export_cron_from_the_environment_exits_1_and_from_at_exits_2(farm_env):
    _one_line(run_farm({**farm_env, "FARM_EXPORT_CRON": "nope"}, "cron", "--once"), 1,
              "farm: error: bad FARM_EXPORT_CRON: 'nope' (5 cron fields such as "
              "'0 3 * * *', in UTC, of a date that exists)")
    _one_line(run_farm(farm_env, "cron", "--once", "--at", "nope"), 2,
              "farm: error: bad --at: 'nope' (5 cron fields such as '0 3 * * *', in UTC, "
              "of a date that exists)")
