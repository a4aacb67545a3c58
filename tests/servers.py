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


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
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

    @classmethod
    def start(cls, buffer_pool: str = "128M") -> PrivateMariaDB:
        """A test server: small buffer pool, relaxed durability, LOCAL INFILE allowed."""
        return cls.launch({"innodb-buffer-pool-size": buffer_pool,
                           "innodb-flush-log-at-trx-commit": "2", "local-infile": "1",
                           "max-connections": "500"})

    @classmethod
    def launch(cls, options: dict[str, str], *, prefix: str = "farm-mariadb-",
               alive: Callable[[int], str | None] | None = None,
               timeout: float = 60) -> Self:
        """Initialise a data directory, start ``mariadbd`` with ``options`` (``--name=value``
        each) on a free port, and wait until ``alive(port)`` is ``None``."""
        base = Path(tempfile.mkdtemp(prefix=prefix))
        datadir = base / "data"
        subprocess.run([INSTALL_DB, "--no-defaults", f"--datadir={datadir}", "--user=root",
                        "--auth-root-authentication-method=normal", "--skip-test-db"],
                       check=True, capture_output=True)
        port = free_port()
        log = open(base / "error.log", "wb")  # noqa: SIM115 - lives as long as the server
        proc = subprocess.Popen(
            [MARIADBD, "--no-defaults", f"--datadir={datadir}", f"--port={port}",
             "--bind-address=127.0.0.1", f"--socket={base / 'sock'}", "--user=root",
             "--skip-log-bin", f"--pid-file={base / 'pid'}",
             *(f"--{k}={v}" for k, v in options.items())],
            stdout=log, stderr=subprocess.STDOUT)
        server = cls(port, datadir, proc)
        deadline = time.monotonic() + timeout
        alive = alive or (lambda p: mysql_alive(port=p))
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
