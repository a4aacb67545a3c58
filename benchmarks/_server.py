"""A private mariadbd configured like a production shard host, for benchmarks.

Same lifecycle as ``tests.servers.PrivateMariaDB`` (own data directory on a free
port, ``stop()`` removes it), with the server options a shard host runs with.
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from pathlib import Path

import pymysql

from tests.servers import INSTALL_DB, MARIADBD, PrivateMariaDB, free_port, mysql_alive

SHARD_HOST_OPTIONS: dict[str, str] = {
    "innodb-buffer-pool-size": "2G",
    "table-open-cache": "30000",
    "table-definition-cache": "30000",
    "innodb-flush-log-at-trx-commit": "1",  # MariaDB's default durability
    "max-connections": "500",
    "local-infile": "1",
}
REPORTED_VARIABLES = ("innodb_buffer_pool_size", "table_open_cache", "table_definition_cache",
                      "innodb_flush_log_at_trx_commit", "max_connections", "local_infile",
                      "open_files_limit", "innodb_log_file_size", "version")


class ShardHostMariaDB(PrivateMariaDB):
    """A private mariadbd with shard-host options (``SHARD_HOST_OPTIONS``, overridable)."""

    @classmethod
    def start_shard_host(cls, **overrides: str) -> ShardHostMariaDB:
        """Initialise a data directory and start the server; waits until it answers.

        Keyword arguments override options, underscores standing for dashes
        (``table_open_cache="1000"``).
        """
        options = {**SHARD_HOST_OPTIONS,
                   **{k.replace("_", "-"): v for k, v in overrides.items()}}
        base = Path(tempfile.mkdtemp(prefix="farm-bench-mariadb-"))
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
        server._wait_alive(base)
        return server

    def _wait_alive(self, base: Path, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while mysql_alive(port=self.port) is not None:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = (base / "error.log").read_text(errors="replace").splitlines()[-5:]
                self.stop()
                raise RuntimeError("private mariadbd did not start: " + " | ".join(tail))
            time.sleep(0.1)

    def variables(self) -> dict[str, str]:
        """The server variables a benchmark report shows (effective values)."""
        conn = pymysql.connect(host="127.0.0.1", port=self.port, user="root")
        try:
            with conn.cursor() as cur:
                marks = ",".join(["%s"] * len(REPORTED_VARIABLES))
                cur.execute(f"SHOW GLOBAL VARIABLES WHERE Variable_name IN ({marks})",
                            REPORTED_VARIABLES)
                return dict(cur.fetchall())
        finally:
            conn.close()
