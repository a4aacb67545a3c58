"""``/metrics`` of the dashboard: a Prometheus collector that reads the ledger, Redis and the
export destinations at scrape time, so every value is what the ledger says at that moment
(nothing is counted on the side). Names follow Prometheus conventions: ``shardfarm_`` prefix,
``_total`` for counters, seconds for times."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from dashboard.exports import Calendar
from dashboard.model import Board, Reader

RUNS_EXPORTED = 50  # the newest runs with series of their own


class LedgerCollector(Collector):
    """Reads one board (and the export calendar) per scrape and turns it into metrics."""

    def __init__(self, reader: Reader, calendar: Calendar) -> None:
        self.reader, self.calendar = reader, calendar

    def describe(self) -> list[Metric]:
        """Nothing up front: registering must not read the ledger."""
        return []

    def collect(self) -> Iterator[Metric]:
        """Every family, read now."""
        board = self.reader.board(limit=RUNS_EXPORTED)
        yield from run_families(board)
        yield from farm_families(board)
        yield from sync_families(board.sync)
        yield export_family(self.calendar)


def run_families(board: Board) -> Iterator[Metric]:
    """Chunks by state, rows by table, rates, ETA, paused and throttled, per run."""
    chunks = GaugeMetricFamily("shardfarm_run_chunks", "Chunks of a run by state.",
                               labels=["run_id", "kind", "state"])
    rows = {name: CounterMetricFamily(f"shardfarm_rows_{name}", f"Rows {name} by a run's "
                                      "chunks, per table (chunk kind).",
                                      labels=["run_id", "table"])
            for name in ("read", "written", "quarantined")}
    rate = GaugeMetricFamily("shardfarm_run_rows_per_second", "Rows read per second of "
                             "unpaused time: over the last minute and since the run started.",
                             labels=["run_id", "window"])
    eta = GaugeMetricFamily("shardfarm_run_eta_seconds", "Seconds until the run is done, "
                            "at its current rate (absent while unknown).", labels=["run_id"])
    paused = GaugeMetricFamily("shardfarm_run_paused", "1 while the run is paused.",
                               labels=["run_id"])
    throttled = GaugeMetricFamily("shardfarm_run_throttled", "1 while the run waits for a "
                                  "busy server (throttle).", labels=["run_id"])
    reasons = GaugeMetricFamily("shardfarm_quarantined_rows", "Quarantined legacy rows of a "
                                "run by table and reason.", labels=["run_id", "table", "reason"])
    for card in board.runs:
        rid, p = card.row["run_id"], card.progress
        pending = p.chunks_total - p.chunks_done - p.chunks_failed - p.chunks_running
        for state, n in (("pending", pending), ("running", p.chunks_running),
                         ("done", p.chunks_done), ("failed", p.chunks_failed)):
            chunks.add_metric([rid, card.row["kind"], state], n)
        for k in p.kinds:
            rows["read"].add_metric([rid, k.kind], k.rows_done)
            rows["written"].add_metric([rid, k.kind], k.rows_written)
            rows["quarantined"].add_metric([rid, k.kind], k.rows_quarantined)
        rate.add_metric([rid, "1m"], p.rate_last_minute)
        rate.add_metric([rid, "run"], p.rate_since_start)
        if p.eta_s is not None:
            eta.add_metric([rid], p.eta_s)
        paused.add_metric([rid], int(card.state == "paused"))
        throttled.add_metric([rid], int(card.throttled is not None))
        for table, reason, n in card.quarantine:
            reasons.add_metric([rid, table, reason], n)
    yield from (chunks, *rows.values(), rate, eta, paused, throttled, reasons)


def farm_families(board: Board) -> Iterator[Metric]:
    """Queue depths and workers per host and state."""
    depth = {key: GaugeMetricFamily(f"shardfarm_queue_{name}", help_, labels=["queue"])
             for key, name, help_ in (
                 ("jobs", "jobs", "rq jobs waiting on the queue."),
                 ("items", "items", "Items the waiting jobs carry."),
                 ("scheduled", "scheduled_jobs", "Jobs scheduled for later (backoff)."),
                 ("failed_jobs", "failed_jobs", "Jobs rq gave up on."),
                 ("failed_items", "failed_items", "Items that failed for good."))}
    for queue, q in board.queues.items():
        for key, family in depth.items():
            family.add_metric([queue], q[key])
    workers = GaugeMetricFamily("shardfarm_workers", "Worker processes per host and state.",
                                labels=["host", "state"])
    desired = GaugeMetricFamily("shardfarm_workers_desired", "Workers the supervisors of a "
                                "host converge to.", labels=["host"])
    for host, h in board.workers.items():
        states: dict[str, int] = {}
        for w in h["workers"]:
            states[w["state"]] = states.get(w["state"], 0) + 1
        for state, n in sorted(states.items()):
            workers.add_metric([host, state], n)
        if h["desired"] is not None:
            desired.add_metric([host], h["desired"])
    yield from (*depth.values(), workers, desired)


def sync_families(doc: dict | None) -> Iterator[Metric]:
    """``farm sync``: lag behind the legacy server (while it answers), keys applied per
    table, and whether a leader holds the lease. Nothing before the first sync."""
    if not doc:
        return
    leading = GaugeMetricFamily("shardfarm_sync_leader", "1 while a farm sync process holds "
                                "the lease.")
    leading.add_metric([], int(bool(doc["leader"])))
    applied = CounterMetricFamily("shardfarm_sync_applied_keys", "Legacy keys farm sync "
                                  "applied to the target, per legacy table.", labels=["table"])
    for table, n in sorted(doc["applied"].items()):
        applied.add_metric([table], n)
    yield from (leading, applied)
    if "lag_events" in doc:
        yield GaugeMetricFamily("shardfarm_sync_lag_transactions", "Legacy binlog transactions "
                                "farm sync has not applied yet.", value=doc["lag_events"])
        yield GaugeMetricFamily("shardfarm_sync_lag_seconds", "Seconds since the legacy "
                                "change farm sync last checkpointed (0 when caught up).",
                                value=doc["lag_seconds"])


def export_family(calendar: Calendar) -> Metric:
    """``shardfarm_export_success``: 1 when the folder of a table and date has ``_SUCCESS``."""
    family = GaugeMetricFamily("shardfarm_export_success", "1 when the export of a table for "
                               "a date holds _SUCCESS at its destination.",
                               labels=["table", "date"])
    seen: set[tuple[str, str]] = set()
    for cell in calendar.cells():
        if (cell.table, cell.date) not in seen and cell.success is not None:
            seen.add((cell.table, cell.date))
            family.add_metric([cell.table, cell.date], int(cell.success))
    return family


def registry(reader: Reader, calendar: Calendar) -> CollectorRegistry:
    """A registry holding only the ledger collector (no process metrics of the dashboard)."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(LedgerCollector(reader, calendar))
    return reg
