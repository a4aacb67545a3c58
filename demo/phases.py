"""The demo's phases: how long each took, and how each phase's run ended."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from jobs import runs
from jobs.runtime import Runtime


@dataclass
class RunResult:
    """How one run the demo started ended."""

    phase: str
    run_id: str
    status: str
    total: int
    failed: int
    summary: dict
    mismatches: int = 0

    @property
    def ok(self) -> bool:
        """Every chunk done and, for a verify run, no mismatch."""
        return self.status == "done" and self.failed == 0 and self.mismatches == 0

    def problem(self) -> str:
        """``run R: failed, 3 of 48 chunks failed`` (or its mismatches)."""
        parts = []
        if self.status != "done" or self.failed:
            parts.append(f"{self.status}, {self.failed} of {self.total} chunks failed")
        if self.mismatches:
            parts.append(f"{self.mismatches:,} mismatches")
        return f"run {self.run_id}: {'; '.join(parts)}"


def run_result(rt: Runtime, phase: str, run_id: str, status: str) -> RunResult:
    """The outcome of a finished run, read back from the ledger."""
    summary = runs.summary(rt, run_id)
    total = rt.ledger.run(run_id)["total_chunks"]
    return RunResult(phase, run_id, status, total, summary["failed_chunks"], summary)


def verify_result(rt: Runtime, run_id: str, status: str) -> RunResult:
    """The outcome of a finished verify run, with the mismatches it recorded."""
    result = run_result(rt, "verify", run_id, status)
    result.mismatches, _ = rt.ledger.mismatches.of_run(run_id, limit=0)
    return result


class Phases:
    """Times each phase, announces it, and keeps how its run ended."""

    def __init__(self, announce: Callable[[str], None]) -> None:
        self.announce = announce
        self.times: dict[str, tuple[float, int | None]] = {}
        self.results: dict[str, RunResult] = {}

    @contextmanager
    def phase(self, name: str, rows: int | None = None) -> Iterator[None]:
        """Time the ``with`` block as phase ``name``."""
        self.announce(name)
        t0 = time.monotonic()
        yield
        self.times[name] = (time.monotonic() - t0, rows)

    def set_rows(self, name: str, rows: int) -> None:
        """Record how many rows a phase moved (for its rate)."""
        self.times[name] = (self.times[name][0], rows)

    def record(self, result: RunResult) -> RunResult:
        """Keep how the run of phase ``result.phase`` ended."""
        self.results[result.phase] = result
        return result

    def failed(self, *names: str) -> RunResult | None:
        """The first of these phases whose run did not end well, if any."""
        return next((r for n in names if (r := self.results.get(n)) and not r.ok), None)

    def bad(self) -> list[RunResult]:
        """The runs that did not end well."""
        return [r for r in self.results.values() if not r.ok]

    def lines(self) -> list[str]:
        """``phase  seconds  rows/s`` lines; a phase whose run failed says so instead."""
        out = []
        for name, (secs, rows) in self.times.items():
            if (r := self.results.get(name)) and not r.ok:
                tail = f"FAILED ({r.problem()})"
            else:
                tail = f"{rows / secs:>10,.0f} rows/s" if rows and secs > 0 else ""
            out.append(f"  {name:<24}{secs:>7.1f} s  {tail}")
        return out
