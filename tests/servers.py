"""Real services for the tests: the machine's MariaDB and Redis, and private mariadbd servers."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Self

import pymysql
import redis

MARIADBD = shutil.which("mariadbd") or "/usr/sbin/mariadbd"
INSTALL_DB = shutil.which("mariadb-install-db") or "/usr/bin/mariadb-install-db"
REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


def free_port(bind: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (on address ``bind``)."""
    with socket.socket() as s:
        s.bind((bind, 0))
        return s.getsockname()[1]


def mysql_alive(host: str = "127.0.0.1", port: int = 3306) -> str | None:
    """``None`` when MariaDB answers, else the reason."""
    try:
        pymysql.connect(host=host, port=port, user="root", connect_timeout=3).close()
        return None
    except pymysql.MySQLError as exc:
        return str(exc)


def redis_alive(url: str = "redis://127.0.0.1:6379/0") -> str | None:
    """``None`` when Redis answers, else the reason."""
    try:
        redis.Redis.from_url(url, socket_connect_timeout=3).ping()
        return None
    except redis.RedisError as exc:
        return str(exc)


@dataclass
class PrivateMariaDB:
    """A mariadbd on a free port with its own data directory; ``stop()`` removes it."""

    port: int
    datadir: Path
    proc: subprocess.Popen
    host: str = "127.0.0.1"

    @classmethod
    def start(cls, buffer_pool: str = "128M", bind: str = "127.0.0.1") -> PrivateMariaDB:
        """A test server: small buffer pool, relaxed durability, LOCAL INFILE allowed,
        listening on ``bind``."""
        return cls.launch({"innodb-buffer-pool-size": buffer_pool,
                           "innodb-flush-log-at-trx-commit": "2", "local-infile": "1",
                           "max-connections": "500"}, bind=bind)

    @classmethod
    def start_binlog(cls, server_id: int = 1, **extra: str) -> PrivateMariaDB:
        """A test server that writes a ROW-format binary log with GTIDs (``log_bin=ON``),
        as a legacy server followed by ``farm sync`` or the master of a pair must."""
        return cls.launch({"innodb-buffer-pool-size": "128M",
                           "innodb-flush-log-at-trx-commit": "2", "local-infile": "1",
                           "max-connections": "500", "server-id": str(server_id),
                           "log-bin": "mariadb-bin", "binlog-format": "ROW",
                           "log-slave-updates": "1", "gtid-strict-mode": "1",
                           "binlog-row-image": "FULL",
                           **{k.replace("_", "-"): v for k, v in extra.items()}},
                          prefix="farm-binlog-")

    def connect(self, **kwargs: object) -> pymysql.Connection:
        """A root connection to this server (autocommit)."""
        return pymysql.connect(host=self.host, port=self.port, user="root",
                               autocommit=True, **kwargs)

    def sql(self, statement: str, args: tuple = ()) -> list[tuple]:
        """Run one statement as root and return its rows."""
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                cur.execute(statement, args)
                return list(cur.fetchall())
        finally:
            conn.close()

    def kill(self) -> None:
        """SIGKILL the server (a dead master); the data directory stays until ``stop()``."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    @classmethod
    def launch(cls, options: dict[str, str], *, prefix: str = "farm-mariadb-",
               alive: Callable[[int], str | None] | None = None,
               timeout: float = 60, bind: str = "127.0.0.1") -> Self:
        """Initialise a data directory, start ``mariadbd`` with ``options`` (``--name=value``
        each) on a free port of ``bind``, and wait until ``alive(port)`` is ``None``."""
        base = Path(tempfile.mkdtemp(prefix=prefix))
        datadir = base / "data"
        done = subprocess.run([INSTALL_DB, "--no-defaults", f"--datadir={datadir}",
                               "--user=root", "--auth-root-authentication-method=normal",
                               "--skip-test-db", f"--tmpdir={base}"],  # nothing shared in /tmp
                              capture_output=True, text=True)
        if done.returncode:
            shutil.rmtree(base, ignore_errors=True)
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise RuntimeError(f"{INSTALL_DB} exited {done.returncode}: " + " | ".join(tail))
        port = free_port(bind)
        if bind != "127.0.0.1":  # root comes over the network: let it in from anywhere
            (base / "init.sql").write_text(
                "CREATE USER IF NOT EXISTS 'root'@'%' IDENTIFIED BY '';\n"
                "GRANT ALL PRIVILEGES ON *.* TO 'root'@'%' WITH GRANT OPTION;\n")
            options = {**options, "init-file": str(base / "init.sql")}
        log = open(base / "error.log", "wb")  # noqa: SIM115 - lives as long as the server
        proc = subprocess.Popen(
            [MARIADBD, "--no-defaults", f"--datadir={datadir}", f"--port={port}",
             f"--bind-address={bind}", f"--socket={base / 'sock'}", "--user=root",
             *([] if "log-bin" in options else ["--skip-log-bin"]),
             *([] if "tmpdir" in options else [f"--tmpdir={base}"]),  # not /tmp: shared
             f"--pid-file={base / 'pid'}",
             *(f"--{k}={v}" for k, v in options.items())],
            stdout=log, stderr=subprocess.STDOUT)
        server = cls(port, datadir, proc, bind)
        deadline = time.monotonic() + timeout
        alive = alive or (lambda p: mysql_alive(host=bind, port=p))
        while alive(port) is not None:
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = (base / "error.log").read_text(errors="replace").splitlines()[-5:]
                server.stop()
                raise RuntimeError("private mariadbd did not start: " + " | ".join(tail))
            time.sleep(0.1)
        return server

    def stop(self) -> None:
        """Shut the server down and delete its data directory."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.datadir.parent, ignore_errors=True)


@dataclass
class PrivateRedis:
    """A ``redis-server`` on a free port of ``host`` (no persistence); ``stop()`` ends it."""

    host: str
    port: int
    proc: subprocess.Popen

    @classmethod
    def start(cls, bind: str = "127.0.0.1", timeout: float = 20,
              port: int | None = None) -> PrivateRedis:
        """Start it (on ``port``, or a free one) and wait until it answers."""
        port = port or free_port(bind)
        proc = subprocess.Popen([REDIS_SERVER, "--bind", bind, "--port", str(port), "--save", "",
                                 "--appendonly", "no", "--protected-mode", "no"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        server = cls(bind, port, proc)
        deadline = time.monotonic() + timeout
        while redis_alive(server.url()) is not None:
            if proc.poll() is not None or time.monotonic() > deadline:
                server.stop()
                raise RuntimeError(f"private redis-server on {bind}:{port} did not start")
            time.sleep(0.05)
        return server

    def url(self, db: int = 0) -> str:
        """``redis://host:port/db``."""
        return f"redis://{self.host}:{self.port}/{db}"

    def stop(self) -> None:
        """Terminate the server."""
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)


@dataclass
class ReplicationPair:
    """A master and a slave, both private ``mariadbd`` servers with binlog and GTID, the
    slave replicating from the master (``MASTER_USE_GTID=slave_pos``)."""

    master: PrivateMariaDB
    slave: PrivateMariaDB

    @classmethod
    def start(cls, first_server_id: int = 1) -> ReplicationPair:
        """Start both servers and replication; returns once the slave's threads run."""
        master = PrivateMariaDB.start_binlog(first_server_id)
        try:
            slave = PrivateMariaDB.start_binlog(first_server_id + 1)
        except Exception:
            master.stop()
            raise
        pair = cls(master, slave)
        try:
            pair.replicate(slave, master)
        except Exception:
            pair.stop()
            raise
        return pair

    @staticmethod
    def replicate(slave: PrivateMariaDB, master: PrivateMariaDB, timeout: float = 30) -> None:
        """Point ``slave`` at ``master`` by GTID and wait until both threads run."""
        slave.sql("STOP SLAVE")
        slave.sql("CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT=%s, "
                  "MASTER_USER='root', MASTER_PASSWORD='', MASTER_USE_GTID=slave_pos",
                  (master.port,))
        slave.sql("START SLAVE")
        deadline = time.monotonic() + timeout
        while True:
            status = slave_status(slave)
            if status.get("Slave_IO_Running") == "Yes" and status.get(
                    "Slave_SQL_Running") == "Yes":
                return
            if time.monotonic() > deadline:
                raise RuntimeError("replication did not start: "
                                   f"{status.get('Last_IO_Error') or status.get('Last_SQL_Error')}")
            time.sleep(0.1)

    def wait_caught_up(self, timeout: float = 30) -> None:
        """Wait until the slave has applied every GTID the master has written."""
        pos = self.master.sql("SELECT @@gtid_binlog_pos")[0][0]
        rows = self.slave.sql("SELECT MASTER_GTID_WAIT(%s, %s)", (pos, timeout))
        if rows[0][0] != 0:
            raise RuntimeError(f"slave did not reach {pos} within {timeout}s")

    def stop(self) -> None:
        """Stop both servers and delete their data directories."""
        self.slave.stop()
        self.master.stop()


def slave_status(server: PrivateMariaDB) -> dict[str, str]:
    """``SHOW SLAVE STATUS`` of ``server`` as a dict (empty when it replicates nothing)."""
    conn = server.connect()
    try:
        with conn.cursor(pymysql.cursors.DictCursor) as cur:
            cur.execute("SHOW SLAVE STATUS")
            row = cur.fetchone()
            return {k: "" if v is None else str(v) for k, v in (row or {}).items()}
    finally:
        conn.close()
