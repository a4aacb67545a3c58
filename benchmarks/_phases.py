"""Where the target server's CPU goes inside the migration's chunks, and inside its reference.

``installed`` wraps, while it is entered, the functions a chunk calls for each of its steps
(legacy reads, the target's reads, shard writes, mod-bucket writes, ...) and sums the target
server's CPU seconds, and this process's, spent inside each (the outermost step only: a step
called inside another is the other's). ``benchmarks.migrate_cpu`` runs the chunks one at a
time, so the server's CPU between a step's start and end is that step's, its background
threads' (page flushing, purge) included; its connection threads' CPU alone (the threads
``information_schema.PROCESSLIST`` names, by their ``TID``) is the step's own statements, so
what the background threads did meanwhile for earlier steps (writing their pages) is not
charged to it. ``by_table`` loads the reference one table group at
a time (every shard's ``pins``, every bucket's ``legacy_id_map``, ...), for the same split of
the reference. A developer's instrument: the wrapping costs a few microseconds a call.
"""

from __future__ import annotations

import functools
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pymysql

from benchmarks._bench import Bench, Target
from benchmarks._usage import cpu_seconds, thread_cpu
from jobs import lifecycle
from loaders.migration import claims, converge, migrate, newids, verdicts, writer

# (owner, attribute, label): the steps of a chunk (``loaders.migration.migrate``)
STEPS = [(migrate, "read_selection", "legacy rows read"),
         (verdicts.Resolver, "load", "legacy rows referenced"),
         (migrate, "held", "target read (what it holds)"),
         (claims, "survey", "target read (slot survey)"),
         (newids.NewIds, "prepare", "new IDs looked up"),
         (writer, "write_shards", "shard writes"),
         (writer, "write_mod", "mod-bucket writes"),
         (converge, "apply", "stale rows removed"),
         (converge, "relink", "stale lookups relinked")]
WHOLE = "whole chunks"


CONNECTIONS = ("SELECT TID FROM information_schema.PROCESSLIST "
               "WHERE ID <> CONNECTION_ID() AND TID IS NOT NULL")


class Phases:
    """CPU seconds (the server's, its connection threads', this process's) per step,
    summed over calls; ``connections``: the thread IDs of the server's connections now."""

    def __init__(self, server_pid: int, connections: Callable[[], set[int]]) -> None:
        self.pid, self.connections = server_pid, connections
        self.server: Counter[str] = Counter()
        self.statements: Counter[str] = Counter()
        self.client: Counter[str] = Counter()
        self._depth = 0

    def _statements(self, before: dict[int, float]) -> float:
        """CPU seconds the server's connection threads used since ``before``."""
        now = thread_cpu(self.pid)
        return sum(now.get(t, 0.0) - before.get(t, 0.0) for t in self.connections())

    def wrap(self, fn: Callable, label: str, outermost: bool = True) -> Callable:
        """``fn``, its CPU counted under ``label`` (unless called inside another step)."""
        @functools.wraps(fn)
        def counted(*args: object, **kwargs: object) -> object:
            if outermost and self._depth:
                return fn(*args, **kwargs)
            self._depth += outermost
            threads = thread_cpu(self.pid)
            server, client = cpu_seconds(self.pid), time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.server[label] += cpu_seconds(self.pid) - server
                self.client[label] += time.process_time() - client
                self.statements[label] += self._statements(threads)
                self._depth -= outermost
        return counted

    def report(self) -> None:
        """One line per step, the rest of the chunks and the whole, largest first."""
        whole, whole_client = self.server.pop(WHOLE, 0.0), self.client.pop(WHOLE, 0.0)
        whole_own = self.statements.pop(WHOLE, 0.0)
        print("target server CPU-s by step, all threads / its connection threads alone "
              "[this process's CPU-s]:")
        for label, sec in self.server.most_common():
            print(f"  {sec:7.2f} / {self.statements[label]:6.2f} [{self.client[label]:6.2f}]  "
                  f"{label}")
        print(f"  {whole - sum(self.server.values()):7.2f} / "
              f"{whole_own - sum(self.statements.values()):6.2f} "
              f"[{whole_client - sum(self.client.values()):6.2f}]  the rest (ledger, judging, "
              f"building)")
        print(f"  {whole:7.2f} / {whole_own:6.2f} [{whole_client:6.2f}]  {WHOLE}")


@contextmanager
def installed(server_pid: int, connect: Callable[[], pymysql.Connection]) -> Iterator[Phases]:
    """Count the steps of every chunk executed inside (``connect``: a connection to the
    server, asked for its connections' threads); restore the functions after."""
    conn = connect()

    def connections() -> set[int]:
        with conn.cursor() as cur:
            cur.execute(CONNECTIONS)
            return {int(tid) for (tid,) in cur.fetchall()}
    phases = Phases(server_pid, connections)
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in STEPS]
    saved.append((lifecycle, "execute", lifecycle.execute))
    try:
        for owner, name, label in STEPS:
            setattr(owner, name, phases.wrap(getattr(owner, name), label))
        lifecycle.execute = phases.wrap(lifecycle.execute, WHOLE, outermost=False)
        yield phases
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)
        conn.close()


def group_of(target: Target) -> str:
    """``mod legacy_id_map``, ``shard pins``: a table of every bucket or shard as one."""
    db, _, table = target.name.replace("`", "").partition(".")
    return f"{'mod' if db.startswith('mod') else 'shard'} {table}"


def by_table(bench: Bench, files: list[tuple[Target, Path, int]],
             load: Callable[[Bench, list], object]) -> None:
    """``LOAD DATA`` of the dumped ``files`` one table group at a time (``load``: the
    reference's loader), printing each group's rows and the target server's CPU-s."""
    groups: dict[str, list] = {}
    for f in files:
        groups.setdefault(group_of(f[0]), []).append(f)
    print("reference by table (target server CPU-s, all threads / the loading connections'):")
    for name, part in sorted(groups.items()):
        m = load(bench, part)
        print(f"  {m.server_cpu:7.2f} / {m.statements_cpu:6.2f}  {name:<28} {m.rows:>10,} rows "
              f"in {len(part):,} statement(s)")
