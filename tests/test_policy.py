"""The allow-list: names are refused on their text, before anything is imported."""

from __future__ import annotations

import pickle
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import redis
from rq import Callback, Queue
from rq.serializers import JSONSerializer

from jobs.farmjob import FarmJob, job_refusal
from jobs.policy import ENTRY_POINT, ForbiddenJobError, JobPolicy, parse_modules
from tests.conftest import ROOT

POLICY = JobPolicy(("tests.kinds",))


@pytest.fixture
def marker(tmp_path, monkeypatch):
    """The file ``tests.evil_import`` writes when (and only when) it is imported."""
    path = tmp_path / "imported"
    monkeypatch.setenv("FARM_TEST_IMPORT_MARKER", str(path))
    assert "tests.evil_import" not in sys.modules
    yield path
    assert "tests.evil_import" not in sys.modules


@pytest.fixture
def conn(settings):
    c = redis.Redis.from_url(settings.redis_url)
    c.flushdb()
    yield c
    c.flushdb()


def test_the_marker_module_does_leave_a_marker(marker):
    """The check below can fail: importing tests.evil_import is seen."""
    env = {"FARM_TEST_IMPORT_MARKER": str(marker), "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", "import tests.evil_import"], env=env, check=True)
    assert marker.exists()


def test_prefixes_match_whole_dotted_names():
    assert POLICY.item_refusal("tests.kinds.record") is None
    assert POLICY.item_refusal("tests.kinds.sub.fn") is None
    assert "not allowed" in POLICY.item_refusal("tests.kindsx.record")
    assert "not allowed" in POLICY.item_refusal("tests.record")
    assert "not allowed" in POLICY.item_refusal("os.system")
    assert POLICY.item_refusal("jobs.chunk.run_chunk") is None  # the farm's own
    assert "not allowed" in JobPolicy().item_refusal("tests.kinds.record")
    for bad in ("tests.kinds._private", "tests.kinds.__class__", "record", "a..b", 42, None):
        assert "dotted" in POLICY.item_refusal(bad)
    assert POLICY.handler_refusal("loaders.migration.migrate.load_chunk") is None
    assert "not allowed" in POLICY.handler_refusal("loaders.migration.migrate.plan")


def test_flags_override_the_variable_and_bad_prefixes_are_one_line():
    env = {"FARM_JOB_MODULES": "a.b, c"}
    assert JobPolicy.from_env(env).modules == ("a.b", "c")
    assert JobPolicy.from_env(env, flags=["d", "e.f,g"]).modules == ("d", "e.f", "g")
    with pytest.raises(ForbiddenJobError, match="bad module prefix"):
        parse_modules(["ok, os;rm"])


def test_names_outside_the_list_are_refused_before_import(marker):
    with pytest.raises(ForbiddenJobError, match="not allowed"):
        POLICY.load_item("tests.evil_import.run")
    with pytest.raises(ForbiddenJobError, match="not allowed"):
        POLICY.load_handler("tests.evil_import.run")
    assert not marker.exists()


def test_a_function_merely_imported_into_an_allowed_module_is_refused():
    """tests.kinds imports rq's get_current_job: it is rq's function, not tests.kinds'."""
    with pytest.raises(ForbiddenJobError, match=r"rq\.job\.get_current_job"):
        POLICY.load_item("tests.kinds.get_current_job")
    assert callable(POLICY.load_item("tests.kinds.record"))


def _job(conn, func, *args, **kwargs) -> FarmJob:
    """A job as anyone who can write to Redis could enqueue it, read back as workers do."""
    job = Queue("t", connection=conn, serializer=JSONSerializer).enqueue(func, *args, **kwargs)
    return FarmJob.fetch(job.id, connection=conn, serializer=JSONSerializer)


def test_job_refusals(conn):
    items = [["i1", {"key": "a", "value": 1}]]
    ok = _job(conn, ENTRY_POINT, function="tests.kinds.record", items=items)
    assert job_refusal(ok, POLICY) is None
    cases = {
        "not the farm's entry point": _job(conn, "os.system", "echo hi"),
        "not allowed": _job(conn, ENTRY_POINT, function="subprocess.getoutput", items=items),
        "callback": _job(conn, ENTRY_POINT, function="tests.kinds.record", items=items,
                         on_failure=Callback("tests.evil_import.run")),
        "malformed": _job(conn, ENTRY_POINT, function="tests.kinds.record", items=[["x", 1]]),
        "keyword arguments only": _job(conn, ENTRY_POINT, "tests.kinds.record", items),
    }
    for why, job in cases.items():
        assert why in (job_refusal(job, POLICY) or ""), why
    pickled = _job(conn, ENTRY_POINT, function="tests.kinds.record", items=items)
    conn.hset(pickled.key, "data", zlib.compress(pickle.dumps(("os.system", None, ["x"], {}))))
    pickled = FarmJob.fetch(pickled.id, connection=conn, serializer=JSONSerializer)
    assert "not JSON" in job_refusal(pickled, POLICY)


def test_farm_jobs_never_import_callbacks_or_foreign_functions(conn, marker):
    evil = Callback("tests.evil_import.run")
    job = _job(conn, "tests.evil_import.run", on_success=evil, on_failure=evil, on_stopped=evil)
    assert job.success_callback is None and job.failure_callback is None
    assert job.stopped_callback is None
    with pytest.raises(ForbiddenJobError, match="entry point"):
        job.func  # noqa: B018 - the property is the gate
    assert not marker.exists()
    assert conn.hget(job.key, "failure_callback_name") == b"tests.evil_import.run"


def test_runs_recorded_before_the_handlers_moved_are_served_by_the_same_functions():
    from jobs.policy import RENAMED_HANDLERS
    policy = JobPolicy()
    for old, new in RENAMED_HANDLERS.items():
        assert policy.handler_refusal(old) is None
        assert policy.load_handler(old) is policy.load_handler(new)
    assert policy.handler_refusal("loaders.migrate.os") is not None  # only those names


def test_the_farm_handlers_named_as_text_are_the_modules_handlers():
    """``FARM_HANDLERS`` (checked without importing every handler module) is exactly the
    ``HANDLER`` of each module that runs the farm's own chunks."""
    import importlib

    from jobs.policy import FARM_HANDLERS
    modules = {name.rpartition(".")[0] for name in FARM_HANDLERS}
    assert {importlib.import_module(m).HANDLER for m in modules} == FARM_HANDLERS
    found = subprocess.run(["git", "grep", "-l", "^HANDLER = ", "--", "*.py", ":!tests/"],
                           cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    assert {f[:-3].replace("/", ".") for f in found} == modules


def test_workers_import_the_farm_before_the_working_directory(tmp_path, farm_env, conn,
                                                              marker):
    """A folder named like a farm package where ``farm workers`` starts is not imported in
    the farm's place; the operator's own job modules there still import (appended last)."""
    (tmp_path / "workers").mkdir()
    (tmp_path / "workers" / "__init__.py").write_text("")
    (tmp_path / "workers" / "worker.py").write_text(
        "import os, pathlib\n"
        "pathlib.Path(os.environ['FARM_TEST_IMPORT_MARKER']).write_text('imported')\n")
    (tmp_path / "herejobs.py").write_text(
        "from rq import get_current_job\n\n\n"
        "def note(key: str) -> None:\n"
        "    get_current_job().connection.hset('test:here', key, 1)\n")
    env = {**farm_env, "FARM_JOB_MODULES": "herejobs", "FARM_TEST_IMPORT_MARKER": str(marker)}
    farm = str(Path(sys.executable).with_name("farm"))  # the console command, as installed

    def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([farm, *args], cwd=tmp_path, env=env, input=stdin, text=True,
                              capture_output=True, timeout=120)
    sent = run("enqueue", "farm", "herejobs.note", "--file", "-", stdin='{"key": "a"}\n')
    assert sent.returncode == 0, sent.stderr
    done = run("workers", "--count", "1", "--burst")
    assert done.returncode == 0, done.stdout + done.stderr
    assert not marker.exists()  # the farm's workers.worker ran, not the folder's
    assert conn.hgetall("test:here") == {b"a": b"1"}  # the operator's module did import
