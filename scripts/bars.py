"""Live progress on a terminal, redrawn in place on stderr: for a run, one bar per chunk kind
by rows (chunks beside) and one line for the whole run with its rate and ETA.

Off the terminal nothing is drawn (scripts read the JSON line, not a bar).
"""

from __future__ import annotations

import shutil
import sys
from typing import TextIO

from farmcore.progress import KindProgress, RunProgress
from farmcore.runstate import short_ending
from scripts.render import duration

BAR = 20


def bar(fraction: float, width: int = BAR) -> str:
    """``[#######.............]`` for a fraction in 0..1."""
    full = max(0, min(width, int(fraction * width)))
    return "[" + "#" * full + "." * (width - full) + "]"


def _rows(done: int, expected: int | None) -> tuple[str, float | None]:
    """``12,345/50,000 rows`` (``12,345 rows`` while the total is unknown) and the fraction."""
    if expected is None:
        return f"{done:,} rows", None
    return f"{done:,}/{expected:,} rows", (done / expected if expected else 1.0)


def _chunks(done: int, total: int, failed: int) -> str:
    """``3/7 chunks`` with `` · 1 failed`` when any failed."""
    return f"{done:,}/{total:,} chunks" + (f" · {failed:,} failed" if failed else "")


def kind_line(k: KindProgress, width: int) -> str:
    """One kind: its bar by rows (by chunks while rows are unknown), rows and chunks."""
    rows, frac = _rows(k.rows_done, k.rows_expected)
    if frac is None:
        frac = (k.chunks_done + k.chunks_failed) / k.chunks_total if k.chunks_total else 1.0
    return f"  {k.kind:<{width}} {bar(frac)} {rows} · " + _chunks(
        k.chunks_done, k.chunks_total, k.chunks_failed)


def run_line(p: RunProgress, width: int) -> str:
    """The whole run: rows, chunks, rows/s over the last minute, since start, and the ETA."""
    rows, _ = _rows(p.rows_done, p.rows_expected)
    rate = p.rate_last_minute or p.rate_since_start
    state = " · PAUSED" if p.paused else ""
    eta = f"ETA {duration(p.eta_s)}" if not p.finished else short_ending(
        p.status, p.chunks_failed, p.chunks_total - p.chunks_done)
    return (f"  {'run':<{width}} {rows} · {_chunks(p.chunks_done, p.chunks_total, p.chunks_failed)}"
            f" · {rate:,.0f} rows/s ({p.rate_since_start:,.0f} since start) · {eta}{state}")


def progress_lines(label: str, p: RunProgress) -> list[str]:
    """The lines drawn for a run: its label, one per kind, then the whole run."""
    width = max([3, *(len(k.kind) for k in p.kinds)])
    return [label, *(kind_line(k, width) for k in p.kinds), run_line(p, width)]


class LiveLines:
    """Lines redrawn in place on ``stream`` (stderr) while it is a terminal."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty()
        self.drawn = 0

    def draw(self, lines: list[str]) -> None:
        """Replace what was drawn last with ``lines`` (each cut to the terminal's width)."""
        if not self.enabled:
            return
        cols = shutil.get_terminal_size((100, 24)).columns
        lines = [line[:cols - 1] for line in lines]
        out = f"\x1b[{self.drawn}F" if self.drawn else ""  # back to the first line drawn
        out += "".join(f"\x1b[2K{line}\n" for line in lines)
        if len(lines) < self.drawn:  # fewer lines than last time: clear the rest
            out += "\x1b[2K\n" * (self.drawn - len(lines)) + f"\x1b[{self.drawn - len(lines)}F"
        self.stream.write(out)
        self.stream.flush()
        self.drawn = len(lines)

    def close(self) -> None:
        """Leave the last drawing as it is."""
        self.drawn = 0


class ProgressBars(LiveLines):
    """Draws ``progress_lines`` of a run in place; called with each new ``RunProgress``."""

    def __init__(self, label: str, stream: TextIO | None = None) -> None:
        super().__init__(stream)
        self.label = label

    def __call__(self, p: RunProgress) -> None:
        """Draw the run's progress lines."""
        self.draw(progress_lines(self.label, p))
