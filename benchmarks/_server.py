"""A private mariadbd configured like a production shard host, for benchmarks.

Same lifecycle as ``tests.servers.PrivateMariaDB`` (own data directory on a free
port, ``stop()`` removes it), with the server options a shard host runs with.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable

import pymysql

from tests.servers import PrivateMariaDB


def end_on_sigterm() -> None:
    """Make SIGTERM end this benchmark the way Ctrl-C does, through its ``finally`` blocks,
    so its private servers and files are removed (by default SIGTERM ends Python at once
    and leaves them running). Only from the main thread; elsewhere it does nothing."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _exit_on_term)


def _exit_on_term(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def say(message: str) -> None:
    """A progress line on stderr (the results go to stdout)."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


SETTLE_IO_CAPACITY = 20000  # pages/s the page cleaner may write while a server settles


def open_every_table(connect: Callable[[], pymysql.Connection]) -> None:
    """A ``LIMIT 1`` read of every shard and mod-bucket table of the server: the first open
    of a table since ``farm shards init`` costs ~0.2 ms (its dictionary entry loaded; later
    opens come from the definition cache). A reference runs on tables the farm's run opened
    before it; after this, the run finds them open too."""
    conn = connect()
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT table_schema, table_name FROM information_schema.tables "
                        "WHERE table_schema LIKE 'db%' OR table_schema LIKE 'mod%'")
            names = [f"(SELECT 1 FROM `{d}`.`{t}` LIMIT 1)" for d, t in cur.fetchall()]
            for i in range(0, len(names), 200):
                cur.execute(" UNION ALL ".join(names[i:i + 200]))
                cur.fetchall()
    finally:
        conn.close()


def settle(connect: Callable[[], pymysql.Connection], timeout: float = 120) -> None:
    """Wait until InnoDB has purged the history of what came before and written the buffer
    pool's dirty pages (``innodb_max_dirty_pages_pct`` 0 and the page cleaner's I/O budget
    ``SETTLE_IO_CAPACITY`` meanwhile: at the default 200 pages/s, the ~70k pages ``farm
    shards init`` leaves took 15 minutes, so every migration was timed while they were
    written), so neither runs during the next timing: each side of a ratio starts on a
    quiet server."""
    deadline = time.monotonic() + timeout
    conn = connect()
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT @@innodb_max_dirty_pages_pct, @@innodb_io_capacity, "
                        "@@innodb_io_capacity_max")
            pct, io, io_max = cur.fetchone()
            try:
                cur.execute("SET GLOBAL innodb_max_dirty_pages_pct = 0")
                cur.execute(f"SET GLOBAL innodb_io_capacity_max = {2 * SETTLE_IO_CAPACITY}")
                cur.execute(f"SET GLOBAL innodb_io_capacity = {SETTLE_IO_CAPACITY}")
                while time.monotonic() < deadline:
                    cur.execute("SHOW GLOBAL STATUS WHERE Variable_name IN "
                                "('Innodb_history_list_length', "
                                "'Innodb_buffer_pool_pages_dirty')")
                    if all(int(v) < 100 for _, v in cur.fetchall()):
                        return
                    time.sleep(0.2)
            finally:
                cur.execute("SET GLOBAL innodb_max_dirty_pages_pct = %s", (pct,))
                cur.execute("SET GLOBAL innodb_io_capacity = %s", (io,))
                cur.execute("SET GLOBAL innodb_io_capacity_max = %s", (io_max,))
    finally:
        conn.close()
    print(f"note: InnoDB purge or page flushing still running after {timeout:.0f}s",
          file=sys.stderr)


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
        return cls.launch(options, prefix="farm-bench-mariadb-")

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


def questions(server: PrivateMariaDB) -> tuple[int, int]:
    """Statements the server has been sent and rows it has read so far (Rows_read)."""
    got = dict(server.sql("SHOW GLOBAL STATUS WHERE Variable_name IN "
                          "('Questions', 'Rows_read')"))
    return int(got["Questions"]), int(got["Rows_read"])


def table_opens(server: PrivateMariaDB) -> int:
    """Tables the server has opened so far (``Opened_tables``: a table cache smaller than
    the tables in use reopens them)."""
    return int(server.sql("SHOW GLOBAL STATUS LIKE 'Opened_tables'")[0][1])


def start_table_stats(server: PrivateMariaDB) -> None:
    """Count rows read per table from now on (MariaDB's ``userstat``)."""
    server.sql("SET GLOBAL userstat = 1")
    server.sql("FLUSH TABLE_STATISTICS")


def table_stats(server: PrivateMariaDB, top: int = 6) -> list[tuple[str, int]]:
    """The tables (over every shard and bucket) whose rows were read most since
    ``start_table_stats``."""
    return [(str(t), int(n)) for t, n in server.sql(
        "SELECT REGEXP_REPLACE(TABLE_NAME, '_[0-9]+$', ''), SUM(ROWS_READ) n FROM "
        "information_schema.TABLE_STATISTICS GROUP BY 1 ORDER BY n DESC LIMIT %s", (top,))]
