"""Logging (shardfarm.log): JSON lines with the run, chunk, shard, host and worker they are
about; the level and format given to 'farm workers' reach every worker process; passwords
never written."""

import json
import logging
import os
import sys

import pytest

from farmcore.ledger import ChunkSpec
from jobs import runs
from shardfarm import log as farm_log
from shardfarm.errors import ConfigError, UsageError
from tests.conftest import SHARDS_A, park_unfinished_runs, run_farm


def _record(msg: str, *args, exc_info=None) -> logging.LogRecord:
    return logging.LogRecord("farm.test", logging.INFO, __file__, 1, msg, args, exc_info)


def test_json_lines_carry_the_context_they_were_logged_in(monkeypatch):
    monkeypatch.setattr(farm_log, "_process", {})
    fmt = farm_log.JsonFormatter()
    farm_log.set_process(worker="h:1:abc")
    with farm_log.context(run="r-1", chunk=3), farm_log.context(shard=17, none=None):
        inside = json.loads(fmt.format(_record("chunk %s done", 3)))
    outside = json.loads(fmt.format(_record("idle")))
    assert inside["message"] == "chunk 3 done" and inside["level"] == "INFO"
    assert (inside["run"], inside["chunk"], inside["shard"]) == ("r-1", 3, 17)
    assert inside["host"] == farm_log.HOST and inside["worker"] == "h:1:abc"
    assert "none" not in inside and "run" not in outside and outside["worker"] == "h:1:abc"
    assert inside["time"].endswith("Z") and "T" in inside["time"]


def test_passwords_are_redacted_in_messages_and_tracebacks():
    try:
        raise RuntimeError("cannot reach mysql://farm:s3cret@db:3306/x")
    except RuntimeError:
        rec = _record("lost redis://:hunter2@r:6379/0", exc_info=sys.exc_info())
    doc = json.loads(farm_log.JsonFormatter().format(rec))
    text = farm_log.RedactingFormatter(farm_log.FORMAT).format(rec)
    for out in (json.dumps(doc), text):
        assert "s3cret" not in out and "hunter2" not in out and "***@" in out


def test_setup_checks_values_and_passes_them_on(monkeypatch):
    monkeypatch.setenv("FARM_LOG_FORMAT", "yaml")
    with pytest.raises(ConfigError, match="FARM_LOG_FORMAT"):
        farm_log.setup()
    with pytest.raises(UsageError, match="--log-level"):
        farm_log.setup("loud", "json")
    root = logging.getLogger()
    before = (root.level, list(root.handlers))
    try:
        farm_log.setup("info", "JSON")
        assert os.environ["FARM_LOG_LEVEL"] == "INFO" and os.environ["FARM_LOG_FORMAT"] == "json"
        farm_log.setup("warning", "text")   # replaces its own handler, keeps others
        assert len([h for h in root.handlers if getattr(h, "farm", False)]) == 1
    finally:
        for h in [h for h in root.handlers if getattr(h, "farm", False)]:
            root.removeHandler(h)
        root.setLevel(before[0])


@pytest.mark.slow
@pytest.mark.usefixtures("park_leftover_runs")
def test_workers_log_json_with_run_chunk_shard_host_and_worker(rt, env):
    shard = SHARDS_A[0] + 6
    run_id = runs.start(rt, "test", "tests.kinds.write_edges", [
        ChunkSpec("edges", {"shard": shard, "start": 8_000_000 + 100 * i, "count": 100})
        for i in range(3)])
    park_unfinished_runs(rt.ledger, keep={run_id})  # earlier tests' runs: not this one's
    plain = {k: v for k, v in env.items() if k not in ("FARM_LOG_LEVEL", "FARM_LOG_FORMAT")}
    out = run_farm(plain, "--log-format", "json", "--log-level", "INFO", "workers",
                   "--count", "2", "--burst", timeout=120)
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stderr.splitlines() if line.strip()]
    assert lines and all({"time", "level", "message", "host"} <= set(d) for d in lines)
    done = [d for d in lines if d["message"].startswith("chunk ") and " done:" in d["message"]]
    assert sorted(d["chunk"] for d in done) == [0, 1, 2]  # INFO reached the workers
    assert {(d["run"], d["shard"]) for d in done} == {(run_id, shard)}
    assert all(d["worker"].startswith(d["host"] + ":") for d in done)
    assert len({d["process"] for d in lines}) >= 2  # the supervisor and its workers


def test_a_password_in_a_failing_url_is_not_logged(env):
    out = run_farm({**env, "FARM_REDIS_URL": "redis://:topsecret@127.0.0.1:1/0"},
                   "--log-format", "json", "--log-level", "DEBUG", "status", timeout=60)
    assert out.returncode == 1 and "topsecret" not in out.stderr + out.stdout
