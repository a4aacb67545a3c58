"""The migration's CPU per legacy row, chunk by chunk, in this one process.

Usage: ``python -m benchmarks.migrate_cpu [--users N] [--repeat N] [--profile FILE]
[--chunk-size R] [--slice-size R] [--digests] [--phases]``.

On the private shard-host bench of ``benchmarks.migrate_bench`` (the legacy database on
a server of its own), every chunk of a ``farm migrate`` run is executed here, in order,
the way a worker executes it (``jobs.lifecycle.execute``), and this process's CPU seconds
(``time.process_time``: every thread, user and system) are summed per legacy table: the
figure the workers spend per legacy row, without two workers, rq or a wall clock shared
with other work in the way; the target and legacy servers' CPU seconds are summed the same
way, and after the last run the target server's for ``LOAD DATA`` of the rows it wrote (the
migrate benchmark's reference) is measured. ``--repeat N`` empties the target and migrates
again N times (each a new run, so nothing is remembered between them); ``--profile FILE``
runs the last one under ``cProfile`` and writes its statistics to FILE (``python -m pstats
FILE``), for where the time goes (cProfile slows small calls more than large ones: compare figures
from runs without it).
"""

from __future__ import annotations

import argparse
import cProfile
import shutil
import time
from collections import Counter
from collections.abc import Iterable
from contextlib import nullcontext
from functools import partial

from benchmarks import _digests, _phases
from benchmarks._bench import (
    Bench,
    all_written_tables,
    count_rows,
    empty_tables,
    legacy_rows,
    say,
    target_tables,
    with_bench,
)
from benchmarks._server import open_every_table
from benchmarks._usage import cpu_seconds
from benchmarks.migrate_refs import dump, load_data
from jobs import lifecycle
from jobs.runtime import Runtime
from loaders.migration import migrate as migration
from shardfarm.settings import Settings


def migrate_inline(rt: Runtime, chunk_rows: int, slice_rows: int,
                   profile: cProfile.Profile | None = None, servers: dict[str, int] | None = None
                   ) -> tuple[Counter, Counter, dict[str, Counter]]:
    """One run's chunks executed here in order: CPU seconds and legacy rows per table, and
    the CPU seconds of each of ``servers`` (name: pid) per table (the chunks run one at a
    time, so a server's CPU between a chunk's start and end is that chunk's)."""
    servers = servers or {}
    used: dict[str, Counter] = {name: Counter() for name in servers}
    params, chunks = migration.plan(rt.settings, rt.router, rt.ledger, chunk_rows, slice_rows)
    params["handler"] = migration.HANDLER
    run_id = rt.ledger.create_run("migrate", "none", params, chunks)
    cpu: Counter = Counter()
    rows: Counter = Counter()
    for i, chunk in enumerate(chunks):
        start = time.process_time()
        before = {name: cpu_seconds(pid) for name, pid in servers.items()}
        if profile is not None:
            profile.enable()
        outcome = lifecycle.execute(rt, run_id, i)
        if profile is not None:
            profile.disable()
        cpu[chunk.kind] += time.process_time() - start
        for name, pid in servers.items():
            used[name][chunk.kind] += cpu_seconds(pid) - before[name]
        rows[chunk.kind] += chunk.rows
        if outcome != "done":
            raise RuntimeError(f"chunk {i} ({chunk.kind}) ended {outcome}")
    return cpu, rows, used


def report(label: str, cpu: Counter, rows: Counter, servers: dict[str, Counter]) -> None:
    """CPU seconds and microseconds per legacy row, per table and in all: this process's,
    then each server's."""
    for t in cpu:
        print(f"{label} {t:<9} {rows[t]:>9,} rows {cpu[t]:7.2f} s "
              f"{1e6 * cpu[t] / max(rows[t], 1):6.1f} us/row" + "".join(
                  f"; {name} {used[t]:6.2f} s {1e6 * used[t] / max(rows[t], 1):5.1f} us/row"
                  for name, used in servers.items()))
    total, n = sum(cpu.values()), sum(rows.values())
    print(f"{label} all       {n:>9,} rows {total:7.2f} s {1e6 * total / max(n, 1):6.1f} us/row"
          + "".join(f"; {name} {sum(used.values()):6.2f} s "
                    f"{1e6 * sum(used.values()) / max(n, 1):5.1f} us/row"
                    for name, used in servers.items()))


def run(bench: Bench, users: int, repeat: int, profile_path: str | None, chunk_rows: int,
        slice_rows: int, digests: bool = False, phases: bool = False) -> None:
    """The whole measurement on a started bench."""
    say("farm shards init")
    bench.farm("shards", "init", "--tune")
    say("opening every table once (the reference runs on tables the first migration opened)")
    open_every_table(bench.connect)
    say(f"generating {users:,} legacy users")
    bench.farm("legacy", "generate", "--users", str(users), "--seed", "1", "--replace")
    say(f"{legacy_rows(bench):,} legacy rows")
    rt = Runtime(Settings.from_env(bench.env))
    servers = {"target server": bench.server.proc.pid}
    if bench.legacy is not None:
        servers["legacy server"] = bench.legacy.proc.pid
    try:
        for i in range(repeat):
            empty_tables(bench, all_written_tables())
            profile = cProfile.Profile() if profile_path and i == repeat - 1 else None
            say(f"migration {i + 1} of {repeat}" + (" (profiled)" if profile else ""))
            if digests:
                _digests.reset(bench.server)
            counting = _phases.installed(bench.server.proc.pid, bench.connect) if phases \
                else nullcontext()
            with counting as by:
                report(f"run {i + 1}{'p' if profile else ''}",
                       *migrate_inline(rt, chunk_rows, slice_rows, profile, servers))
            if by is not None:
                by.report()
            if digests:
                _digests.report(f"migration {i + 1}", bench.server)
            if profile is not None:
                profile.dump_stats(profile_path)
        reference(bench, digests, phases)
    finally:
        rt.close()


def reference(bench: Bench, digests: bool = False, by_table: bool = False) -> None:
    """The target server's CPU seconds to ``LOAD DATA`` the rows the last migration wrote
    (the migrate benchmark's reference, 2 threads): against the migration's, the target-side
    ratio (the ceiling with the workers and the legacy database on machines of their own)."""
    into = bench.workdir / "dump"
    into.mkdir(exist_ok=True)
    say("dumping the target, then LOAD DATA of the same rows")
    counts = count_rows(bench, [t.name for t in target_tables()])
    files, _ = dump(bench, counts, into)
    if by_table:
        _phases.by_table(bench, files, load_data)
    load = load_data(bench, files, before=partial(_digests.reset, bench.server) if digests
                     else None)
    if digests:
        _digests.report("LOAD DATA reference", bench.server)
    shutil.rmtree(into, ignore_errors=True)
    print(f"reference: LOAD DATA of {load.rows:,} target rows in {load.seconds:.1f} s, "
          f"target server {load.server_cpu:.2f} CPU-s ({load.statements_cpu:.2f} in the loading "
          "connections' threads)")


def main(argv: Iterable[str] | None = None) -> None:
    """Parse the options, then run on the private shard-host bench."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=10_000, help="legacy users (~40 rows each)")
    ap.add_argument("--repeat", type=int, default=2, metavar="N", help="migrations measured")
    ap.add_argument("--profile", metavar="FILE", help="cProfile the last one into FILE")
    ap.add_argument("--chunk-size", type=int, default=migration.DEFAULT_CHUNK_ROWS)
    ap.add_argument("--slice-size", type=int, default=migration.DEFAULT_SLICE_ROWS)
    ap.add_argument("--digests", action="store_true",
                    help="performance_schema on: where the target server's statement time went "
                         "in each run and in the reference (not a run to quote CPU figures from)")
    ap.add_argument("--phases", action="store_true",
                    help="the target server's CPU by step of the chunks (shard writes, mod-bucket "
                         "writes, reads, ...) and the reference's by table")
    args = ap.parse_args(None if argv is None else list(argv))
    if args.users < 1 or args.repeat < 1:
        ap.error("--users and --repeat take a number of at least 1")
    with_bench(lambda bench: run(bench, args.users, args.repeat, args.profile,
                                 args.chunk_size, args.slice_size, args.digests, args.phases),
               own_legacy=True, **(_digests.SERVER_OPTIONS if args.digests else {}))


if __name__ == "__main__":
    main()
