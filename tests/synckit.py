"""What the ``farm sync`` tests share: a private mariadbd writing a ROW binlog as the legacy
server, an environment whose legacy database is there (workers running, a fresh sync
state), the application's writes, the independent check of the target, and ``farm sync``
started in the background."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pymysql
import pytest
import redis

from tests.conftest import ROOT, run_farm
from tests.contract_checker import check_migration
from tests.farmkit import start_workers, stop
from tests.migratekit import quarantine_rows, truncate_target
from tests.servers import PrivateMariaDB

USERS = 40


@pytest.fixture(scope="module")
def legacy_server():
    """The legacy server: a private mariadbd with a ROW binlog and GTIDs."""
    server = PrivateMariaDB.start_binlog(server_id=7)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def live(farm_env, settings, ledger, router, server_b, legacy_server):
    """An environment whose legacy database is on the binlog server; a fresh sync state."""
    env = {**farm_env, "FARM_LEGACY_DSN": f"mysql://root@127.0.0.1:{legacy_server.port}/legacy",
           "FARM_LEASE_SECONDS": "10"}
    ledger.pool.execute("DELETE FROM sync_state")
    redis.Redis.from_url(settings.redis_url).flushdb()
    truncate_target(server_b.port)
    out = run_farm(env, "legacy", "generate", "--users", str(USERS), "--seed", "31", "--replace")
    assert out.returncode == 0, out.stderr
    legacy_server.sql("CREATE USER IF NOT EXISTS app@'%%' IDENTIFIED BY 'app'")
    legacy_server.sql("GRANT SELECT, INSERT, UPDATE, DELETE ON legacy.* TO app@'%%'")
    procs = start_workers(env, 2)
    yield env
    stop(procs)


def app(server) -> pymysql.Connection:
    """The application's (non-admin) connection to the legacy database."""
    return pymysql.connect(host="127.0.0.1", port=server.port, user="app", password="app",
                           database="legacy", autocommit=True)


def load(server, statements: list[str]) -> None:
    """Run ``statements`` as the application, each its own transaction."""
    conn = app(server)
    try:
        with conn.cursor() as cur:
            for sql in statements:
                cur.execute(sql)
    finally:
        conn.close()


def exact(server, settings, map_path, run_id: str) -> list[str]:
    """Every way the target differs from the legacy database (``[]`` when exact), checked
    by the independent checker against run ``run_id``'s quarantine."""
    legacy = {"host": "127.0.0.1", "port": server.port, "user": "root", "password": "",
              "database": "legacy"}
    c = settings.control_dsn
    control = {"host": c.host, "port": c.port, "user": c.user, "password": c.password,
               "database": c.database}
    return check_migration(legacy, json.loads(map_path.read_text()),
                           quarantine_rows(control, run_id))


def start_sync(env: dict, log: Path | None = None) -> subprocess.Popen:
    """``farm sync`` in the background; with ``log``, at INFO level, its stderr there."""
    args = ["--log-level", "INFO"] if log else []
    err = open(log, "w") if log else subprocess.DEVNULL  # noqa: SIM115 - the child's
    try:
        return subprocess.Popen([sys.executable, "-m", "scripts", *args, "sync"], env=env,
                                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
    finally:
        if log:
            err.close()
