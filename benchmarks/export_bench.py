"""``farm export`` (one chunk: ``dump_part`` to gzip JSON Lines) against INTO OUTFILE + gzip.

Usage: ``python -m benchmarks.export_bench [--rows N] [--repeats R]``.

On a private shard-host mariadbd (``benchmarks._server``, ``secure_file_priv``
on a temp dir under /dev/shm when it exists): shard 1 gets N pins (realistic
~370-byte JSON documents: unicode, emoji, quotes, escapes, URLs, IDs) and N
``board_has_pins`` rows, shard 2 gets 10×N pins, all with ``LOAD DATA LOCAL
INFILE`` (setup, not timed; dirty pages are flushed before timing). Measured,
farm and reference interleaved, best (fastest) of R runs each (default 3; R-1 at 10×):

- farm: ``exporters.export.dump_part(host, shard, table, "jsonl", dest, key)``
  into a ``FileDestination`` (the code a chunk runs), each run in a fresh child
  process that reports its seconds, rows, compressed bytes, its RSS after the
  imports and its peak RSS (``ru_maxrss``). MB/s counts the uncompressed JSON
  Lines, measured by decompressing the part afterwards (not timed), which also
  checks the line count and that sampled lines are valid JSON of the right shape;
- reference: ``SELECT <columns> INTO OUTFILE ... ORDER BY <primary key>`` of the
  same table on the same server, then ``gzip -6`` of that file, timed together;
  MB/s counts the TSV bytes the server wrote;
- scale: the same for shard 2's pins (10× the rows), for rows/s at scale and the
  peak RSS at 1× vs 10× (goal: flat, ratio close to 1.0).

MB is 10^6 bytes, MiB (RSS) 2^20 bytes. Progress goes to stderr, results to stdout.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import orjson

from benchmarks._server import ShardHostMariaDB, end_on_sigterm
from benchmarks.export_data import (
    COLUMNS,
    DATE,
    MAPPING,
    OBJECTS,
    SHARD_1X,
    SHARD_10X,
    Bench,
    say,
    setup,
)
from exporters.destinations import FileDestination
from exporters.export import dump_part, folder_of, part_name
from shardfarm.mysql.dsn import Host
from sharding import ids
from sharding.schema import OBJECT_TABLES, shard_table

ROOT = Path(__file__).resolve().parent.parent
TMP = "/dev/shm" if os.path.isdir("/dev/shm") else None
SAMPLE_EVERY = 997  # check every 997th line of a part as JSON


@dataclass
class Run:
    """One timed export: rows, seconds, bytes in (uncompressed) and out (compressed), RSS."""

    rows: int
    seconds: float
    raw_bytes: int
    out_bytes: int
    rss_base_kb: int = 0
    rss_peak_kb: int = 0
    peak_reset: bool = True  # ru_maxrss was reset after the imports

    @property
    def rate(self) -> float:
        """Rows per second."""
        return self.rows / self.seconds if self.seconds > 0 else 0.0

    @property
    def mbps(self) -> float:
        """Uncompressed megabytes (10^6) per second."""
        return self.raw_bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0


# --- farm: dump_part in a child process ----------------------------------------------------


def part_key(shard: int, table: str) -> str:
    """The object key a chunk writes: ``{table}/dt={date}/part-{shard:05d}.jsonl.gz``."""
    return folder_of(table, DATE) + part_name(shard, "jsonl")


def rss_now_kb() -> int:
    """This process's resident set size now, in kilobytes (``VmRSS``)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def reset_peak_rss() -> bool:
    """Reset the peak RSS (``ru_maxrss``) to the current RSS; whether Linux allowed it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def child(port: int, shard: int, table: str, dest: str) -> None:
    """In the child: run ``dump_part`` once and print its figures as one JSON line.

    The peak RSS is ``ru_maxrss``, reset after the imports when the kernel allows it,
    so the imports' own transient peak cannot hide the export's.
    """
    reset = reset_peak_rss()
    base = rss_now_kb()
    host = Host("bench", "127.0.0.1", port, "root")
    start = time.perf_counter()
    part = dump_part(host, shard, table, "jsonl", FileDestination(Path(dest)),
                     part_key(shard, table))
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"rows": part.rows, "bytes": part.bytes, "seconds": seconds,
                      "rss_base_kb": base, "rss_peak_kb": peak, "peak_reset": reset}))


def farm_export(bench: Bench, shard: int, table: str) -> Run:
    """One ``dump_part`` in a fresh child process (``--child``); its figures."""
    dest = bench.workdir / "farm"
    p = subprocess.run([sys.executable, "-m", "benchmarks.export_bench", "--child",
                        "--port", str(bench.server.port), "--shard", str(shard),
                        "--table", table, "--dest", str(dest)],
                       cwd=ROOT, capture_output=True, text=True, timeout=1800)
    if p.returncode:
        raise RuntimeError(f"export child exited {p.returncode}: {p.stderr.strip()[-800:]}")
    r = json.loads(p.stdout.strip().splitlines()[-1])
    return Run(r["rows"], r["seconds"], 0, r["bytes"], r["rss_base_kb"], r["rss_peak_kb"],
               r["peak_reset"])


def check_line(line: bytes, shard: int, table: str) -> None:
    """Raise unless ``line`` is one JSON document of the shape the table exports."""
    doc = orjson.loads(line)
    if table in OBJECT_TABLES:
        base = ids.encode(shard, OBJECT_TABLES[table], 1) - 1
        ok = (doc["id"] == base + doc["local_id"] and doc["shard"] == shard
              and isinstance(doc["active"], bool) and "pinner_id" in doc["data"])
    else:
        ok = set(doc) == {"from_id", "to_id", "sequence"}
    if not ok:
        raise RuntimeError(f"unexpected export line: {line[:200]!r}")


def verify_part(bench: Bench, shard: int, table: str, expected: int) -> int:
    """Decompress the farm's part (not timed): check lines and a JSON sample; raw bytes."""
    count = raw = 0
    with gzip.open(bench.workdir / "farm" / part_key(shard, table), "rb") as f:
        for line in f:
            if not line.endswith(b"\n"):
                raise RuntimeError(f"{table} part: line {count + 1} has no line break")
            if count % SAMPLE_EVERY == 0:
                check_line(line, shard, table)
            count += 1
            raw += len(line)
    if count != expected:
        raise RuntimeError(f"{table} part of shard {shard}: {count:,} lines, "
                           f"expected {expected:,}")
    return raw


# --- reference: SELECT ... INTO OUTFILE, then gzip -6 --------------------------------------


def reference_export(bench: Bench, shard: int, table: str) -> Run:
    """Time ``SELECT ... INTO OUTFILE`` of the table plus ``gzip -6`` of the file."""
    columns, key = COLUMNS[table]
    path = bench.outdir / f"{table}-{shard}.tsv"
    conn = bench.connect()
    try:
        with conn.cursor() as cur:
            start = time.perf_counter()
            rows = cur.execute(f"SELECT {columns} INTO OUTFILE %s FROM "
                               f"{shard_table(shard, table)} ORDER BY {key}", (str(path),))
            raw = path.stat().st_size
            subprocess.run(["gzip", "-6", "-f", str(path)], check=True)
            seconds = time.perf_counter() - start
    finally:
        conn.close()
    gz = path.with_name(path.name + ".gz")
    out = gz.stat().st_size
    gz.unlink()
    return Run(rows, seconds, raw, out)


# --- measuring -----------------------------------------------------------------------------


def best(runs: list[Run]) -> Run:
    """The fastest run, with the highest peak RSS of all runs (memory: the worst one)."""
    fastest = min(runs, key=lambda r: r.seconds)
    fastest.rss_peak_kb = max(r.rss_peak_kb for r in runs)
    fastest.rss_base_kb = max(r.rss_base_kb for r in runs)
    fastest.peak_reset = all(r.peak_reset for r in runs)
    return fastest


def measure(bench: Bench, shard: int, table: str, expected: int,
            repeats: int) -> tuple[Run, Run]:
    """Farm and reference runs interleaved; the best of each (farm output verified)."""
    farm: list[Run] = []
    ref: list[Run] = []
    for i in range(repeats):
        say(f"{shard_table(shard, table)}: run {i + 1}/{repeats}, farm then reference")
        farm.append(farm_export(bench, shard, table))
        ref.append(reference_export(bench, shard, table))
    f, r = best(farm), best(ref)
    if f.rows != expected or r.rows != expected:
        raise RuntimeError(f"{table}: farm {f.rows:,} rows, reference {r.rows:,}, "
                           f"expected {expected:,}")
    f.raw_bytes = verify_part(bench, shard, table, expected)
    return f, r


# --- report --------------------------------------------------------------------------------


def mib(kb: int) -> float:
    """``ru_maxrss`` kilobytes as MiB."""
    return kb / 1024


def fmt_row(label: str, run: Run) -> str:
    """One line of the results table."""
    rss = f"{mib(run.rss_peak_kb):>8.1f}" if run.rss_peak_kb else f"{'-':>8}"
    return (f"{label:<46} {run.rows:>10,} {run.seconds:>8.2f} {run.rate:>10,.0f} "
            f"{run.mbps:>7.1f} {run.out_bytes / 1e6:>8.1f} {rss}")


def print_header(bench: Bench, rows: int, repeats: int) -> None:
    """Server configuration and data set."""
    v = bench.server.variables()
    print(f"private mariadbd {v['version']} on port {bench.server.port}: buffer pool "
          f"{int(v['innodb_buffer_pool_size']) >> 20}M; temp files in {bench.workdir.parent}")
    print(f"shard {SHARD_1X}: {rows:,} {OBJECTS} + {rows:,} {MAPPING}; shard {SHARD_10X}: "
          f"{10 * rows:,} {OBJECTS}; best of {repeats} (farm and reference interleaved; "
          f"10× best of {max(1, repeats - 1)}); each farm run in a fresh process")


def print_results(results: dict[str, tuple[Run, Run]]) -> None:
    """The results table, the ratios and the memory comparison."""
    print(f"\n{'measurement':<46} {'rows':>10} {'seconds':>8} {'rows/s':>10} "
          f"{'MB/s':>7} {'out MB':>8} {'peak MiB':>8}")
    for name, (f, r) in results.items():
        print(fmt_row(f"farm dump_part jsonl.gz, {name}", f))
        print(fmt_row(f"ref. INTO OUTFILE + gzip -6, {name}", r))
    print("MB/s: farm = uncompressed JSON Lines, reference = TSV written by the server")
    for name, (f, r) in results.items():
        print(f"ratio (rows/s) farm/reference, {name}: {f.rate / r.rate:.2f} "
              f"(MB/s {f.mbps / r.mbps:.2f}; output size {f.out_bytes / r.out_bytes:.2f})")
    one, ten = results[f"{OBJECTS} 1×"][0], results[f"{OBJECTS} 10×"][0]
    how = ("ru_maxrss reset after the imports" if one.peak_reset and ten.peak_reset
           else "ru_maxrss NOT reset: includes the imports' own peak")
    print(f"peak RSS of the export process ({how}; the highest of the runs): "
          f"1× {mib(one.rss_peak_kb):.1f} MiB, 10× {mib(ten.rss_peak_kb):.1f} MiB, "
          f"ratio 10×/1× = {ten.rss_peak_kb / one.rss_peak_kb:.2f} (goal: about 1.0); "
          f"RSS after the imports {mib(one.rss_base_kb):.1f} / {mib(ten.rss_base_kb):.1f} MiB, "
          f"growth during the export {mib(one.rss_peak_kb - one.rss_base_kb):.1f} / "
          f"{mib(ten.rss_peak_kb - ten.rss_base_kb):.1f} MiB")


# --- main ----------------------------------------------------------------------------------


def run(bench: Bench, rows: int, repeats: int) -> None:
    """The whole benchmark on a started server."""
    setup(bench, rows)
    print_header(bench, rows, repeats)
    results = {f"{OBJECTS} 1×": measure(bench, SHARD_1X, OBJECTS, rows, repeats),
               f"{MAPPING} 1×": measure(bench, SHARD_1X, MAPPING, rows, repeats),
               f"{OBJECTS} 10×": measure(bench, SHARD_10X, OBJECTS, 10 * rows,
                                         max(1, repeats - 1))}
    print_results(results)


def parse(argv: Iterable[str] | None) -> argparse.Namespace:
    """Command-line options (``--child`` and its options are internal)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200_000, help="N: pins and mappings of shard 1")
    ap.add_argument("--repeats", type=int, default=3, help="runs per measurement (best of)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--shard", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--table", help=argparse.SUPPRESS)
    ap.add_argument("--dest", help=argparse.SUPPRESS)
    return ap.parse_args(None if argv is None else list(argv))


def main(argv: Iterable[str] | None = None) -> None:
    """Parse the options, start the private server, run, and always clean up."""
    end_on_sigterm()
    args = parse(argv)
    if args.child:
        child(args.port, args.shard, args.table, args.dest)
        return
    sys.stdout.reconfigure(line_buffering=True)
    workdir = Path(tempfile.mkdtemp(prefix="farm-export-bench-", dir=TMP))
    outdir = workdir / "outfile"
    outdir.mkdir()
    try:
        server = ShardHostMariaDB.start_shard_host(secure_file_priv=str(outdir))
        try:
            run(Bench(server, workdir, outdir), args.rows, args.repeats)
        finally:
            server.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
