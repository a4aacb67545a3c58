"""Human-readable rendering of status and progress for the terminal."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import click
from tqdm import tqdm

from farmcore.ledger_size import size_line
from farmcore.runstate import ending


def duration(seconds: float | None) -> str:
    """``1:02:03`` style, or ``-``."""
    if seconds is None:
        return "-"
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def status_lines(view: dict) -> list[str]:
    """The lines of ``farm status``."""
    lines = []
    for run in view["runs"]:
        flags = " PAUSED" * run["paused"] + (f" THROTTLED ({run['throttled']})"
                                              if run["throttled"] else "")
        lines.append(f"run {run['run_id']}  {run['kind']}  {run['status']}{flags}  "
                     f"queue {run['queue']}  since {run['created_at']}")
        lines += _kind_lines(run["progress"], run["run_id"])
    if not view["runs"]:
        lines.append("no runs yet")
    workers = ", ".join(f"{h}: {w['workers']} alive, {w['busy']} busy"
                        + (f", desired {w['desired']}" if w["desired"] is not None else "")
                        + (", SERVING ANOTHER CONTROL DATABASE" if w.get("other_farm") else "")
                        for h, w in sorted(view["workers"].items())) or "none"
    if view.get("unreadable_workers"):
        workers += f" ({view['unreadable_workers']} unreadable entries of rq's worker registry)"
    lines.append(f"workers: {workers}")
    queues = ", ".join(f"{n}: {q['jobs']} jobs / {q['items']} items, {q['scheduled']} scheduled, "
                       f"{q['failed_jobs'] + q['failed_items']} failed"
                       for n, q in sorted(view["queues"].items())) or "none"
    lines.append(f"queues: {queues}")
    if "ledger" in view:
        lines.append(size_line(view["ledger"]))
    if view.get("sync"):
        lines.append(sync_line(view["sync"]))
    return lines


def sync_line(doc: dict) -> str:
    """``farm sync`` in one line: leader, lag, keys applied."""
    if "run_id" not in doc:
        return "sync: never run"
    if "lag_events" in doc:
        lag = f"lag {doc['lag_events']} transaction(s) / {doc['lag_seconds']} s"
    elif "server_position" in doc:  # reached, but the stored position is not one
        lag = "lag unknown (the stored position is not a GTID position: 'farm sync' says how)"
    else:
        lag = "lag unknown (legacy server not reached)"
    leader = f"{doc['leader']} on {doc['host']}" if doc["leader"] else "no leader"
    applied = ", ".join(f"{t} {n}" for t, n in doc["applied"].items()) or "nothing yet"
    waiting = f", waiting for {doc['waiting_for']}" if doc.get("waiting_for") else ""
    return f"sync: {leader}, at {doc['position']}, {lag}, applied: {applied}{waiting}"


def _rows(done: int, expected: int | None) -> str:
    """``12,345/50,000`` (``12,345/?`` while the total is unknown)."""
    return f"{done:,}/{'?' if expected is None else f'{expected:,}'}"


def _ending(p: dict, run_id: str) -> str:
    """How a run's line ends: its ETA, else how it ended (``farmcore.runstate.ending``:
    done, cancelled and when, or how many chunks failed, each with what to run next)."""
    if not p["finished"]:
        return f"ETA {duration(p['eta_s'])}"
    return ending(run_id, p["status"], p["chunks_failed"], p["chunks_total"] - p["chunks_done"],
                  p["cancelled_at"])


def _kind_lines(p: dict, run_id: str) -> list[str]:
    """The per-kind table of one run (its first column as wide as the longest kind), then
    the whole run's rates (paused time left out) and its ETA (``_ending``)."""
    w = max([12, *(len(k["kind"]) + 2 for k in p["kinds"])])
    out = [f"  {'kind':<{w}}{'chunks':>15}{'running':>9}{'failed':>8}"
           f"{'rows read':>25}{'written':>13}{'quarant.':>10}"]
    for k in p["kinds"]:
        chunks = f"{k['chunks_done']:,}/{k['chunks_total']:,}"
        out.append(f"  {k['kind']:<{w}}{chunks:>15}{k['chunks_running']:>9}"
                   f"{k['chunks_failed']:>8}{_rows(k['rows_done'], k['rows_expected']):>25}"
                   f"{k['rows_written']:>13,}{k['rows_quarantined']:>10,}")
    eta = _ending(p, run_id)
    out.append(f"  run: {_rows(p['rows_done'], p['rows_expected'])} rows, "
               f"{p['chunks_done']:,}/{p['chunks_total']:,} chunks, "
               f"{p['rate_last_minute']:,.0f} rows/s over the last minute, "
               f"{p['rate_since_start']:,.0f} since start (paused time left out), {eta}")
    return out


def runs_lines(runs: list[dict]) -> list[str]:
    """The lines of ``farm runs``: one per run, newest first."""
    if not runs:
        return ["no runs"]
    lines = [f"{'run':<34} {'kind':<10} {'status':<10} {'chunks done':>16} "
             f"{'rows written':>13}  {'started (UTC)':<19}  finished"]
    for r in runs:
        state = r["status"] + ("*" if r["paused"] else "")
        chunks = f"{r['chunks_done']:,}/{r['total_chunks']:,}" + (
            f" ({r['chunks_failed']:,} failed)" if r["chunks_failed"] else "")
        lines.append(f"{r['run_id']:<34} {r['kind']:<10} {state:<10} {chunks:>16} "
                     f"{r['rows_written']:>13,}  {_when(r['created_at'])}  "
                     f"{_when(r['finished_at'])}")
    if any(r["paused"] for r in runs):
        lines.append("* paused: 'farm unpause RUN_ID' lets workers take its chunks again")
    return lines


def mismatch_lines(rows: list[dict]) -> list[str]:
    """One line per verify mismatch: legacy table and key, the target, what differs."""
    return [f"mismatch {m['legacy_table']} {m['legacy_key']} {m['target']}: {m['problem']}"
            for m in rows]


def _when(at: object) -> str:
    """A DATETIME as ``2026-11-24 15:42:09``, or ``-``."""
    return str(at)[:19] if at else "-"


def compact(args: object, width: int = 200) -> str:
    """Arguments as one line of JSON, cut to ``width`` characters."""
    text = json.dumps(args, ensure_ascii=False, sort_keys=True, default=str)
    return text if len(text) <= width else text[:width - 1] + "…"


def echo_lines(lines: list[str]) -> None:
    """Print lines to stdout."""
    for line in lines:
        click.echo(line)


def note(line: str) -> None:
    """``farm: note: <line>`` on stderr."""
    click.echo(f"farm: note: {line}", err=True)


@contextmanager
def database_bar(total: int) -> Iterator[Callable[[int], object]]:
    """A bar of databases created (only on a terminal); yields its ``update``."""
    with tqdm(total=total, unit="db", desc="shards init", disable=not sys.stderr.isatty(),
              leave=False) as bar:
        yield bar.update
