"""A command that fails on a fresh machine leaves nothing behind: the cause (a legacy
database that is missing or unreachable, shards never initialised, Redis down, an export
destination that cannot be used) is found before the control database is created."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pymysql
import pytest

from tests.conftest import NS, ns_db, run_farm
from tests.servers import free_port

FRESH_SHARD = 60000 + NS  # never initialised by any suite


def _exists(database: str) -> bool:
    conn = pymysql.connect(host="127.0.0.1", port=3306, user="root")
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT COUNT(*) FROM information_schema.schemata "
                        "WHERE schema_name = %s", (database,))
            return bool(cur.fetchone()[0])
    finally:
        conn.close()


@pytest.fixture
def fresh_control(farm_env, router):
    """The name of a control database that does not exist (dropped again after the test)."""
    name = ns_db("farm_control_fresh")
    yield name
    conn = pymysql.connect(host="127.0.0.1", port=3306, user="root", autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
    finally:
        conn.close()


@pytest.mark.parametrize("legacy, words", [
    ("127.0.0.1:3306/{missing}", "Unknown database"),
    ("127.0.0.1:{port}/legacy", "cannot reach MySQL legacy"),
])
def test_a_migrate_whose_legacy_database_fails_creates_no_control_database(
        farm_env, fresh_control, legacy, words):
    url = "mysql://root@" + legacy.format(missing=ns_db("no_such_legacy"), port=free_port())
    env = {**farm_env, "FARM_CONTROL_DSN": f"mysql://root@127.0.0.1:3306/{fresh_control}",
           "FARM_LEGACY_DSN": url}
    out = run_farm(env, "migrate", timeout=120)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 1 and len(lines) == 1 and words in lines[0], out.stderr
    assert not _exists(fresh_control), "the failed migrate created the control database"


def test_a_migrate_without_redis_creates_no_control_database(farm_env, fresh_control):
    env = {**farm_env, "FARM_CONTROL_DSN": f"mysql://root@127.0.0.1:3306/{fresh_control}",
           "FARM_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}
    out = run_farm(env, "migrate", timeout=120)
    assert out.returncode == 1 and out.stderr.count("\n") == 1, out.stderr
    assert "Traceback" not in out.stderr
    assert not _exists(fresh_control), "the failed migrate created the control database"


@pytest.mark.parametrize("command", [("migrate",), ("export", "--date", "2026-11-21")])
def test_a_run_on_shards_never_initialised_creates_no_control_database(
        farm_env, fresh_control, tmp_path, command):
    a = {"host": "127.0.0.1", "port": 3306, "user": "root", "password": ""}
    doc = {"version": 1, "hosts": {"A": a, "B": dict(a)},
           "shards": [{"range": [FRESH_SHARD, FRESH_SHARD], "master": "A", "slave": "B"}],
           "open": [[FRESH_SHARD, FRESH_SHARD]],
           "mod": {"buckets": 1, "ranges": [{"range": [0, 0], "master": "A", "slave": "B"}]}}
    (tmp_path / "map.json").write_text(json.dumps(doc))
    env = {**farm_env, "FARM_CONTROL_DSN": f"mysql://root@127.0.0.1:3306/{fresh_control}",
           "FARM_SHARDMAP": str(tmp_path / "map.json"),
           "FARM_EXPORT_URL": f"file://{tmp_path}/exp"}
    out = run_farm(env, *command, timeout=120)
    assert out.returncode == 1 and out.stderr.strip() == (
        f"farm: error: shard {FRESH_SHARD} has no tables on A: run 'farm shards init' first")
    assert not _exists(fresh_control), "the failed command created the control database"


RUNS = [("reverse",), ("rebalance", "board_followedby_users", "--threshold", "10"),
        ("export", "--date", "2026-11-21"), ("feeds", "rebuild"), ("cron", "--once")]


@pytest.mark.parametrize("command", RUNS, ids=lambda c: c[0])
def test_a_run_without_redis_creates_no_control_database(farm_env, fresh_control, tmp_path,
                                                         command):
    env = {**farm_env, "FARM_CONTROL_DSN": f"mysql://root@127.0.0.1:3306/{fresh_control}",
           "FARM_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
           "FARM_EXPORT_URL": f"file://{tmp_path}/exp"}
    out = run_farm(env, *command, timeout=120)
    assert out.returncode == 1 and out.stderr.count("\n") == 1, out.stderr
    assert "Traceback" not in out.stderr and "Redis" in out.stderr, out.stderr
    assert not _exists(fresh_control), "the failed command created the control database"


@pytest.mark.parametrize("command", [("export", "--date", "2026-11-21"), ("cron", "--once")],
                         ids=lambda c: c[0])
def test_an_export_to_a_destination_it_cannot_use_creates_no_control_database(
        farm_env, fresh_control, tmp_path, command):
    (tmp_path / "exp").write_text("a file where the export's folder goes")
    env = {**farm_env, "FARM_CONTROL_DSN": f"mysql://root@127.0.0.1:3306/{fresh_control}",
           "FARM_EXPORT_URL": f"file://{tmp_path}/exp"}
    out = run_farm(env, *command, timeout=120)
    assert out.returncode == 1 and out.stderr.count("\n") == 1, out.stderr
    assert "export destination" in out.stderr, out.stderr
    assert not _exists(fresh_control), "the failed command created the control database"


def test_cron_once_whose_round_fails_unexpectedly_is_one_line_naming_the_slot(
        farm_env, ledger, router, tmp_path):
    """An error that is no FarmError (injected into the export's planning, in the real
    ``farm cron --once`` process) is one line naming the slot, its run and the cause, exit 1.
    Before, it was a traceback."""
    name = f"fresh-once-{NS}"
    probe = ("import sys\nfrom exporters import export\n"
             "def broken(*a, **k):\n    raise RuntimeError('injected: the planner broke')\n"
             "export.plan = broken\nfrom scripts.cli import main\n"
             "main(sys.argv[1:])\n")
    env = {**farm_env, "FARM_EXPORT_URL": f"file://{tmp_path}/exp"}
    out = subprocess.run([sys.executable, "-c", probe, "cron", "--once", "--name", name],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and out.stderr.count("\n") == 1, out.stderr
    assert re.fullmatch(
        rf"farm: error: cron {name}: slot \S+Z \(run cron-{name}-\S+Z\) failed: RuntimeError: "
        r"injected: the planner broke; run farm cron --once again\n", out.stderr), out.stderr
    assert ledger.cron_state.last_slot(name) is None  # nothing fired: the next round fires it


@pytest.mark.parametrize("command", [("reverse",), ("export", "--date", "2026-11-21"),
                                     ("cron", "--once")], ids=lambda c: c[0])
def test_a_run_whose_control_database_is_missing_is_refused_and_makes_none(
        farm_env, fresh_control, tmp_path, command):
    """The fleet has its tables, so FARM_CONTROL_DSN names a control database other than the
    one it was set up with (a typo): a run started in a new one would be a second ledger no
    status of the real one shows. Before, the command made it and started the run there."""
    env = {**farm_env, "FARM_CONTROL_DSN": f"mysql://root@127.0.0.1:3306/{fresh_control}",
           "FARM_EXPORT_URL": f"file://{tmp_path}/exp"}
    out = run_farm(env, *command, timeout=120)
    assert out.returncode == 1, out.stdout + out.stderr
    assert out.stderr.strip() == (
        f"farm: error: the control database {fresh_control} does not exist on control "
        "(root@127.0.0.1:3306): check FARM_CONTROL_DSN, or run 'farm shards init' to create it")
    assert not _exists(fresh_control), "the refused command created the control database"


def test_shards_init_creates_the_control_database(farm_env, fresh_control):
    env = {**farm_env, "FARM_CONTROL_DSN": f"mysql://root@127.0.0.1:3306/{fresh_control}"}
    out = run_farm(env, "shards", "init", timeout=300)
    assert out.returncode == 0, out.stderr
    assert _exists(fresh_control)
