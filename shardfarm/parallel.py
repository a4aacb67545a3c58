"""Calls run a few at a time on a thread pool (bulk writers waiting on several servers)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor


def run_parallel(calls: list[tuple], threads: int) -> None:
    """Run ``fn(*args)`` for each call on a thread pool; the first error is raised."""
    if len(calls) <= 1 or threads <= 1:
        for fn, *args in calls:
            fn(*args)
        return
    with ThreadPoolExecutor(threads, thread_name_prefix="shard-writer") as pool:
        for f in [pool.submit(fn, *args) for fn, *args in calls]:
            f.result()
