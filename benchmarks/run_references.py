"""Print rq / raw-Redis reference figures: ``python -m benchmarks.run_references``."""

from __future__ import annotations

import argparse

from benchmarks import references as ref


def main() -> None:
    """Measure every reference figure on Redis db 13 and print a table."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--redis-url", default="redis://127.0.0.1:6379/13")
    ap.add_argument("--n", type=int, default=100_000, help="jobs for the enqueue figures")
    args = ap.parse_args()
    rows = [
        (f"rq enqueue_many+pipeline (n={args.n})", ref.rq_enqueue_many(args.redis_url, args.n)),
        (f"raw pipelined RPUSH (n={args.n})", ref.raw_rpush(args.redis_url, args.n)),
        ("rq SimpleWorker burst (n=2000)", ref.rq_simpleworker_rate(args.redis_url, 2000)),
        ("rq forking Worker burst (n=500)", ref.rq_forking_worker_rate(args.redis_url, 500)),
    ]
    print(f"{'reference':<38} {'jobs/s':>9} {'bytes/job':>9} {'startup s':>9} {'corr jobs/s':>11}")
    for name, d in rows:
        b = f"{d['bytes_per_job']:.0f}" if "bytes_per_job" in d else "-"
        s = f"{d['startup_s']:.2f}" if "startup_s" in d else "-"
        c = f"{d['jobs_per_s_corrected']:.0f}" if "jobs_per_s_corrected" in d else "-"
        print(f"{name:<38} {d['jobs_per_s']:>9.0f} {b:>9} {s:>9} {c:>11}")


if __name__ == "__main__":
    main()
