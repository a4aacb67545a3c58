"""The nightly export at fleet size: every table of 4,096 shards, to ``file://`` and to S3.

Usage: ``python -m benchmarks.export_fleet [--users 1500] [--workers 2] [--rows 100000]``.

On the full-size layout of ``benchmarks._fleet`` (two private mariadbd servers standing in
for eight host pairs, 4,096 shards, 4,096 mod buckets) with ``--users`` legacy users
generated and migrated, ``--workers`` workers are started and then, timed from the
command to the end of the run (worker start-up is not the export's cost):

- ``farm export --date D --wait`` of all 13 tables (53,248 parts) to ``file://`` and then
  to an S3 API server (moto in server mode, started here on a private port);
- from each run's chunk rows in the control database: worker seconds per part, the fixed
  cost of a part (worker seconds per part of the chunks whose shards were all empty) and
  the cost per row (the other chunks' seconds beyond that fixed cost, per row);
- the per-row rate on one large shard (``--rows`` pins and as many ``board_has_pins``
  rows, loaded afterwards into one shard): ``dump_part`` vs ``SELECT … INTO OUTFILE`` +
  ``gzip -6`` of the same table on the same server (``benchmarks.export_bench.measure``).

Progress goes to stderr, results to stdout. The machine may be shared: the figures
say what this machine did in this run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import boto3

from benchmarks._fleet import ROOT, SHARDS, TMP, Fleet, fleet, say
from benchmarks.export_bench import Run, measure
from benchmarks.export_data import MAPPING, OBJECTS, load, write_mappings, write_pins
from benchmarks.export_data import Bench as RowsBench
from exporters.dump import EXPORT_TABLES
from tests.servers import free_port

DATE = "2026-01-01"
BUCKET = "farm-fleet-export"
LARGE_SHARD = 3  # on the first server; emptied and filled for the per-row comparison


@contextmanager
def moto_server() -> Iterator[dict[str, str]]:
    """moto's S3 API server in its own process on a private port; the AWS environment."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                             str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    env = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}
    try:
        client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"],
                              aws_access_key_id="bench", aws_secret_access_key="bench",
                              region_name="us-east-1")
        deadline = time.monotonic() + 30
        while True:
            try:
                client.create_bucket(Bucket=BUCKET)
                break
            except Exception:  # noqa: BLE001 - not listening yet
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("moto server did not start") from None
                time.sleep(0.2)
        yield env
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def chunk_rows(f: Fleet, run_id: str) -> list[tuple[float, int, int]]:
    """``(seconds, parts, rows)`` of every chunk of a run, from the control database."""
    conn = f.connect(0, database="farm_control")
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT seconds, JSON_EXTRACT(counts, '$.parts'), rows_written "
                        "FROM chunks WHERE run_id = %s AND state = 'done'", (run_id,))
            return [(float(s), int(p), int(r)) for s, p, r in cur.fetchall()]
    finally:
        conn.close()


def split(chunks: list[tuple[float, int, int]]) -> tuple[float, float]:
    """``(fixed seconds per part, seconds per row)``: the fixed cost is what a chunk of empty
    shards spent per part; the rest of the other chunks' seconds, per row they wrote."""
    empty = [(s, p) for s, p, r in chunks if r == 0]
    full = [(s, p, r) for s, p, r in chunks if r > 0]
    if empty:
        fixed = sum(s for s, _ in empty) / sum(p for _, p in empty)
    else:  # every chunk wrote rows: the least busy chunk per part is an upper bound
        fixed = min(s / p for s, p, _ in chunks)
    rows = sum(r for _, _, r in full)
    rest = sum(s for s, _, _ in full) - fixed * sum(p for _, p, _ in full)
    return fixed, max(0.0, rest / rows) if rows else 0.0


def export_run(f: Fleet, label: str, url: str, env: dict[str, str]) -> dict:
    """One timed ``farm export --wait`` of every table to ``url``; its figures."""
    say(f"farm export --date {DATE} --dest {url} --wait ({label})")
    start = time.perf_counter()
    doc = f.farm_json("export", "--date", DATE, "--dest", url, "--wait", **env)
    seconds = time.perf_counter() - start
    if doc.get("status") != "done":
        raise RuntimeError(f"export to {url} ended {doc}")
    chunks = chunk_rows(f, doc["run_id"])
    parts = sum(p for _, p, _ in chunks)
    fixed, per_row = split(chunks)
    return {"label": label, "parts": parts, "chunks": len(chunks), "seconds": seconds,
            "rows": sum(r for _, _, r in chunks), "busy": sum(s for s, _, _ in chunks),
            "fixed": fixed, "per_row": per_row}


def print_exports(results: list[dict], workers: int) -> None:
    """The table of the export runs."""
    print(f"\n{'export of 13 tables, ' + str(workers) + ' workers':<34} {'parts':>7} "
          f"{'chunks':>6} {'rows':>9} {'seconds':>8} {'parts/s':>8} {'ms/part':>8} "
          f"{'fixed ms/part':>13} {'µs/row':>7}")
    for r in results:
        print(f"{r['label']:<34} {r['parts']:>7,} {r['chunks']:>6,} {r['rows']:>9,} "
              f"{r['seconds']:>8.1f} {r['parts'] / r['seconds']:>8.1f} "
              f"{1000 * r['busy'] / r['parts']:>8.2f} {1000 * r['fixed']:>13.2f} "
              f"{1e6 * r['per_row']:>7.1f}")
    print("seconds: from the command to the end of the run = seconds per night; ms/part: "
          "worker seconds per part (chunk seconds / parts); fixed ms/part: the same for "
          "chunks of empty shards only; µs/row: the other chunks' seconds beyond that, per row")


def large_shard(f: Fleet, outdir: Path, rows: int, repeats: int) -> dict[str, tuple[Run, Run]]:
    """Per-row rate on one large shard: ``dump_part`` vs INTO OUTFILE + gzip -6."""
    bench = RowsBench(f.servers[0], f.workdir, outdir)
    out = {}
    for table, write in ((OBJECTS, write_pins), (MAPPING, write_mappings)):
        conn = f.connect(0)
        with conn.cursor() as cur:
            cur.execute(f"TRUNCATE TABLE `db{LARGE_SHARD:05d}`.`{table}`")
        conn.close()
        path = f.workdir / f"large-{table}.tsv"
        say(f"loading {rows:,} rows into db{LARGE_SHARD:05d}.{table}")
        write(path, LARGE_SHARD, rows)
        load(bench, LARGE_SHARD, table, path)
        path.unlink()
        out[table] = measure(bench, LARGE_SHARD, table, rows, repeats)
    return out


def print_large(results: dict[str, tuple[Run, Run]]) -> None:
    """Rates and ratios of the large shard."""
    print(f"\n{'one large shard':<44} {'rows':>9} {'seconds':>8} {'rows/s':>9}")
    for table, (farm, ref) in results.items():
        print(f"{'farm dump_part jsonl.gz, ' + table:<44} {farm.rows:>9,} {farm.seconds:>8.2f} "
              f"{farm.rate:>9,.0f}")
        print(f"{'ref. INTO OUTFILE + gzip -6, ' + table:<44} {ref.rows:>9,} {ref.seconds:>8.2f} "
              f"{ref.rate:>9,.0f}")
    for table, (farm, ref) in results.items():
        print(f"ratio (rows/s) farm/reference, {table}: {farm.rate / ref.rate:.2f} "
              f"(output size {farm.out_bytes / ref.out_bytes:.2f})")


def run(f: Fleet, args: argparse.Namespace, outdir: Path) -> None:
    """Both exports with running workers, then the large shard."""
    load_avg = os.getloadavg()
    results = []
    with moto_server() as aws, f.workers(args.workers, **aws):
        results.append(export_run(f, "file://", f"file://{f.workdir / 'exports'}", aws))
        results.append(export_run(f, "re-export file:// (all intact)",
                                  f"file://{f.workdir / 'exports'}", aws))
        results.append(export_run(f, "s3:// (moto server)", f"s3://{BUCKET}/nightly", aws))
    print(f"\nfleet: {SHARDS} shards, 13 tables ({len(EXPORT_TABLES)}), {args.users} users; "
          f"setup {', '.join(f'{k} {v:.0f}s' for k, v in f.timings.items())}; "
          f"load average at start {load_avg[0]:.1f} (2 cores, shared)")
    print_exports(results, args.workers)
    if args.rows:
        print_large(large_shard(f, outdir, args.rows, args.repeats))


def main() -> None:
    """Parse the options, build the fleet, run, clean up."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=1500)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rows", type=int, default=100_000, help="rows of the large shard (0: skip)")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)
    outdir = Path(tempfile.mkdtemp(prefix="farm-fleet-outfile-", dir=TMP))
    try:
        with fleet(args.users, workers=args.workers, secure_file_priv=str(outdir)) as f:
            run(f, args, outdir)
    finally:
        shutil.rmtree(outdir, ignore_errors=True)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
