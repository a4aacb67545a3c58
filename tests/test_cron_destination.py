"""``farm cron`` checks its export destination when it starts, as ``farm export`` does
(within FARM_STATUS_TIMEOUT): a missing bucket, an endpoint that does not answer or a
directory it cannot write is one line naming the destination and exit 1, not a log line
at every slot of a scheduler that keeps running."""

from __future__ import annotations

import datetime as dt
import re
import subprocess
import sys
import time
import uuid

import pytest
from moto.server import ThreadedMotoServer

from tests.conftest import ROOT
from tests.proxy import TcpProxy
from tests.rofs import read_only
from tests.servers import free_port
from workers import cron as scheduler

SECONDS = 2  # FARM_STATUS_TIMEOUT here
AWS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
       "AWS_DEFAULT_REGION": "us-east-1"}


def _cron(env: dict[str, str], limit: float) -> tuple[int, str, float]:
    """Run ``farm cron`` (the long-running scheduler, not ``--once``): its exit code, stderr
    and how long it ran; a scheduler still running after ``limit`` seconds fails the test."""
    name = f"t-dest{uuid.uuid4().hex[:8]}"
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "scripts", "cron", "--name", name,
                             "--tables", "users"], env=env, cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"farm cron was still running after {limit} s with a destination it "
                    f"cannot use; it said: {err.strip()[-600:]}")
    return proc.returncode, err, time.monotonic() - start


@pytest.fixture
def moto():
    """An S3 API (moto's server) with no bucket at all."""
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def cron_env(env) -> dict[str, str]:
    return {**env, **AWS, "FARM_STATUS_TIMEOUT": str(SECONDS), "FARM_LOG_LEVEL": "WARNING"}


def test_a_missing_bucket_stops_farm_cron_at_start(cron_env, moto):
    env = {**cron_env, "AWS_ENDPOINT_URL": moto, "FARM_EXPORT_URL": "s3://no-such-bucket/n"}
    code, err, _ = _cron(env, limit=30)
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1, err
    assert lines[0].startswith("farm: error: export destination s3://no-such-bucket/n cannot "
                               "be used: S3 bucket no-such-bucket: 404"), lines


def test_an_endpoint_that_does_not_answer_stops_farm_cron_within_the_status_bound(cron_env):
    silent = TcpProxy.silent()
    try:
        env = {**cron_env, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{silent.port}"}
        code, err, took = _cron({**env, "FARM_EXPORT_URL": "s3://quiet-bucket/nightly"},
                                limit=30)
    finally:
        silent.stop()
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1, err
    assert "export destination s3://quiet-bucket/nightly cannot be used: S3 bucket " \
        f"quiet-bucket: no answer from http://127.0.0.1:{silent.port} within {SECONDS} s" \
        in lines[0], lines
    assert took < SECONDS + 20, took  # one look, not retried (startup included)
    assert silent.accepted == 1


def test_a_directory_it_cannot_write_stops_farm_cron(cron_env, tmp_path):
    root = tmp_path / "exports"
    with read_only(root):
        code, err, _ = _cron({**cron_env, "FARM_EXPORT_URL": f"file://{root}"}, limit=30)
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1, err
    assert lines[0].startswith(f"farm: error: export destination file://{root} cannot be "
                               "used: "), lines
    assert "Read-only file system" in lines[0], lines


def test_a_file_where_a_tables_folder_goes_stops_farm_cron_at_start(cron_env, tmp_path):
    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / "users").write_text("someone's notes")
    code, err, _ = _cron({**cron_env, "FARM_EXPORT_URL": f"file://{tmp_path}/exp"}, limit=30)
    assert code == 1 and err.strip().splitlines() == [
        f"farm: error: export destination file://{tmp_path}/exp cannot be used: export path "
        f"{tmp_path}/exp/users is a file where a directory belongs: move it away or export "
        "elsewhere"], err


def test_a_file_where_a_slots_folder_goes_ends_farm_cron_at_that_slot(cron_env, tmp_path):
    """Met at a slot (the date's folder is a file), not at start: a failure every round
    would repeat, so farm cron ends with exit 1 and one line naming the slot and its run
    (before, it logged a traceback every 5 s and ran on)."""
    at = "0 0 1 1 *"  # once a year: the due slot is this year's first minute
    slot = scheduler.slots_between(at, None, scheduler.utcnow())[0]
    date = (slot.date() - dt.timedelta(days=1)).isoformat()
    (tmp_path / "exp" / "users").mkdir(parents=True)
    (tmp_path / "exp" / "users" / f"dt={date}").write_text("someone's notes")
    code, err, _ = _cron({**cron_env, "FARM_EXPORT_URL": f"file://{tmp_path}/exp",
                          "FARM_EXPORT_CRON": at}, limit=30)
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 2 and lines[0].startswith("farm cron: "), err
    assert re.fullmatch(
        rf"farm: error: cron t-dest\w+: slot {slot.isoformat()}Z \(run cron-t-dest\w+-"
        rf"{slot:%Y%m%dT%H%M}Z\) failed: export destination file://{tmp_path}/exp cannot be "
        rf"used: export path {tmp_path}/exp/users/dt={date} is a file where a directory "
        r"belongs: move it away or export elsewhere; fix it and start farm cron again",
        lines[1]), lines[1]
