"""End-to-end ``farm migrate`` throughput against references measured in the same run.

Usage: ``python -m benchmarks.migrate_bench [--users N] [--scale K [--repeat N]]
[--chunk-size R]``.

Everything runs on one private mariadbd configured like a shard host (legacy,
control database, 16 shards on two host names, 4096 mod buckets) and a private
redis-server. Measured:

- the migration with 1 and 2 workers (``farm workers --count W``, running before the
  run starts: from planning to the run's end), legacy rows/s and target rows/s
  (objects, forward mappings, mod lookups);
- reference A: ``LOAD DATA LOCAL INFILE`` of exactly the rows the migration
  wrote, one statement per table, 2 client threads (as many as workers);
- reference B: one autocommitted ``INSERT`` per row from one client, on a
  proportional sample of the same rows;
- the CPU seconds of the server and of the workers during each migration, and the
  workers' peak RSS (``--chunk-size`` sets the legacy rows per chunk; default the
  migration's own);
- with ``--scale K`` (K > 1): K times the users, and only the 2-worker migration and
  reference A (of the rows it wrote), the ratio printed the same way; ``--repeat N``
  measures N such pairs and prints their median ratio;
- with ``--own-legacy``: the legacy database on a second private mariadbd (the monolith is
  a host of its own in production), so the server CPU (and the server-side ratio) counts
  the target's work alone; the legacy server's CPU is printed beside it;
- with ``--scale K``, after each pair: the run's chunk timeline (table, rows, start, seconds;
  the worker-seconds without a chunk in hand) and the CPU budget of the goal (this machine's
  cores for ``reference seconds / 0.75``, less the reference's server work and the legacy
  server's: what is left for the workers, beside what they used);
- with ``--digests``: performance_schema on, and after the 2-worker migration and reference
  A, where the server's statement time went, by statement shape (``benchmarks._digests``;
  instrumenting slows the server, so that run's ratios are not the ones to quote).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time
from collections.abc import Iterable
from functools import partial

from benchmarks import _digests
from benchmarks._bench import (
    BUCKETS,
    CHUNK_SIZE,
    SHARDS,
    Bench,
    Measure,
    Migration,
    group_counts,
    legacy_rows,
    migrate,
    say,
    with_bench,
)
from benchmarks._server import SHARD_HOST_OPTIONS, open_every_table
from benchmarks.migrate_refs import dump, insert_rows, load_data

# --- report --------------------------------------------------------------------------------


def fmt_row(m: Measure) -> str:
    """One line of the results table."""
    return f"{m.label:<68} {m.rows:>10,} {m.seconds:>9.1f} {m.rate:>10,.0f}"


def print_header(bench: Bench, users: int, legacy: int, gen_seconds: float,
                 chunk_rows: int) -> None:
    """Server configuration (after ``farm shards init --tune``) and data set, as measured."""
    v = bench.server.variables()
    asked = SHARD_HOST_OPTIONS["table-open-cache"]
    capped = "" if v["table_open_cache"] == asked else (
        f" (asked {asked} at start: capped by open_files_limit {v['open_files_limit']}; "
        "then 'shards init --tune')")
    print(f"private mariadbd {v['version']} on port {bench.server.port}: buffer pool "
          f"{int(v['innodb_buffer_pool_size']) >> 20}M, redo log "
          f"{int(v['innodb_log_file_size']) >> 20}M, table_open_cache "
          f"{v['table_open_cache']}{capped}, table_definition_cache "
          f"{v['table_definition_cache']}, flush_log_at_trx_commit "
          f"{v['innodb_flush_log_at_trx_commit']}, max_connections {v['max_connections']}")
    print(f"legacy: {users:,} users, {legacy:,} rows (generated in {gen_seconds:.1f}s); "
          f"{SHARDS} shards on 2 host names, {BUCKETS} mod buckets, chunk size {chunk_rows:,}, "
          f"Redis {bench.env['FARM_REDIS_URL']}")


def print_table(migrations: list[Migration], refs: list[Measure]) -> None:
    """The results table, then the target rows by group."""
    print(f"\n{'measurement':<68} {'rows':>10} {'seconds':>9} {'rows/s':>10}")
    for m in migrations:
        print(fmt_row(m.legacy))
        print(fmt_row(m.target))
    for r in refs:
        print(fmt_row(r))
    groups = group_counts(migrations[-1].counts)
    print("target rows written: " + ", ".join(f"{g} {n:,}" for g, n in groups.items())
          + "; the row-at-a-time sample takes rows from every table in the same proportions")


def print_ratios(w1: Migration, w2: Migration, load: Measure, insert: Measure) -> None:
    """Final line: migration vs references (target rows/s) and 1->2 worker scaling."""
    print(f"ratios (target rows/s): migration(W=2)/LOAD DATA = {w2.target.rate / load.rate:.2f}"
          f" (goal >= 0.50); migration(W=2)/row-at-a-time = "
          f"{w2.target.rate / insert.rate:.1f}x (goal >= 10x); "
          f"scaling 1->2 workers = {w2.target.rate / w1.target.rate:.2f}x")


# --- main ----------------------------------------------------------------------------------


def generate(bench: Bench, users: int) -> tuple[int, float]:
    """``farm legacy generate``; returns the legacy row count and the seconds taken."""
    say(f"generating {users:,} legacy users")
    start = time.perf_counter()
    bench.farm("legacy", "generate", "--users", str(users), "--seed", "1", "--replace")
    return legacy_rows(bench), time.perf_counter() - start


def references(bench: Bench, w2: Migration) -> tuple[Measure, Measure]:
    """Reference A (LOAD DATA) and B (row-at-a-time) on the rows the W=2 run wrote."""
    into = bench.workdir / "dump"
    into.mkdir()
    say("dumping the W=2 target, then LOAD DATA and row-at-a-time references")
    files, sample = dump(bench, w2.counts, into)
    load = load_data(bench, files)
    shutil.rmtree(into, ignore_errors=True)
    return load, insert_rows(bench, sample)


def run_scaled(bench: Bench, users: int, chunk_rows: int, digests: bool = False) -> float:
    """K times the users: the 2-worker migration against LOAD DATA of the rows it wrote;
    returns the ratio."""
    if digests:
        _digests.reset(bench.server)
    w2 = migrate(bench, 2, "farm_control_w2", chunk_rows)
    if digests:
        _digests.report("migrate W=2", bench.server)
    into = bench.workdir / "dump"
    into.mkdir()
    say("dumping the W=2 target, then the LOAD DATA reference")
    files, _sample = dump(bench, w2.counts, into)
    # reset after the tables are emptied: their DELETEs are not the reference's statements
    load = load_data(bench, files, before=partial(_digests.reset, bench.server) if digests
                     else None)
    if digests:
        _digests.report("LOAD DATA reference", bench.server)
    shutil.rmtree(into, ignore_errors=True)
    print(f"\n{'measurement':<68} {'rows':>10} {'seconds':>9} {'rows/s':>10}")
    for m in (w2.legacy, w2.target, load):
        print(fmt_row(m))
    print(f"migrate W=2: {w2.usage}")
    print_server_side(w2, load)
    print_timeline(bench, "farm_control_w2", 2)
    print_budget(w2, load)
    ratio = w2.target.rate / load.rate
    print(f"ratio (target rows/s, {users:,} users): migration(W=2)/LOAD DATA = "
          f"{ratio:.2f} (goal >= 0.75)")
    return ratio


def print_budget(w2: Migration, load: Measure, goal: float = 0.75) -> None:
    """The CPU this machine gives a migration that meets ``goal`` (its cores for
    ``reference seconds / goal``), what the reference's server and the legacy server need of
    it, what is left for the workers, and what they used: the goal is out of reach on this
    machine while the workers need more than is left."""
    cores = os.cpu_count() or 1
    budget = cores * load.seconds / goal
    servers = (load.server_cpu or 0.0) + (w2.usage.legacy_cpu or 0.0)
    print(f"CPU budget at {goal}x on {cores} cores: {budget:.1f} core-seconds; the reference's "
          f"server work {load.server_cpu or 0:.1f} and the legacy server "
          f"{w2.usage.legacy_cpu or 0:.1f} leave {budget - servers:.1f} for the workers, who "
          f"used {w2.usage.workers_cpu:.1f}")


def print_timeline(bench: Bench, control: str, workers: int) -> None:
    """The latest run's chunks in the order they started: table, legacy rows read, start
    (seconds after the first) and seconds; then the worker-seconds without a chunk in hand
    (``workers`` × span − Σ chunk seconds), most of them a worker waiting for the last."""
    conn = bench.connect(database=control)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT JSON_VALUE(args, '$.table'), rows_read, started_at, finished_at "
                        "FROM chunks WHERE run_id = (SELECT run_id FROM runs ORDER BY "
                        "created_at DESC LIMIT 1) ORDER BY started_at")
            chunks = cur.fetchall()
    finally:
        conn.close()
    t0, end = chunks[0][2], max(c[3] for c in chunks)
    print("chunks (table rows start+seconds): " + ", ".join(
        f"{t} {n:,} {(a - t0).total_seconds():.1f}+{(b - a).total_seconds():.1f}"
        for t, n, a, b in chunks))
    busy = sum((b - a).total_seconds() for _, _, a, b in chunks)
    print(f"worker-seconds without a chunk: {workers * (end - t0).total_seconds() - busy:.1f} "
          f"of {workers * (end - t0).total_seconds():.1f}")


def print_server_side(w2: Migration, load: Measure) -> None:
    """The server's CPU seconds for the migration and for the reference: their ratio is the
    migration's ceiling if its workers ran on other machines (the server alone bound)."""
    mig, ref = w2.usage.server_cpu, load.server_cpu or 0.0
    which = "server" if w2.usage.legacy_cpu is None else "target server (legacy apart)"
    print(f"{which} CPU seconds: migration {mig:.1f}, LOAD DATA {ref:.1f}; server-side ratio "
          f"(LOAD DATA / migration) = {ref / mig if mig else 0:.2f}: the ceiling with the "
          "workers' CPU on other machines")


def run(bench: Bench, users: int, scale: int, chunk_rows: int, digests: bool = False,
        repeat: int = 1) -> None:
    """The whole benchmark on a started server (``repeat``: pairs of the scaled run)."""
    say("farm shards init")
    bench.farm("shards", "init", "--tune")
    say("opening every table once (the reference runs on tables the migration opened)")
    open_every_table(bench.connect)
    legacy, gen_seconds = generate(bench, users * scale)
    print_header(bench, users * scale, legacy, gen_seconds, chunk_rows)
    if scale > 1:
        ratios = [run_scaled(bench, users * scale, chunk_rows, digests) for _ in range(repeat)]
        if repeat > 1:
            print(f"ratios of {repeat} pairs: {', '.join(f'{r:.2f}' for r in ratios)}; "
                  f"median {statistics.median(ratios):.2f} (goal >= 0.75)")
        return
    w1 = migrate(bench, 1, "farm_control_w1", chunk_rows)
    w2 = migrate(bench, 2, "farm_control_w2", chunk_rows)
    for m in (w1, w2):
        if m.legacy.rows != legacy:
            print(f"note: W={m.workers} read {m.legacy.rows:,} legacy rows of {legacy:,}")
    load, insert = references(bench, w2)
    print_table([w1, w2], [load, insert])
    for m in (w1, w2):
        print(f"migrate W={m.workers}: {m.usage}")
    print_server_side(w2, load)
    print_ratios(w1, w2, load, insert)


def main(argv: Iterable[str] | None = None) -> None:
    """Parse the options, then run on the private shard-host bench."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=5000, help="legacy users (~40 rows each)")
    ap.add_argument("--scale", type=int, default=1, metavar="K",
                    help="K times the users: W=2 and LOAD DATA only (e.g. 10)")
    ap.add_argument("--chunk-size", type=int, default=CHUNK_SIZE, metavar="R",
                    help=f"legacy rows per chunk (default {CHUNK_SIZE:,})")
    ap.add_argument("--own-legacy", action="store_true",
                    help="the legacy database on a server of its own (as in production): "
                         "the server CPU then counts the target's alone")
    ap.add_argument("--digests", action="store_true",
                    help="with --scale: also where the server's statement time went "
                         "(performance_schema on: not a run to quote ratios from)")
    ap.add_argument("--repeat", type=int, default=1, metavar="N",
                    help="with --scale: N pairs of migration and reference, and their median "
                         "ratio (single runs here vary by 10-20%%)")
    args = ap.parse_args(None if argv is None else list(argv))
    if args.repeat < 1 or (args.repeat > 1 and args.scale < 2):
        ap.error("--repeat takes a number of at least 1, and more than 1 only with --scale")
    options = _digests.SERVER_OPTIONS if args.digests else {}
    with_bench(lambda bench: run(bench, args.users, args.scale, args.chunk_size,
                                 args.digests, args.repeat), own_legacy=args.own_legacy,
               **options)


if __name__ == "__main__":
    main()
