"""Which farm a control database is (``farmcore.identity``): made once, the same for every
reader, different for another control database; supervisors report it, and a command that
starts a run while workers serve another control database says so."""

from __future__ import annotations

import json

import pytest
import redis
from rq import Worker

from farmcore import control_schema, keys
from farmcore.identity import farm_id
from farmcore.ledger import Ledger
from shardfarm.mysql.db import connect
from shardfarm.mysql.dsn import DSN
from tests.conftest import ns_db, park_unfinished_runs, run_farm
from tests.farmkit import start_workers, stop, until

OTHER = ns_db("farm_control_other")


@pytest.fixture
def other_control(settings):
    """A second control database on the same server (another farm's)."""
    dsn = DSN.parse(settings.control_dsn.url().rsplit("/", 1)[0] + f"/{OTHER}",
                    what="FARM_CONTROL_DSN")
    control_schema.ensure(_made(dsn))
    yield dsn
    conn = connect(dsn, database=False)
    with conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS `{OTHER}`")
    conn.close()


def _made(dsn: DSN) -> DSN:
    conn = connect(dsn, database=False)
    with conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE IF NOT EXISTS `{dsn.database}`")
    conn.close()
    return dsn


def test_a_control_database_has_one_farm_id_made_once(ledger, settings, other_control):
    ours = farm_id(ledger.pool)
    assert ours and len(ours) == 36
    control_schema.ensure(settings.control_dsn)  # 'farm shards init' again: the same farm
    assert farm_id(ledger.pool) == ours
    other = Ledger(other_control)
    try:
        assert farm_id(other.pool) not in (None, ours)
    finally:
        other.close()


def test_no_farm_id_before_shards_init(settings):
    missing = DSN.parse(settings.control_dsn.url().rsplit("/", 1)[0] + "/farm_not_made_yet",
                        what="FARM_CONTROL_DSN")
    led = Ledger(missing)
    try:
        assert farm_id(led.pool) is None
    finally:
        led.close()


@pytest.mark.usefixtures("park_leftover_runs")
def test_a_run_started_while_workers_serve_another_control_database_says_so(
        env, ledger, other_control, tmp_path):
    park_unfinished_runs(ledger)
    conn = redis.Redis.from_url(env["FARM_REDIS_URL"])
    other = Ledger(other_control)
    theirs = farm_id(other.pool)
    other.close()
    proc = start_workers({**env, "FARM_CONTROL_DSN": other_control.url()}, 1)
    try:
        until(lambda: any(json.loads(v).get("farm_id") == theirs
                          for v in conn.hvals(keys.supervisors()))
              and Worker.count(connection=conn) > 0, timeout=60,
              what="the supervisor to report its farm, and its worker to be alive")
        out = run_farm(env, "export", "--date", "2026-11-20", "--tables", "users", "--dest",
                       f"file://{tmp_path}", timeout=120)
        shown = run_farm(env, "status", timeout=60)
    finally:
        stop(proc)
    assert out.returncode == 0, out.stderr
    said = [x for x in out.stderr.splitlines() if "another control database" in x]
    assert len(said) == 1, out.stderr
    assert f"/{ledger.pool.where.database}" in said[0] and "FARM_CONTROL_DSN" in said[0]
    workers = next(x for x in shown.stdout.splitlines() if x.startswith("workers:"))
    assert "SERVING ANOTHER CONTROL DATABASE" in workers, shown.stdout


def test_a_burst_on_a_control_database_that_is_not_there_stops_before_any_worker(farm_env):
    """A misspelt control database: a burst (a script waits on it) exited 0 when its queue
    was empty, its housekeeping waiting on the database; now it stops at once in one line
    naming the database and what to run, exit 1, as a wrong password does. A daemon still
    waits for ``farm shards init`` (workers may be deployed first)."""
    missing = ns_db("farm_control_misspelt")
    dsn = farm_env["FARM_CONTROL_DSN"].rsplit("/", 1)[0] + f"/{missing}"
    out = run_farm({**farm_env, "FARM_CONTROL_DSN": dsn}, "workers", "--burst", "--count",
                   "1", "--queues", "farm", timeout=60)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    errors = [x for x in out.stderr.splitlines() if x.startswith("farm: error:")]
    assert len(errors) == 1 and f"Unknown database '{missing}'" in errors[0], out.stderr
    assert "farm shards init" in errors[0] and "FARM_CONTROL_DSN" in errors[0], errors[0]
