"""A private ZooKeeper server for the tests, from Debian's ``zookeeper`` package."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tests.servers import free_port

ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")  # its manifest names its classpath
JAVA = shutil.which("java") or "/usr/bin/java"


@dataclass
class PrivateZooKeeper:
    """A standalone ZooKeeper on a free port with its own data directory; ``stop()`` removes
    it. ``url(path)`` is the ``FARM_SHARDMAP`` of a node on it."""

    port: int
    datadir: Path
    proc: subprocess.Popen

    @classmethod
    def start(cls, timeout: float = 60) -> PrivateZooKeeper:
        """Start it and wait until it answers ``ruok``; fails (never skips) without the
        package (``.ci/run`` installs it)."""
        if not ZOOKEEPER_JAR.exists():
            raise RuntimeError(f"{ZOOKEEPER_JAR} missing: apt-get install -y zookeeper")
        port = free_port()
        datadir = Path(tempfile.mkdtemp(prefix="farm-zk-"))
        log = open(datadir / "server.log", "w")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            [JAVA, "-Xmx128m", "-Dzookeeper.admin.enableServer=false",
             "-Dzookeeper.4lw.commands.whitelist=ruok", "-cp", str(ZOOKEEPER_JAR),
             "org.apache.zookeeper.server.ZooKeeperServerMain", str(port), str(datadir / "data")],
            stdout=log, stderr=subprocess.STDOUT)
        server = cls(port, datadir, proc)
        deadline = time.monotonic() + timeout
        while not server.ok():
            if proc.poll() is not None or time.monotonic() > deadline:
                server.stop()
                raise RuntimeError(f"ZooKeeper did not start on port {port}")
            time.sleep(0.2)
        return server

    def ok(self) -> bool:
        """Whether the server answers ``imok``."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"ruok")
                return s.recv(4) == b"imok"
        except OSError:
            return False

    def url(self, path: str = "/shardfarm/shardmap") -> str:
        """``zk://127.0.0.1:PORT/path``."""
        return f"zk://127.0.0.1:{self.port}{path}"

    def stop(self) -> None:
        """Stop the server and remove its data."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.datadir, ignore_errors=True)
