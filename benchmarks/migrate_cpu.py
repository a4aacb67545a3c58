"""The migration's CPU per legacy row, chunk by chunk, in this one process.

Usage: ``python -m benchmarks.migrate_cpu [--users N] [--repeat N] [--profile FILE]
[--chunk-size R] [--slice-size R]``.

On the private shard-host bench of ``benchmarks.migrate_bench`` (the legacy database on
a server of its own), every chunk of a ``farm migrate`` run is executed here, in order,
the way a worker executes it (``jobs.lifecycle.execute``), and this process's CPU seconds
(``time.process_time``: every thread, user and system) are summed per legacy table: the
figure the workers spend per legacy row, without two workers, rq or a wall clock shared
with other work in the way. ``--repeat N`` empties the target and migrates again N times
(each a new run, so nothing is remembered between them); ``--profile FILE`` runs the last
one under ``cProfile`` and writes its statistics to FILE (``python -m pstats FILE``), for
where the time goes (cProfile slows small calls more than large ones: compare figures
from runs without it).
"""

from __future__ import annotations

import argparse
import cProfile
import time
from collections import Counter
from collections.abc import Iterable

from benchmarks._bench import Bench, all_written_tables, empty_tables, legacy_rows, say, with_bench
from jobs import lifecycle
from jobs.runtime import Runtime
from loaders.migration import migrate as migration
from shardfarm.settings import Settings


def migrate_inline(rt: Runtime, chunk_rows: int, slice_rows: int,
                   profile: cProfile.Profile | None = None) -> tuple[Counter, Counter]:
    """One run's chunks executed here in order: CPU seconds and legacy rows per table."""
    params, chunks = migration.plan(rt.settings, rt.router, rt.ledger, chunk_rows, slice_rows)
    params["handler"] = migration.HANDLER
    run_id = rt.ledger.create_run("migrate", "none", params, chunks)
    cpu: Counter = Counter()
    rows: Counter = Counter()
    for i, chunk in enumerate(chunks):
        start = time.process_time()
        if profile is not None:
            profile.enable()
        outcome = lifecycle.execute(rt, run_id, i)
        if profile is not None:
            profile.disable()
        cpu[chunk.kind] += time.process_time() - start
        rows[chunk.kind] += chunk.rows
        if outcome != "done":
            raise RuntimeError(f"chunk {i} ({chunk.kind}) ended {outcome}")
    return cpu, rows


def report(label: str, cpu: Counter, rows: Counter) -> None:
    """CPU seconds and microseconds per legacy row, per table and in all."""
    for t in cpu:
        print(f"{label} {t:<9} {rows[t]:>9,} rows {cpu[t]:7.2f} s "
              f"{1e6 * cpu[t] / max(rows[t], 1):6.1f} us/row")
    total, n = sum(cpu.values()), sum(rows.values())
    print(f"{label} all       {n:>9,} rows {total:7.2f} s {1e6 * total / max(n, 1):6.1f} us/row")


def run(bench: Bench, users: int, repeat: int, profile_path: str | None, chunk_rows: int,
        slice_rows: int) -> None:
    """The whole measurement on a started bench."""
    say("farm shards init")
    bench.farm("shards", "init")
    say(f"generating {users:,} legacy users")
    bench.farm("legacy", "generate", "--users", str(users), "--seed", "1", "--replace")
    say(f"{legacy_rows(bench):,} legacy rows")
    rt = Runtime(Settings.from_env(bench.env))
    try:
        for i in range(repeat):
            empty_tables(bench, all_written_tables())
            profile = cProfile.Profile() if profile_path and i == repeat - 1 else None
            say(f"migration {i + 1} of {repeat}" + (" (profiled)" if profile else ""))
            report(f"run {i + 1}{'p' if profile else ''}",
                   *migrate_inline(rt, chunk_rows, slice_rows, profile))
            if profile is not None:
                profile.dump_stats(profile_path)
    finally:
        rt.close()


def main(argv: Iterable[str] | None = None) -> None:
    """Parse the options, then run on the private shard-host bench."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=10_000, help="legacy users (~40 rows each)")
    ap.add_argument("--repeat", type=int, default=2, metavar="N", help="migrations measured")
    ap.add_argument("--profile", metavar="FILE", help="cProfile the last one into FILE")
    ap.add_argument("--chunk-size", type=int, default=migration.DEFAULT_CHUNK_ROWS)
    ap.add_argument("--slice-size", type=int, default=migration.DEFAULT_SLICE_ROWS)
    args = ap.parse_args(None if argv is None else list(argv))
    if args.users < 1 or args.repeat < 1:
        ap.error("--users and --repeat take a number of at least 1")
    with_bench(lambda bench: run(bench, args.users, args.repeat, args.profile,
                                 args.chunk_size, args.slice_size), own_legacy=True)


if __name__ == "__main__":
    main()
