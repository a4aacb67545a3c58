"""The references a migration benchmark measures in the same run, on exactly the rows the
migration wrote: ``LOAD DATA LOCAL INFILE`` (A) and one autocommitted ``INSERT`` per row (B).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pymysql
import pymysql.cursors

from benchmarks._bench import (
    _ESCAPES,
    LOAD_THREADS,
    SAMPLE_ROWS,
    Bench,
    Measure,
    Target,
    count_rows,
    empty_tables,
    target_tables,
)
from benchmarks._usage import cpu_seconds, thread_cpu

# --- reference A: LOAD DATA ----------------------------------------------------------------


def tsv_field(value: object) -> str:
    """One field as LOAD DATA reads it by default (backslash escapes, tab/newline separators)."""
    if value is None:
        return "\\N"
    if isinstance(value, bytes):
        value = value.decode("utf-8")
    return str(value).translate(_ESCAPES) if isinstance(value, str) else str(value)


def sample_quotas(counts: list[tuple[Target, int]], total: int) -> dict[str, int]:
    """Rows per table for a sample of ``total`` rows in proportion to each table's size."""
    rows = sum(n for _, n in counts)
    quotas, seen, taken = {}, 0, 0
    for t, n in counts:
        seen += n
        want = min(total, rows) * seen // rows if rows else 0
        quotas[t.name], taken = want - taken, want
    return quotas


def dump_table(cur: pymysql.cursors.SSCursor, t: Target, path: Path,
               quota: int) -> list[tuple]:
    """Write one table as TSV sorted by primary key; return its first ``quota`` rows."""
    sample: list[tuple] = []
    cur.execute(f"SELECT {t.columns} FROM {t.name} ORDER BY {t.key}")
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for row in cur:
            if len(sample) < quota:
                sample.append(row)
            f.write("\t".join(tsv_field(v) for v in row) + "\n")
    return sample


def dump(bench: Bench, counts: dict[str, int],
         into: Path) -> tuple[list[tuple[Target, Path, int]], list[tuple[Target, tuple]]]:
    """Dump every non-empty target table; also pick the row-at-a-time sample."""
    tables = [(t, counts[t.name]) for t in target_tables() if counts.get(t.name)]
    quotas = sample_quotas(tables, SAMPLE_ROWS)
    files, sample = [], []
    conn = bench.connect(cursorclass=pymysql.cursors.SSCursor)
    try:
        with conn.cursor() as cur:
            for i, (t, n) in enumerate(tables):
                path = into / f"{i:05d}.tsv"
                sample += [(t, row) for row in dump_table(cur, t, path, quotas[t.name])]
                files.append((t, path, n))
    finally:
        conn.close()
    return files, sample


def balance(files: list[tuple[Target, Path, int]], n: int) -> list[list]:
    """Split files into ``n`` lists of about equal rows (largest first to the lightest)."""
    bins: list[list] = [[] for _ in range(n)]
    load = [0] * n
    for item in sorted(files, key=lambda f: -f[2]):
        i = load.index(min(load))
        bins[i].append(item)
        load[i] += item[2]
    return bins


def _load_files(bench: Bench, files: list[tuple[Target, Path, int]]) -> float:
    """``LOAD DATA`` of ``files`` on one connection; returns the CPU seconds its server
    thread used for them."""
    conn = bench.connect(local_infile=True)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT TID FROM information_schema.PROCESSLIST "
                        "WHERE ID = CONNECTION_ID()")
            tid = int(cur.fetchone()[0])
            before = thread_cpu(bench.server.proc.pid).get(tid, 0.0)
            for t, path, _ in files:
                cur.execute(f"LOAD DATA LOCAL INFILE %s INTO TABLE {t.name} "
                            f"CHARACTER SET utf8mb4 ({t.columns})", (str(path),))
            return thread_cpu(bench.server.proc.pid).get(tid, 0.0) - before
    finally:
        conn.close()


def load_data(bench: Bench, files: list[tuple[Target, Path, int]],
              before: Callable[[], None] | None = None) -> Measure:
    """Truncate the dumped tables and time loading them back, ``LOAD_THREADS`` in parallel
    (``before``: called between the truncation and the timed loads)."""
    empty_tables(bench, [t.name for t, _, _ in files])
    if before is not None:
        before()
    bins = balance(files, LOAD_THREADS)
    cpu = cpu_seconds(bench.server.proc.pid)
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=LOAD_THREADS) as pool:
        statements = sum(pool.map(lambda part: _load_files(bench, part), bins))
    seconds = time.perf_counter() - start
    cpu = cpu_seconds(bench.server.proc.pid) - cpu
    rows = sum(n for _, _, n in files)
    check_counts(bench, {t.name: n for t, _, n in files})
    return Measure(f"LOAD DATA LOCAL INFILE, {LOAD_THREADS} client threads, "
                   f"{len(files)} statements", rows, seconds, server_cpu=cpu,
                   statements_cpu=statements)


def check_counts(bench: Bench, expected: dict[str, int]) -> None:
    """Raise if any table does not hold the expected number of rows."""
    got = count_rows(bench, list(expected))
    wrong = [q for q, n in expected.items() if got[q] != n]
    if wrong:
        raise RuntimeError(f"{len(wrong)} table(s) reloaded with other counts, e.g. {wrong[0]}")


# --- reference B: one INSERT per row -------------------------------------------------------


def insert_rows(bench: Bench, sample: list[tuple[Target, tuple]]) -> Measure:
    """Truncate the sampled tables and time one autocommitted INSERT per row, one client."""
    empty_tables(bench, sorted({t.name for t, _ in sample}))
    conn = bench.connect()
    try:
        with conn.cursor() as cur:
            start = time.perf_counter()
            for t, row in sample:
                marks = ",".join(["%s"] * len(row))
                cur.execute(f"INSERT INTO {t.name} ({t.columns}) VALUES ({marks})", row)
            seconds = time.perf_counter() - start
    finally:
        conn.close()
    return Measure("row-at-a-time INSERT, 1 client, autocommit, proportional sample",
                   len(sample), seconds)
