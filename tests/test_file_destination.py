"""``file://`` destinations that cannot be written: a read-only directory is found by the
check before a run starts (as root too: a read-only mount stops root, permissions do not);
a regular file where the export tree needs a directory fails its chunk at once, in one
line naming it, instead of after every retry."""

from __future__ import annotations

import json

import pytest

from exporters.destinations import FileDestination, PathInTheWayError
from shardfarm.errors import ConfigError, FatalError
from tests.conftest import run_farm
from tests.farmkit import start_workers, stop, until
from tests.rofs import read_only

pytestmark = pytest.mark.usefixtures("park_leftover_runs")
DATE = "2026-11-21"


def test_the_check_proves_it_can_write_the_root(tmp_path):
    root = tmp_path / "exports"
    FileDestination(root).check()
    assert root.is_dir() and not list(root.iterdir())  # the probe file is removed
    with read_only(root), pytest.raises(ConfigError) as caught:
        FileDestination(root).check()
    assert str(caught.value) == (f"cannot write to export directory {root}: "
                                 "Read-only file system")


def test_farm_export_to_a_read_only_directory_is_one_line_at_start(env, tmp_path):
    root = tmp_path / "ro"
    with read_only(root):
        out = run_farm(env, "export", "--date", DATE, "--dest", f"file://{root}", timeout=60)
    assert out.returncode == 1, out
    assert out.stderr.strip().splitlines() == [
        f"farm: error: export destination file://{root} cannot be used: cannot write to "
        f"export directory {root}: Read-only file system"]
    assert "run_id" not in out.stdout  # no run was started


@pytest.mark.parametrize("blocker", ["users", f"users/dt={DATE}"])
def test_a_file_in_the_way_is_a_fatal_error_naming_it(tmp_path, blocker):
    dest = FileDestination(tmp_path)
    (tmp_path / blocker).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / blocker).write_text("not a directory")
    key = f"users/dt={DATE}/part-00000.jsonl.gz"
    for call in (lambda: dest.open_part(key), lambda: dest.size(key),
                 lambda: dest.drop_leftovers_of(f"users/dt={DATE}/", ["part-00000.jsonl.gz"])):
        with pytest.raises(PathInTheWayError) as caught:
            call()
        assert isinstance(caught.value, FatalError)
        assert str(caught.value) == (f"export path {tmp_path / blocker} is a file where a "
                                     "directory belongs: move it away or export elsewhere")


def test_a_directory_where_a_part_goes_is_a_fatal_error_naming_it(tmp_path):
    dest = FileDestination(tmp_path)
    target = tmp_path / "users" / f"dt={DATE}" / "part-00000.jsonl.gz"
    target.mkdir(parents=True)
    w = dest.open_part(f"users/dt={DATE}/part-00000.jsonl.gz")
    w.write(b"x")
    with pytest.raises(PathInTheWayError, match=f"export path {target} is a directory where"):
        w.commit()
    w.abort()


@pytest.mark.parametrize("blocker", ["users", f"users/dt={DATE}"])
def test_the_folders_a_run_writes_are_checked_before_it_starts(env, ledger, tmp_path, blocker):
    """A file where a table's folder goes is one line naming it, and no run is created.
    Before, the run started and each of its chunks failed on its first attempt."""
    dest = FileDestination(tmp_path / "exp")
    dest.check_folders([f"users/dt={DATE}/", f"pins/dt={DATE}/"])  # nothing there: fine
    (tmp_path / "exp" / blocker).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / "exp" / blocker).write_text("someone's notes")
    why = (f"export path {tmp_path}/exp/{blocker} is a file where a directory belongs: move "
           "it away or export elsewhere")
    with pytest.raises(PathInTheWayError) as caught:
        dest.check_folders([f"pins/dt={DATE}/", f"users/dt={DATE}/"])
    assert str(caught.value) == why
    before = ledger.runs(limit=1000)
    out = run_farm(env, "export", "--date", DATE, "--dest", f"file://{tmp_path}/exp",
                   timeout=60)
    assert out.returncode == 1 and out.stderr.strip().splitlines() == [
        f"farm: error: export destination file://{tmp_path}/exp cannot be used: {why}"], out
    assert "run_id" not in out.stdout and ledger.runs(limit=1000) == before  # no run


def test_a_run_whose_folder_becomes_a_file_fails_at_once_in_one_line(env, ledger, tmp_path):
    """Real workers: the folder turns into a file after the run started; each chunk of the
    table fails on its first attempt (before, it was tried FARM_CHUNK_ATTEMPTS times with
    backoff, ~40 s), and ``farm failed`` says why."""
    out = run_farm(env, "export", "--date", DATE, "--dest", f"file://{tmp_path}/exp",
                   "--tables", "users", "--json", timeout=60)
    assert out.returncode == 0, out
    run_id = json.loads(out.stdout.strip().splitlines()[-1])["run_id"]
    (tmp_path / "exp" / "users").write_text("someone's notes")
    workers = start_workers(env, 2)
    try:
        until(lambda: ledger.refresh_status(run_id) != "running", timeout=120,
              what="the export run's end")
    finally:
        stop(workers)
    assert ledger.refresh_status(run_id) == "failed"
    failed = ledger.failures(run_id)
    want = (f"PathInTheWayError: export path {tmp_path}/exp/users is a file where a directory"
            " belongs: move it away or export elsewhere")
    assert failed and [(f["attempts"], f["last_error"]) for f in failed] == [(1, want)] * len(
        failed)
