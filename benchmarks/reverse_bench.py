"""``farm reverse`` throughput against LOAD DATA of the same rows, in the same run.

Usage: ``python -m benchmarks.reverse_bench [--users N] [--repeat N]``.

On the private shard-host mariadbd of ``benchmarks.migrate_bench`` (Redis db 12,
flushed before and after): generate legacy data and migrate it with 2 burst
workers (setup, not timed), then

- with ``farm workers --count 2`` already running (their start-up is not the rebuild's
  cost), time ``farm reverse`` of all three reverse tables from planning to the run's
  end (in this process: plan, record, enqueue, then the ledger polled every 20 ms),
  counting the reverse rows on every shard afterwards;
- reference: dump exactly those rows to TSV (sorted by primary key), truncate
  the reverse tables and time ``LOAD DATA LOCAL INFILE`` of them back, one
  statement per table per shard, 2 client threads (as many as workers).

Each side runs on a settled server (purge done, dirty pages written). The pair is taken
``--repeat`` times in turn (this machine's timings vary by 20% from one run to the next)
and the ratio is that of the medians; every pair is printed.
"""

from __future__ import annotations

import argparse
import shutil
from collections.abc import Iterable
from pathlib import Path
from statistics import median

import pymysql.cursors

from benchmarks._bench import (
    CHUNK_SIZE,
    MAPPING_COLUMNS,
    SHARDS,
    Bench,
    Measure,
    Target,
    count_rows,
    empty_tables,
    migrate,
    say,
    with_bench,
)
from benchmarks._workers import run_summary, timed_run
from benchmarks.migrate_bench import fmt_row, generate, print_header
from benchmarks.migrate_refs import dump_table, load_data
from loaders.mappings.reverse import DEFAULT_CHUNK_ROWS, REVERSES
from sharding.schema import shard_table
from workers import launch

CONTROL = "farm_control"
WORKERS = 2


def reverse_targets() -> list[Target]:
    """The three reverse tables on every shard."""
    return [Target(shard_table(s, t), *MAPPING_COLUMNS, "reverse mappings")
            for s in range(SHARDS) for t in REVERSES]


def forward_rows(bench: Bench) -> int:
    """Rows of the forward tables the reverse tables are built from, all shards."""
    names = [shard_table(s, t) for s in range(SHARDS) for t in REVERSES.values()]
    return sum(count_rows(bench, names).values())


def measure_reverse(bench: Bench) -> tuple[Measure, dict[str, int]]:
    """Time ``farm reverse`` with running workers; check the run is done and count rows."""
    names = [t.name for t in reverse_targets()]
    empty_tables(bench, names)
    say(f"farm reverse (all tables) with {WORKERS} running workers")
    run_id, seconds = timed_run(bench, WORKERS, CONTROL,
                                lambda rt: launch.reverse(rt, [], DEFAULT_CHUNK_ROWS))
    run = run_summary(bench, run_id, CONTROL)
    conn = bench.connect(database=CONTROL)
    with conn.cursor() as cur:
        cur.execute("SELECT COUNT(*), SUM(seconds), TIMESTAMPDIFF(MICROSECOND, MIN(started_at), "
                    "MAX(finished_at)) / 1e6 FROM chunks WHERE run_id = %s", (run_id,))
        chunks, busy, span = cur.fetchone()
    conn.close()
    print(f"{chunks} chunks, {float(busy):.1f} s inside handlers, first start to last finish "
          f"{float(span):.1f} s, {seconds:.1f} s from planning to the run's end")
    counts = count_rows(bench, names)
    written = sum(k["rows_written"] for k in run["kinds"])
    if written != sum(counts.values()):
        print(f"note: the run reports {written:,} rows written, the tables hold "
              f"{sum(counts.values()):,}")
    return Measure(f"farm reverse, W={WORKERS} target rows written",
                   sum(counts.values()), seconds), counts


def dump_reverse(bench: Bench, counts: dict[str, int],
                 into: Path) -> list[tuple[Target, Path, int]]:
    """Dump every non-empty reverse table to a client-side TSV file, sorted by key."""
    files = []
    conn = bench.connect(cursorclass=pymysql.cursors.SSCursor)
    try:
        with conn.cursor() as cur:
            for i, t in enumerate(reverse_targets()):
                if counts.get(t.name):
                    path = into / f"{i:05d}.tsv"
                    dump_table(cur, t, path, 0)
                    files.append((t, path, counts[t.name]))
    finally:
        conn.close()
    return files


def run(bench: Bench, users: int, repeat: int) -> None:
    """The whole benchmark on a started server: ``repeat`` pairs of a timed ``farm
    reverse`` and its reference, taken in turn; the median of each side decides."""
    say("farm shards init")
    bench.farm("shards", "init", "--tune")
    legacy, gen_seconds = generate(bench, users)
    print_header(bench, users, legacy, gen_seconds, CHUNK_SIZE)
    migrate(bench, WORKERS, CONTROL)
    forward = forward_rows(bench)
    into = bench.workdir / "dump"
    pairs: list[tuple[Measure, Measure]] = []
    for i in range(repeat):
        rev, counts = measure_reverse(bench)
        if i == 0:
            into.mkdir()
            say("dumping the reverse tables")
            files = dump_reverse(bench, counts, into)
        elif {q: n for q, n in counts.items() if n} != {t.name: n for t, _, n in files}:
            raise RuntimeError(f"farm reverse run {i + 1} wrote other rows than run 1")
        say("LOAD DATA of the same rows")
        pairs.append((rev, load_data(bench, files)))
    shutil.rmtree(into, ignore_errors=True)
    print(f"reverse chunk size {DEFAULT_CHUNK_ROWS:,} forward rows (migrate {CHUNK_SIZE:,}); "
          f"forward rows {forward:,}, reverse rows {pairs[0][0].rows:,}")
    print(f"\n{'measurement':<68} {'rows':>10} {'seconds':>9} {'rows/s':>10}")
    for rev, load in pairs:
        print(fmt_row(rev))
        print(fmt_row(load))
        print(f"{'':<4}ratio of this pair {load.seconds / rev.seconds:.2f}")
    mid_rev = median(rev.seconds for rev, _ in pairs)
    mid_load = median(load.seconds for _, load in pairs)
    print(f"ratio (rows/s, medians of {repeat}: reverse {mid_rev:.2f} s, LOAD DATA "
          f"{mid_load:.2f} s): reverse/LOAD DATA = {mid_load / mid_rev:.2f}")


def main(argv: Iterable[str] | None = None) -> None:
    """Parse the options, then run on the private shard-host bench."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=5000, help="legacy users (~40 rows each)")
    ap.add_argument("--repeat", type=int, default=3,
                    help="pairs of run and reference, taken in turn (default 3)")
    args = ap.parse_args(None if argv is None else list(argv))
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    with_bench(lambda bench: run(bench, args.users, args.repeat))


if __name__ == "__main__":
    main()
