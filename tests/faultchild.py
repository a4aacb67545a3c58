"""A child process that runs one named scenario and is killed or frozen at an exact step.

Usage: ``python -m tests.faultchild SCENARIO ARGS_JSON``. Every MySQL statement and
commit the process sends (any connection, any thread) is a numbered step:

- ``FARM_FAULT_TRACE=path``: each step is appended there (``N<TAB>what``) before it runs;
- ``FARM_FAULT_MATCH=text``: only statements holding ``text`` are numbered steps;
- ``FARM_FAULT_STEP=N`` with ``FARM_FAULT_ACTION=kill`` (default): SIGKILL itself just
  before step N, i.e. after steps 1..N-1 completed; with ``freeze``: SIGSTOP itself there,
  and carry on with step N when the parent sends SIGCONT.

No production code is changed for this: the hook wraps PyMySQL's ``Cursor.execute`` and
``Connection.commit`` / ``rollback`` in this process only. Scenarios run with one writer
thread so the steps come in the same order on every run.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pymysql.connections
import pymysql.cursors

STEP = int(os.environ.get("FARM_FAULT_STEP") or 0)
MATCH = os.environ.get("FARM_FAULT_MATCH")  # count only the statements holding this text
ACTION = os.environ.get("FARM_FAULT_ACTION") or "kill"
TRACE = os.environ.get("FARM_FAULT_TRACE")
_count = 0
_lock = threading.Lock()


def step(what: str) -> None:
    """Number a step, record it, and kill or freeze this process if it is the chosen one."""
    global _count
    if MATCH and MATCH not in what:
        return
    with _lock:
        _count += 1
        n = _count
        if TRACE:
            with open(TRACE, "a", encoding="utf-8") as f:
                f.write(f"{n}\t{' '.join(what.split())[:160]}\n")
    if n == STEP:
        os.kill(os.getpid(), signal.SIGKILL if ACTION == "kill" else signal.SIGSTOP)


def install() -> None:
    """Wrap PyMySQL so every statement and commit goes through ``step`` first."""
    execute = pymysql.cursors.Cursor.execute
    commit = pymysql.connections.Connection.commit
    rollback = pymysql.connections.Connection.rollback

    def traced_execute(self, query, args=None):
        step(query if isinstance(query, str) else repr(query))
        return execute(self, query, args)

    def traced_commit(self):
        step("COMMIT")
        return commit(self)

    def traced_rollback(self):
        step("ROLLBACK")
        return rollback(self)
    pymysql.cursors.Cursor.execute = traced_execute
    pymysql.connections.Connection.commit = traced_commit
    pymysql.connections.Connection.rollback = traced_rollback


class _Ctx:
    """What ``reverse_chunk`` needs of a chunk context: a router and no fence (the test
    drives the rebalance's own fences)."""

    def __init__(self, router) -> None:
        self.router = router
        self.token = None

    def check(self) -> None:
        """The lease is never lost here."""


def _add_follower(router, board: int, user: int, sequence: int) -> None:
    from sharding import hotspot
    hotspot.add_follower(router, board, user, sequence)


def _reverse(router, table: str, shard: int, lo: int, hi: int) -> None:
    from loaders.mappings import reverse as reverser
    from loaders.migration import writer
    writer.WRITE_THREADS = 1
    reverser.reverse_chunk(_Ctx(router), table, parts=[[shard, lo, hi]])


def _export(router, control: str, run_id: str, chunk_id: int, group: int) -> None:
    """Claim export chunk ``chunk_id`` of ``run_id`` and run it, ``group`` parts a group."""
    from exporters import chunkparts
    from exporters import export as exporter
    from farmcore.context import ChunkContext
    from farmcore.ledger import Ledger
    from shardfarm.mysql.dsn import DSN
    chunkparts.GROUP_PARTS = group
    ledger = Ledger(DSN.parse(control))
    lease = ledger.claim(run_id, chunk_id, "fault-child")
    ctx = ChunkContext(None, router, ledger, lease, ledger.run(run_id)["params"])
    ledger.finish(lease, exporter.export_chunk(ctx, **lease.args))
    ledger.close()


def _sync(router, env: dict) -> None:
    from farmcore.ledger import Ledger
    from loaders.migration.follower import Follower
    from shardfarm.settings import Settings
    settings = Settings.from_env(env)
    ledger = Ledger(settings.control_dsn)
    try:
        Follower(settings, router, ledger, f"child:{os.getpid()}", "child",
                 until_caught_up=True).run()
    finally:
        ledger.close()


def _migrate_chunk(router, env: dict, run_id: str, chunk_id: int) -> None:
    """Claim chunk ``chunk_id`` of migrate run ``run_id`` and load it, as a worker does."""
    from farmcore.context import ChunkContext
    from farmcore.ledger import Ledger
    from loaders.migration import migrate
    from shardfarm.settings import Settings
    settings = Settings.from_env(env)
    ledger = Ledger(settings.control_dsn)
    try:
        lease = ledger.claim(run_id, chunk_id, "fault-child")
        ctx = ChunkContext(settings, router, ledger, lease, ledger.run(run_id)["params"])
        ledger.finish(lease, migrate.load_chunk(ctx, **lease.args))
        ledger.refresh_status(run_id)
    finally:
        ledger.close()


def _lose_map_replies() -> None:
    """Every shard map write lands, then fails as if its answer was lost on the way back
    (a ZooKeeper connection dropped after the server applied the set)."""
    from shardfarm.errors import ConfigError
    from sharding.mappublish import FileStore
    write = FileStore.write

    def landed_then_lost(self, text: str, stamp: int) -> None:
        write(self, text, stamp)
        raise ConfigError("ZooKeeper could not write the map: ConnectionLoss (is it up?)")
    FileStore.write = landed_then_lost


def _move(router, env: dict, lo: int, hi: int, to: str, lose_map_reply: bool = False) -> None:
    """``farm shards move LO-HI --to MASTER/SLAVE`` (its own runtime; workers do the copy)."""
    from jobs.runtime import Runtime
    from shardfarm.settings import Settings
    from workers import capacity
    if lose_map_reply:
        _lose_map_replies()
    master, slave = to.split("/")
    rt = Runtime(Settings.from_env(env))
    try:
        capacity.move(rt, lo, hi, master, slave, rows_per_range=1000)
    finally:
        rt.close()


def _drop_sources(router, env: dict, plan: dict) -> None:
    """``--drop-source``'s drop of the source copies of the move ``plan`` (its run params),
    holding the move locks, without the grace period."""
    from jobs.runtime import Runtime
    from loaders.capacity.move import MovePlan
    from shardfarm.settings import Settings
    from workers import capacity
    rt = Runtime(Settings.from_env(env))
    try:
        capacity.drop_sources(rt, MovePlan.of_params(plan), 0)
    finally:
        rt.close()


def _farm(router, env: dict, argv: list[str]) -> int:
    """The ``farm`` command with ``argv`` in this process; its exit status."""
    from scripts.cli import main as farm
    os.environ.update(env)
    try:
        farm(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    return 0


SCENARIOS: dict[str, Callable] = {"add_follower": _add_follower, "reverse": _reverse,
                                  "sync": _sync, "export": _export, "move": _move,
                                  "migrate_chunk": _migrate_chunk, "farm": _farm,
                                  "drop_sources": _drop_sources}


def main(argv: list[str]) -> int:
    """Run ``SCENARIO`` with the keyword arguments of ``ARGS_JSON`` (plus ``shardmap``); its
    exit status (0 unless the scenario returns another)."""
    from sharding.mapsource import ShardMapSource
    from sharding.router import Router
    name, args = argv[0], json.loads(argv[1])
    router = Router(ShardMapSource(Path(args.pop("shardmap"))))
    install()
    try:
        return SCENARIOS[name](router, **args) or 0
    finally:
        router.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
