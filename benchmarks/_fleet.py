"""The full-size layout for benchmarks: 4,096 shards and 4,096 mod buckets of eight
master/slave host pairs (``MySQL001A/B`` .. ``MySQL008A/B``), stood in for by two private
``mariadbd`` servers (pairs 1-4 on the first, 5-8 on the second; both names of a pair
point at one server, so ``--from slave`` reads the same data), a private ``redis-server``,
the control and legacy databases on the first server, and ``farm`` commands and workers
with that environment.

Usage::

    from benchmarks._fleet import fleet

    with fleet(users=1500) as f:          # init, generate 1,500 users, migrate them
        f.farm("status", "--json")        # any farm command (stdout; raises on failure)
        with f.workers(2):                # two workers running while the block runs
            f.farm_json("export", "--date", "2026-01-01", "--wait")
        print(f.timings)                  # {"servers": s, "init": s, "generate": s, ...}

``fleet(users=None)`` stops after ``farm shards init``. Everything is stopped and deleted
on exit. ``python -m benchmarks._fleet [--users N]`` builds it once and prints the timings.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pymysql

from benchmarks._server import ShardHostMariaDB, end_on_sigterm
from benchmarks._server import open_every_table as open_tables
from benchmarks._workers import stop_group
from tests.servers import PrivateRedis

ROOT = Path(__file__).resolve().parent.parent
PAIRS = 8
SHARDS_PER_PAIR = 512
SHARDS = PAIRS * SHARDS_PER_PAIR  # 4,096
BUCKETS = 4096
TMP = "/dev/shm" if os.path.isdir("/dev/shm") else None
# Each server holds 2,048 shard databases of 16 tables and 2,048 mod buckets of 4.
SERVER_OPTIONS = {"table_open_cache": "40000", "table_definition_cache": "40000",
                  "innodb_buffer_pool_size": "1G"}
TIMEOUT = 3600.0


def say(message: str) -> None:
    """A progress line on stderr (results go to stdout)."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def pair_server(pair: int) -> int:
    """Which of the two servers (0 or 1) stands in for host pair ``pair`` (1..8)."""
    return 0 if pair <= PAIRS // 2 else 1


def host_names() -> dict[str, int]:
    """Every host name of the map and the server (0 or 1) it points at."""
    return {f"MySQL{p:03d}{side}": pair_server(p) for p in range(1, PAIRS + 1) for side in "AB"}


def shard_map(ports: tuple[int, int]) -> dict:
    """The full-size map: 512 shards and 512 mod buckets per pair, every shard open."""
    hosts = {name: {"host": "127.0.0.1", "port": ports[s], "user": "root", "password": ""}
             for name, s in host_names().items()}
    per_bucket = BUCKETS // PAIRS

    def ranges(size: int) -> list[dict]:
        return [{"range": [(p - 1) * size, p * size - 1], "master": f"MySQL{p:03d}A",
                 "slave": f"MySQL{p:03d}B"} for p in range(1, PAIRS + 1)]
    return {"version": 1, "hosts": hosts, "shards": ranges(SHARDS_PER_PAIR),
            "open": [[0, SHARDS - 1]],
            "mod": {"buckets": BUCKETS, "ranges": ranges(per_bucket)}}


@dataclass
class Fleet:
    """The full-size layout: servers, Redis, the map file and every command's environment."""

    servers: tuple[ShardHostMariaDB, ShardHostMariaDB]
    redis: PrivateRedis
    workdir: Path
    map_path: Path
    env: dict[str, str]
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def control_dsn(self) -> str:
        """The control database (on the first server)."""
        return self.dsn(0, "farm_control")

    @property
    def legacy_dsn(self) -> str:
        """The legacy source database (on the first server)."""
        return self.dsn(0, "legacy")

    def dsn(self, server: int, database: str) -> str:
        """A root DSN of ``database`` on server 0 or 1."""
        return f"mysql://root@127.0.0.1:{self.servers[server].port}/{database}"

    def connect(self, server: int = 0, **kwargs: object) -> pymysql.Connection:
        """A root connection (utf8mb4, autocommit) to server 0 or 1."""
        return pymysql.connect(host="127.0.0.1", port=self.servers[server].port, user="root",
                               charset="utf8mb4", autocommit=True, **kwargs)

    def server_of(self, shard: int) -> int:
        """The server (0 or 1) that holds ``shard``."""
        return pair_server(shard // SHARDS_PER_PAIR + 1)

    def farm(self, *args: str, timeout: float = TIMEOUT, **env: str) -> str:
        """Run ``farm ARGS`` (extra environment variables as keywords); its stdout, or a
        ``RuntimeError`` with the end of its stderr."""
        p = subprocess.run([sys.executable, "-m", "scripts", *args], env={**self.env, **env},
                           cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        if p.returncode:
            raise RuntimeError(f"farm {' '.join(args)} exited {p.returncode}: "
                               f"{p.stderr.strip()[-800:]}")
        return p.stdout

    def farm_json(self, *args: str, **kwargs) -> dict:
        """``farm ARGS`` whose last line of output is a JSON object; that object."""
        return json.loads(self.farm(*args, **kwargs).strip().splitlines()[-1])

    @contextmanager
    def workers(self, count: int = 2, **env: str) -> Iterator[subprocess.Popen]:
        """``farm workers --count N`` running while the block runs, then stopped (SIGTERM:
        they finish the jobs in hand). Its output goes to ``workdir/workers-*.log``."""
        log = self.workdir / f"workers-{time.strftime('%H%M%S')}-{count}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "scripts", "workers", "--count",
                                     str(count)], env={**self.env, **env}, cwd=ROOT,
                                    stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            try:
                yield proc
            finally:
                stop_group(proc)

    def burst(self, count: int = 2, **env: str) -> float:
        """Seconds ``farm workers --count N --burst`` takes until the queues are empty."""
        start = time.perf_counter()
        self.farm("workers", "--count", str(count), "--burst", **env)
        return time.perf_counter() - start

    def timed(self, label: str, *args: str, **kwargs) -> str:
        """``farm ARGS``, its seconds kept in ``timings[label]``; its stdout."""
        start = time.perf_counter()
        out = self.farm(*args, **kwargs)
        self.timings[label] = time.perf_counter() - start
        return out


def _start_servers(**overrides: str) -> tuple[ShardHostMariaDB, ShardHostMariaDB]:
    """Both servers, started in parallel."""
    options = {**SERVER_OPTIONS, **overrides}
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(ShardHostMariaDB.start_shard_host, **options) for _ in range(2)]
        started = [f.exception() is None and f.result() for f in futures]
    if not all(started):
        for s in started:
            if s:
                s.stop()
        raise next(f.exception() for f in futures if f.exception())
    return started[0], started[1]


def _environment(servers: tuple, red: PrivateRedis, map_path: Path, workdir: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    port = servers[0].port
    env.update({"FARM_SHARDMAP": str(map_path), "FARM_REDIS_URL": red.url(),
                "FARM_CONTROL_DSN": f"mysql://root@127.0.0.1:{port}/farm_control",
                "FARM_LEGACY_DSN": f"mysql://root@127.0.0.1:{port}/legacy",
                "FARM_EXPORT_URL": f"file://{workdir / 'exports'}",
                "PYTHONPATH": str(ROOT)})
    return env


def populate(f: Fleet, users: int, workers: int = 2, seed: int = 1) -> None:
    """Generate ``users`` legacy users and migrate them with ``workers`` running workers."""
    say(f"farm legacy generate --users {users}")
    f.timed("generate", "legacy", "generate", "--users", str(users), "--seed", str(seed))
    say(f"farm migrate --wait with {workers} workers")
    with f.workers(workers):
        start = time.perf_counter()
        summary = f.farm_json("migrate", "--wait")
        f.timings["migrate"] = time.perf_counter() - start
    if summary.get("status") != "done":
        raise RuntimeError(f"migration ended {summary}")


def open_every_table(f: Fleet) -> None:
    """``_server.open_every_table`` on both servers at once."""
    with ThreadPoolExecutor(2) as pool:
        for result in [pool.submit(open_tables, partial(f.connect, n)) for n in range(2)]:
            result.result()


@contextmanager
def fleet(users: int | None = 1500, *, workers: int = 2, seed: int = 1,
          **server_options: str) -> Iterator[Fleet]:
    """Start the full-size layout, ``farm shards init`` it, open every table once, and
    (unless ``users`` is None) generate and migrate ``users`` legacy users; yields the
    ``Fleet``; always cleans up.

    ``server_options`` override the servers' options (``innodb_buffer_pool_size="2G"``).
    """
    end_on_sigterm()
    workdir = Path(tempfile.mkdtemp(prefix="farm-fleet-", dir=TMP))
    start = time.perf_counter()
    say("starting two private mariadbd servers and a private redis-server")
    servers: tuple = ()
    red = None
    try:
        servers = _start_servers(**server_options)
        red = PrivateRedis.start()
        map_path = workdir / "shardmap.json"
        map_path.write_text(json.dumps(shard_map((servers[0].port, servers[1].port)), indent=1))
        f = Fleet(servers, red, workdir, map_path, _environment(servers, red, map_path, workdir))
        f.timings["servers"] = time.perf_counter() - start
        say(f"farm shards init: {SHARDS} shards and {BUCKETS} mod buckets on 2 servers")
        f.timed("init", "shards", "init", "--tune")
        start = time.perf_counter()
        say("opening every table once (a LIMIT 1 read each)")
        open_every_table(f)
        f.timings["open tables"] = time.perf_counter() - start
        if users:
            populate(f, users, workers, seed)
        yield f
    finally:
        if red is not None:
            red.stop()
        for s in servers:
            s.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    """Build the layout once (``--users N``, 0: none) and print its timings as JSON."""
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=1500)
    args = ap.parse_args()
    with fleet(args.users or None) as f:
        print(json.dumps({k: round(v, 1) for k, v in f.timings.items()}))


if __name__ == "__main__":
    main()
