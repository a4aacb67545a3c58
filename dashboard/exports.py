"""The nightly export calendar: for each table and date an export run wrote, whether the
destination holds that folder's ``_SUCCESS`` (asked of the destination itself, the one
place a reader trusts). A marker seen is remembered for a while; a missing one is asked
again sooner, so a finishing export shows within seconds. A destination is asked with a
status view's bound (FARM_STATUS_TIMEOUT, no retry), and one that did not answer is not
asked again for ``MISSING_TTL``; once a reading of the calendar has spent that bound, the
cells left are unknown until the next one. A page waits for the destinations one bound
or two at most, however many cells and destinations it shows."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from exporters.destinations import Destination, open_destination
from exporters.export import SUCCESS, folders_named
from farmcore.ledger import Ledger
from shardfarm.errors import FarmError
from shardfarm.tuning import status_timeout

RUNS_LOOKED_AT = 60
SEEN_TTL = 300.0
MISSING_TTL = 5.0


@dataclass(frozen=True)
class Cell:
    """One table on one date: its ``_SUCCESS`` state and the newest run that exported it."""

    table: str
    date: str
    dest: str
    success: bool | None   # None: the destination could not be asked
    run_id: str
    run_status: str


class Calendar:
    """Reads export runs from the ledger and asks their destinations for ``_SUCCESS``."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self._asked: dict[tuple[str, str], tuple[float, bool | None]] = {}
        self._dests: dict[str, Destination] = {}
        self._silent: dict[str, float] = {}  # destination -> when to ask it again

    def cells(self) -> list[Cell]:
        """The newest export run's view of each (destination, table, date), newest dates
        first; a cell not asked in this reading's time is unknown (``success`` None)."""
        deadline = time.monotonic() + status_timeout()
        newest: dict[tuple[str, str, str], tuple[str, str]] = {}
        for run_id, run_status, params in self.ledger.pool.query(
                "SELECT run_id, status, params FROM runs WHERE kind = 'export' "
                "ORDER BY created_at DESC LIMIT %s", (RUNS_LOOKED_AT,)):
            try:
                doc = json.loads(params)
            except ValueError:
                continue
            for folder in folders_named(doc):
                newest.setdefault(folder, (run_id, run_status))
        out = [Cell(t, d, dest, self._success(dest, f"{t}/dt={d}/{SUCCESS}", deadline), r, s)
               for (dest, t, d), (r, s) in newest.items()]
        return sorted(out, key=lambda c: (c.date, c.table), reverse=True)

    def grid(self) -> tuple[list[str], list[str], dict[tuple[str, str], Cell]]:
        """``(dates newest first, tables, (table, date) -> cell)`` for the page."""
        cells = self.cells()
        dates = sorted({c.date for c in cells}, reverse=True)
        tables = sorted({c.table for c in cells})
        by = {}
        for c in cells:
            by.setdefault((c.table, c.date), c)
        return dates, tables, by

    def _success(self, dest: str, key: str, deadline: float) -> bool | None:
        hit = self._asked.get((dest, key))
        if hit and time.monotonic() < hit[0]:
            return hit[1]
        now = time.monotonic()
        if now >= deadline or now < self._silent.get(dest, 0.0):
            return None  # this reading's time is spent, or it did not answer a moment ago
        try:
            if dest not in self._dests:
                self._dests[dest] = open_destination(dest, quick=True)
            found: bool | None = self._dests[dest].exists(key)
        except (FarmError, OSError):  # OSError: a path through a file, a directory not readable
            found = None
            self._silent[dest] = time.monotonic() + MISSING_TTL
        ttl = SEEN_TTL if found else MISSING_TTL
        self._asked[(dest, key)] = (time.monotonic() + ttl, found)
        return found
