"""Shared fixtures: real MariaDB (two servers) and Redis, a two-server test shard map.

The test map uses shards 65024-65039 so it never touches the demo's ``db00000``…
on the shared server: shards 65024-65031 live on the machine's MariaDB (3306),
65032-65039 and every mod bucket on a private mariadbd the tests start and stop.
"""

from __future__ import annotations

import getpass
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pymysql
import pytest
import redis

from shardfarm.settings import Settings
from sharding.mapsource import ShardMapSource
from sharding.provision import init_databases
from sharding.router import Router
from tests.servers import PrivateMariaDB, mysql_alive, redis_alive

ROOT = Path(__file__).resolve().parent.parent
# Several suites may run at once on one machine's shared servers (CI beside a developer,
# parallel sessions): FARM_TEST_NS=N (0..6) gives each its own shard numbers, databases on
# 3306 and Redis databases. Everything the suite makes there is dropped at the end. Under
# pytest-xdist (``-n K``) worker gwI is namespace N + I: each a suite of its own.
NS = int(os.environ.get("FARM_TEST_NS") or 0) + int(
    os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
if not 0 <= NS <= 6:
    raise RuntimeError(f"FARM_TEST_NS={NS} (with the xdist worker's number) out of range 0..6")
_BASE = 65024 - 16 * NS
SHARDS_A = (_BASE, _BASE + 7)
SHARDS_B = (_BASE + 8, _BASE + 15)
TEST_BUCKETS = 64
REDIS_DB = 15 - 2 * NS  # the suite's Redis database; the demo test uses the one below it
DEMO_REDIS_DB = REDIS_DB - 1


# The functions the tests enqueue live in tests.kinds: allowed the way an operator allows a
# module (FARM_JOB_MODULES), for in-process workers and every farm subprocess alike.
os.environ["FARM_JOB_MODULES"] = "tests.kinds"


def ns_db(base: str) -> str:
    """The name of a test database on the shared server, in this suite's namespace."""
    return f"{base}{NS}" if NS else base


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Each namespace's temporary files under a base of its own (unless ``--basetemp`` is
    given): pytest keeps only a user's three newest numbered bases and deletes older ones,
    so suites started beside a running one deleted its files (its private mariadbd's data,
    mid-test). It lies in pytest's directory of this user (mode 0700), outside the numbered
    bases pytest deletes."""
    if config.option.basetemp:
        return
    root = Path(tempfile.gettempdir()) / f"pytest-of-{getpass.getuser()}"  # pytest's own
    root.mkdir(mode=0o700, exist_ok=True)
    if root.stat().st_uid == os.getuid():  # else (another user's) pytest's default
        config.option.basetemp = str(root / f"shardfarm-ns{NS}")


def pytest_sessionstart(session: pytest.Session) -> None:
    """Fail (never skip) when a required service is missing."""
    problems = []
    if (why := mysql_alive()) is not None:
        problems.append(f"MariaDB on 127.0.0.1:3306 does not answer: {why}")
    if (why := redis_alive()) is not None:
        problems.append(f"Redis on 127.0.0.1:6379 does not answer: {why}")
    if problems:
        pytest.exit("required services missing:\n  " + "\n  ".join(problems), returncode=3)


@pytest.fixture(scope="session", autouse=True)
def leave_nothing_behind():
    """After the suite, drop what it made on the shared servers (shards A, control, legacy)
    and empty its Redis databases; private servers are removed by their own fixtures."""
    yield
    names = [f"db{s:05d}" for s in range(SHARDS_A[0], SHARDS_A[1] + 1)]
    names += [ns_db("farm_control_test"), ns_db("legacy_test")]
    conn = pymysql.connect(host="127.0.0.1", port=3306, user="root", autocommit=True)
    try:
        with conn.cursor() as cur:
            for name in names:
                cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
    finally:
        conn.close()
    for db in (REDIS_DB, DEMO_REDIS_DB):
        redis.Redis(host="127.0.0.1", port=6379, db=db).flushdb()


@pytest.fixture(scope="session")
def server_b():
    """A second MariaDB server for the test shard map."""
    server = PrivateMariaDB.start()
    yield server
    server.stop()


def make_map_doc(port_b: int) -> dict:
    """The two-server test shard map."""
    a = {"host": "127.0.0.1", "port": 3306, "user": "root", "password": ""}
    b = {"host": "127.0.0.1", "port": port_b, "user": "root", "password": ""}
    return {
        "version": 1,
        "hosts": {"TestA1": a, "TestA2": dict(a), "TestB1": b, "TestB2": dict(b)},
        "shards": [{"range": list(SHARDS_A), "master": "TestA1", "slave": "TestA2"},
                   {"range": list(SHARDS_B), "master": "TestB1", "slave": "TestB2"}],
        "open": [[SHARDS_A[0], SHARDS_B[1]]],
        "mod": {"buckets": TEST_BUCKETS,
                "ranges": [{"range": [0, TEST_BUCKETS - 1], "master": "TestB1",
                            "slave": "TestB2"}]},
    }


@pytest.fixture(scope="session")
def map_path(server_b, tmp_path_factory) -> Path:
    """The test shard map written to a file."""
    path = tmp_path_factory.mktemp("map") / "shardmap.json"
    path.write_text(json.dumps(make_map_doc(server_b.port)))
    return path


@pytest.fixture(scope="session")
def farm_env(map_path) -> dict[str, str]:
    """Environment for ``farm`` subprocesses pointed at the test setup."""
    env = dict(os.environ)
    env.update({
        "FARM_SHARDMAP": str(map_path),
        "FARM_CONTROL_DSN": f"mysql://root@127.0.0.1:3306/{ns_db('farm_control_test')}",
        "FARM_LEGACY_DSN": f"mysql://root@127.0.0.1:3306/{ns_db('legacy_test')}",
        "FARM_REDIS_URL": f"redis://127.0.0.1:6379/{REDIS_DB}",
        "PYTHONPATH": str(ROOT),
    })
    return env


@pytest.fixture(scope="session")
def settings(farm_env) -> Settings:
    """Settings of the test setup."""
    return Settings.from_env(farm_env)


@pytest.fixture(scope="session")
def router(map_path) -> Router:
    """A router over the two-server test map, with every database created."""
    r = Router(ShardMapSource(map_path))
    init_databases(r)
    yield r
    r.close()


def run_farm(env: dict[str, str], *args: str, input: str | None = None,
             timeout: float = 300) -> subprocess.CompletedProcess:
    """Run the real ``farm`` command in a subprocess."""
    return subprocess.run([sys.executable, "-m", "scripts", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, input=input, timeout=timeout)


@pytest.fixture(scope="session")
def ledger(settings):
    """The chunk ledger on a fresh test control database."""
    from farmcore import control_schema
    from farmcore.ledger import Ledger
    from shardfarm.mysql.db import connect, ensure_database
    conn = connect(settings.control_dsn, database=False)
    with conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS `{settings.control_dsn.database}`")
    conn.close()
    ensure_database(settings.control_dsn)
    control_schema.ensure(settings.control_dsn)
    led = Ledger(settings.control_dsn)
    _LEDGER.append(led)
    yield led
    _LEDGER.clear()
    led.close()


_LEDGER: list = []  # the session's ledger, once a test asked for it


@pytest.fixture(scope="module", autouse=True)
def no_run_left_running():
    """After each module, cancel the runs it left running or paused (a test that runs a
    chunk or two in-process, or kills its workers, leaves its run unfinished): the next
    module's workers would otherwise take up their chunks (housekeeping dispatches the
    pending chunks of every running run) beside that module's own runs. Concurrent runs
    are tested where a test makes them on purpose."""
    yield
    for led in _LEDGER:
        for run_id in led.runs(limit=10_000, active_only=True):
            led.cancel(run_id)


@pytest.fixture
def env(farm_env, ledger, router) -> dict[str, str]:
    """A farm environment with 3 s leases (workers killed in a test are replaced quickly) on
    an empty Redis database, emptied again after the test."""
    e = {**farm_env, "FARM_LEASE_SECONDS": "3", "FARM_LOG_LEVEL": "INFO"}
    redis.Redis.from_url(e["FARM_REDIS_URL"]).flushdb()
    yield e
    redis.Redis.from_url(e["FARM_REDIS_URL"]).flushdb()


@pytest.fixture
def plain_env(farm_env, ledger) -> dict[str, str]:
    """The farm environment with the defaults operators get (leases, log level) on an empty
    Redis database, emptied again after the test."""
    redis.Redis.from_url(farm_env["FARM_REDIS_URL"]).flushdb()
    yield dict(farm_env)
    redis.Redis.from_url(farm_env["FARM_REDIS_URL"]).flushdb()


@pytest.fixture
def plain_conn(plain_env) -> redis.Redis:
    """A client of ``plain_env``'s Redis database."""
    return redis.Redis.from_url(plain_env["FARM_REDIS_URL"])


def park_unfinished_runs(ledger, keep: set[str] = frozenset()) -> None:
    """Pause every unfinished run of the session's ledger but ``keep``: no worker of a later
    test runs their chunks, and ``farm retry-failed`` leaves them alone."""
    for run_id in set(ledger.runs(limit=1000, unfinished=True)) - keep:
        ledger.set_paused(run_id, True)


@pytest.fixture
def park_leftover_runs(ledger):
    """After the test, pause the runs it left unfinished (workers of later tests serve the
    whole session's ledger)."""
    before = set(ledger.runs(limit=1000, unfinished=True))
    yield
    park_unfinished_runs(ledger, keep=before)


@pytest.fixture
def rt(settings, env):
    """A runtime (router, ledger, Redis) of the test setup, closed after the test."""
    from jobs.runtime import Runtime
    r = Runtime(settings)
    yield r
    r.close()



@pytest.fixture(scope="session")
def zk_server():
    """A private ZooKeeper server (the shard map in ZooKeeper)."""
    from tests.zkserver import PrivateZooKeeper
    server = PrivateZooKeeper.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def repl_pair():
    """A real master -> slave replication pair (GTID) for capacity tests that keep it alive."""
    from tests.servers import ReplicationPair
    pair = ReplicationPair.start(first_server_id=61)
    yield pair
    pair.stop()


def map_with_pair(port_b: int, pair, version: int = 1) -> dict:
    """The test map plus the pair's hosts ``PairM`` (master) and ``PairS`` (slave)."""
    doc = make_map_doc(port_b)
    doc["version"] = version
    for name, server in (("PairM", pair.master), ("PairS", pair.slave)):
        doc["hosts"][name] = {"host": "127.0.0.1", "port": server.port, "user": "root",
                              "password": ""}
    return doc
