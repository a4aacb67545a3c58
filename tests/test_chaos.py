"""A migration under fire: SIGKILLed workers, a Redis that loses everything, MySQL
connections killed server-side. It must still end exact: ``farm verify`` passes and
the independent checker finds nothing."""

import json
import os
import random
import re
import signal
import subprocess
import time

import pymysql
import pytest
import redis

from jobs import runs
from jobs.runtime import Runtime
from tests.conftest import run_farm
from tests.contract_checker import check_migration
from tests.farmkit import children, start_workers, stop
from tests.migratekit import last_json, quarantine_rows, truncate_target

pytestmark = pytest.mark.slow  # end-to-end: real workers, servers or long waits


def _suite_pids() -> set[int]:
    """This test process and every process it started (workers, farm commands)."""
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True)
    parent = {int(a): int(b) for a, b in (line.split() for line in out.stdout.splitlines())}
    mine, grew = {os.getpid()}, True
    while grew:
        more = {p for p, pp in parent.items() if pp in mine} - mine
        mine |= more
        grew = bool(more)
    return mine


def _client_ports(port: int, pids: set[int]) -> set[int]:
    """Local ports of the TCP connections ``pids`` hold to 127.0.0.1:``port``."""
    out = subprocess.run(["ss", "-tnpH", "state", "established", "dst", f"127.0.0.1:{port}"],
                         capture_output=True, text=True)
    ports = set()
    for line in out.stdout.splitlines():
        owners = {int(p) for p in re.findall(r"pid=(\d+)", line)}
        local = line.split()[2] if line.split()[0].isdigit() else line.split()[3]
        if owners & pids:
            ports.add(int(local.rsplit(":", 1)[1]))
    return ports


def _kill_connections(port: int, shared: bool = False) -> int:
    """KILL every client connection on the server except this one; on a ``shared`` server
    only the connections of this suite's processes (other suites may be running there)."""
    ports = _client_ports(port, _suite_pids()) if shared else None
    conn = pymysql.connect(host="127.0.0.1", port=port, user="root", autocommit=True)
    killed = 0
    with conn.cursor() as cur:
        cur.execute("SELECT id, host FROM information_schema.processlist "
                    "WHERE id <> CONNECTION_ID() AND command NOT IN ('Daemon', 'Binlog Dump') "
                    "AND user = 'root'")
        for pid, host in cur.fetchall():
            if ports is not None and int(str(host).rsplit(":", 1)[-1] or 0) not in ports:
                continue
            try:
                cur.execute("KILL CONNECTION %s", (pid,))
                killed += 1
            except pymysql.MySQLError:
                pass  # already gone
    conn.close()
    return killed


def _kwargs(dsn) -> dict:
    return {"host": dsn.host, "port": dsn.port, "user": dsn.user, "password": dsn.password,
            "database": dsn.database}


def test_migration_survives_chaos(farm_env, settings, router, ledger, server_b, map_path):
    env = {**farm_env, "FARM_LEASE_SECONDS": "4"}
    conn = redis.Redis.from_url(settings.redis_url)
    conn.flushdb()
    truncate_target(server_b.port)
    assert run_farm(env, "legacy", "generate", "--users", "200", "--seed", "23",
                    "--replace").returncode == 0
    workers = start_workers(env, 2)
    rt = Runtime(settings)
    rng = random.Random(5)
    done = {"sigkill": 0, "flush": 0, "mysql_kill": 0}
    try:
        out = run_farm(env, "migrate", "--chunk-size", "60")
        run_id = last_json(out.stdout)["run_id"]
        deadline = time.monotonic() + 600  # a hang guard, not a speed check

        def sigkill():
            if children(workers.pid):
                os.kill(rng.choice(children(workers.pid)), signal.SIGKILL)
                done["sigkill"] += 1

        def mysql_kill():
            done["mysql_kill"] += (_kill_connections(3306, shared=True)
                                   + _kill_connections(server_b.port))

        def flush_and_resume():
            conn.flushdb()  # Redis lost everything mid-run
            done["flush"] += 1
            assert run_farm(env, "resume", run_id).returncode == 0

        script = [sigkill, mysql_kill, flush_and_resume, sigkill, mysql_kill]
        while rt.ledger.refresh_status(run_id) != "done":
            assert time.monotonic() < deadline, rt.ledger.progress(run_id)
            if rt.ledger.progress(run_id)[0]["done"] or not script:
                action = script.pop(0) if script else rng.choice([sigkill, mysql_kill])
                action()
            time.sleep(0.5)
        assert not script, "the run ended before every kind of chaos happened"
        assert done["sigkill"] >= 1 and done["flush"] == 1 and done["mysql_kill"] >= 1, done
        out = run_farm(env, "verify", timeout=600)
        assert out.returncode == 0, out.stdout + out.stderr
        assert json.loads(out.stdout.strip().splitlines()[-1])["mismatches"] == 0
    finally:
        stop(workers)
        rt.close()
    problems = check_migration(_kwargs(settings.legacy_dsn), json.loads(map_path.read_text()),
                               quarantine_rows(_kwargs(settings.control_dsn), run_id))
    assert problems == []
    summary = runs.summary(Runtime(settings), run_id)
    assert summary["failed_chunks"] == 0
