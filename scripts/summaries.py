"""A run's summary for a person at a terminal: a few lines read at a glance, in place of the
JSON line scripts read (``--json`` gives that line on a terminal too)."""

from __future__ import annotations

import sys

from farmcore.progress import RunProgress
from farmcore.runstate import CANCELLED, cancelled_line
from scripts.render import duration

BOARDS_SHOWN = 10


def for_people(as_json: bool) -> bool:
    """Whether to print for a person: stdout is a terminal and ``--json`` was not given."""
    return not as_json and sys.stdout.isatty()


def _per_table(counts: dict[str, int]) -> str:
    """``users 4,950 · pins 30,000``."""
    return " · ".join(f"{t} {n:,}" for t, n in counts.items())


def headline(doc: dict, kind: str, p: RunProgress) -> str:
    """``migrate-… done in 0:01:23 · 53,000 rows at 1,900 rows/s · 8/8 chunks``."""
    rid, status = doc["run_id"], doc["status"]
    chunks = f"{p.chunks_done:,}/{p.chunks_total:,} chunks"
    if status == "running":
        planned = "" if p.rows_expected is None else f", {p.rows_expected:,} rows"
        return f"{kind} run {rid} started: {p.chunks_total:,} chunks{planned}"
    return (f"{kind} run {rid} {status} in {duration(p.active_s)} · {p.rows_done:,} rows at "
            f"{p.rate_since_start:,.0f} rows/s · {chunks}")


def export_lines(doc: dict) -> list[str]:
    """Per table: rows written, or "unchanged, skipped" for parts found intact."""
    out = []
    for table, rows in doc["loaded"].items():
        skipped = doc.get("skipped", {}).get(table, 0)
        text = f"{rows:,} rows written" if rows or not skipped else ""
        if skipped:
            text += (", " if text else "") + f"{skipped:,} part(s) unchanged, skipped"
        out.append(f"  {table:<24} {text or '0 rows'}")
    return out


def board_lines(doc: dict, more_hint: str) -> list[str]:
    """The boards a rebalance moved (IDs and shard counts), at most ``BOARDS_SHOWN``."""
    boards = doc.get("boards", [])
    out = [f"  moved {len(boards):,} board(s)" + (":" if boards else "")]
    out += [f"    board {b['board']} now on {b['shards']} shards" for b in boards[:BOARDS_SHOWN]]
    if len(boards) > BOARDS_SHOWN:
        out.append(f"    … and {len(boards) - BOARDS_SHOWN:,} more: {more_hint}")
    return out


def summary_lines(doc: dict, kind: str, p: RunProgress) -> list[str]:
    """The lines of a run's summary: headline, what it wrote, what to look at next."""
    rid = doc["run_id"]
    lines = [headline(doc, kind, p)]
    if doc["status"] == "running":
        return [*lines, f"  follow it: 'farm status --run {rid}', or 'farm resume {rid} --wait'"]
    if kind == "verify":
        return [verify_line(doc), *([f"  mismatches   'farm mismatches --run {rid}' lists "
                                     "them all"] if doc["mismatches"] else [])]
    if kind == "export":
        lines += export_lines(doc)
    elif kind == "rebalance":
        lines += board_lines(doc, f"'farm summary {rid} --json' lists them all")
    else:
        lines.append(f"  loaded       {_per_table(doc['loaded']) or '-'}")
    quarantined = {t: n for t, n in doc.get("quarantined", {}).items() if n}
    if quarantined:
        lines.append(f"  quarantined  {_per_table(quarantined)} ('farm quarantine --run {rid}')")
    if doc["status"] == CANCELLED:
        lines.append("  " + cancelled_line(rid, p.chunks_total - p.chunks_done, p.cancelled_at))
    elif doc.get("failed_chunks"):
        lines.append(f"  failed       {doc['failed_chunks']:,} chunk(s): 'farm failed --run "
                     f"{rid}', then 'farm retry-failed --run {rid}'")
    return lines


def verify_line(summary: dict) -> str:
    """``verify run V of migrate run M done: 5,000 rows checked, 0 mismatches`` (and the
    chunks that failed, or that a cancel left not done)."""
    failed, vid = summary["failed_chunks"], summary["run_id"]
    tail = (f", {failed:,} chunk(s) not done: 'farm retry-failed --run {vid}' takes it up "
            "again" if summary["status"] == CANCELLED else
            f", {failed:,} chunk(s) failed: 'farm failed --run {vid}'" if failed else "")
    return (f"verify run {vid} of {summary['of_run']} {summary['status']}: "
            f"{sum(summary['checked'].values()):,} rows checked, {summary['mismatches']:,} "
            "mismatch(es)" + tail)
