"""What the dashboard shows, read the way ``farm status`` and ``farm runs`` read it.

Every query is an aggregate that an index serves (a run's chunks by ``(run_id, state)``,
the quarantine by ``(run_id, reason)``); nothing loads chunks one by one. A finished
run's figures do not change until its status does, so they are kept (keyed by status and
finish time); an active run's are read again at most every ``FRESH_SECONDS``.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field, replace
from datetime import datetime

from dashboard import chart
from farmcore import keys
from farmcore.progress import RunProgress, read_progress
from farmcore.runstate import ENDED
from jobs import status
from jobs.runtime import Runtime
from loaders.migration import follower

FINISHED = ENDED  # done, failed, cancelled
FRESH_SECONDS = 1.5  # an active run is read again after this, or 3x its last read's time
RUN_COLUMNS = ("run_id", "kind", "status", "paused", "total_chunks", "created_at",
               "finished_at")
KEEP_FINISHED = 5000  # finished runs' figures kept at most
CHARTED = 10  # the newest runs drawn with a chart (and every active one)
SYNC_SECONDS = 5.0  # ``farm sync``'s state (and the legacy server's position) read again after
FAILURES_SHOWN = 10


@dataclass
class RunCard:
    """One run as the page shows it."""

    row: dict                       # the run's row (``RUN_COLUMNS``)
    progress: RunProgress
    failures: list[dict] = field(default_factory=list)
    quarantine: list[tuple[str, str, int]] = field(default_factory=list)
    chart: list[tuple[float, float]] | None = None  # None: not read
    throttled: str | None = None

    @property
    def active(self) -> bool:
        """Still running or paused (not ended: done, failed or cancelled)."""
        return self.row["status"] not in FINISHED

    @property
    def state(self) -> str:
        """``paused``, ``throttled`` or the run's status."""
        if self.row["paused"] and self.active:
            return "paused"
        return "throttled" if self.throttled and self.active else self.row["status"]


@dataclass
class Board:
    """Everything on the page at one moment."""

    runs: list[RunCard]
    workers: dict[str, dict]
    queues: dict[str, dict]
    at: datetime
    sync: dict | None = None  # ``farm sync status``; None before the first sync


class Reader:
    """Reads boards from one runtime, keeping finished runs' figures between reads."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self._kept: dict[str, tuple[tuple, RunCard]] = {}
        self._fresh: dict[str, tuple[float, RunCard]] = {}
        self._sync: tuple[float, dict | None] = (-1.0, None)

    def board(self, limit: int = 50, kind: str | None = None, offset: int = 0) -> Board:
        """The newest ``limit`` runs (of ``kind``, after skipping ``offset``) with their
        figures, workers and queues. Charts for active runs and the newest few."""
        rows = self.run_rows(limit, kind, offset)
        cards = [self.card(row, charted=row["status"] not in FINISHED or i + offset < CHARTED)
                 for i, row in enumerate(rows)]
        self._throttles([c for c in cards if c.active])
        (now,), = self.rt.ledger.pool.query("SELECT NOW(3)")
        return Board(cards, self.workers([c for c in cards if c.active]),
                     status.queues_view(self.rt), now, self.sync())

    def sync(self) -> dict | None:
        """``farm sync``'s leader, position, lag and keys applied, read again at most every
        ``SYNC_SECONDS`` (the lag asks the legacy server for its position)."""
        read_at, doc = self._sync
        if read_at < 0 or time.monotonic() - read_at >= SYNC_SECONDS:
            doc = follower.view(self.rt.ledger, self.rt.settings.legacy_dsn)
            self._sync = (time.monotonic(), doc)
        return doc

    def run_rows(self, limit: int, kind: str | None = None, offset: int = 0) -> list[dict]:
        """The newest runs' rows alone (the ``runs`` table by its ``created_at`` index): a
        run's chunk totals come with its progress, read only when it may have changed."""
        where, params = ("WHERE kind = %s", [kind]) if kind else ("", [])
        rows = self.rt.ledger.pool.query(
            f"SELECT {', '.join(RUN_COLUMNS)} FROM runs {where} ORDER BY created_at DESC "
            "LIMIT %s OFFSET %s", [*params, limit, offset])
        out = [dict(zip(RUN_COLUMNS, r, strict=True)) for r in rows]
        for r in out:
            r["paused"] = bool(r["paused"])
        return out

    def card(self, row: dict, charted: bool = True) -> RunCard:
        """One run's card: kept while finished and unchanged, re-read when stale; its chart
        read when asked for."""
        card = self._cached(row) or self._read(row)
        if charted and card.chart is None:
            card.chart = chart.series(self.rt.ledger, row["run_id"])
        return replace(card, row=row)

    def _cached(self, row: dict) -> RunCard | None:
        run_id = row["run_id"]
        kept = self._kept.get(run_id)
        if row["status"] in FINISHED:
            return kept[1] if kept and kept[0] == _key(row) else None
        fresh = self._fresh.get(run_id)
        return fresh[1] if fresh and time.monotonic() < fresh[0] else None

    def _read(self, row: dict) -> RunCard:
        ledger, run_id = self.rt.ledger, row["run_id"]
        began = time.monotonic()
        progress = read_progress(ledger, run_id)
        failures = ledger.failures(run_id, limit=FAILURES_SHOWN) if progress.chunks_failed \
            else []
        card = RunCard(row, progress, failures, ledger.quarantine.reasons(run_id))
        self._fresh.pop(run_id, None)
        if row["status"] in FINISHED:
            if len(self._kept) >= KEEP_FINISHED:
                self._kept.clear()
            self._kept[run_id] = (_key(row), card)
        else:
            self._kept.pop(run_id, None)
            took = time.monotonic() - began
            self._fresh[run_id] = (time.monotonic() + max(FRESH_SECONDS, 3 * took), card)
        return card

    def _throttles(self, cards: list[RunCard]) -> None:
        if not cards:
            return
        why = self.rt.redis.mget([keys.throttle(c.row["run_id"]) for c in cards])
        for card, reason in zip(cards, why, strict=True):
            card.throttled = status.throttle_text(reason)

    def workers(self, active: list[RunCard]) -> dict[str, dict]:
        """Per host: the supervisors' desired count and each worker with what it is doing
        (the chunk it holds a lease on, else its rq job)."""
        doing = self._leases([c.row["run_id"] for c in active])
        hosts: dict[str, dict] = defaultdict(lambda: {"desired": None, "workers": []})
        workers, _ = status.read_workers(self.rt.redis)  # a forged entry is skipped
        for host, summary in status.workers_view(self.rt, workers).items():
            hosts[host]["desired"] = summary["desired"]
        for w in workers:
            host = status.host_of(w)
            pid = w.name.split(":")[1] if w.name.count(":") == 2 else str(w.pid)
            job, state = w.get_current_job_id(), w.get_state()
            hosts[host]["workers"].append({
                "name": w.name, "state": str(getattr(state, "value", state)),
                "doing": doing.get(f"{host}:{pid}") or (f"job {job}" if job else "")})
        for h in hosts.values():
            h["workers"].sort(key=lambda w: w["name"])
        return dict(sorted(hosts.items()))

    def _leases(self, run_ids: list[str]) -> dict[str, str]:
        """``host:pid`` of each lease owner -> ``run R chunk N (kind)``, for active runs."""
        if not run_ids:
            return {}
        marks = ",".join(["%s"] * len(run_ids))
        out = {}
        for owner, run_id, chunk_id, kind in self.rt.ledger.pool.query(
                "SELECT lease_owner, run_id, chunk_id, kind FROM chunks WHERE run_id IN "
                f"({marks}) AND state = 'running'", run_ids):
            if owner:
                out[":".join(owner.split(":")[:2])] = f"run {run_id} chunk {chunk_id} ({kind})"
        return out


def _key(row: dict) -> tuple:
    """What changes when a finished run's figures may have (retry-failed reopens it)."""
    return (row["status"], row["finished_at"], row["total_chunks"])
