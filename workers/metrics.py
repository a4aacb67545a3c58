"""A supervisor's Prometheus metrics (``farm workers --metrics-port``): what it observes of
its own workers.

Workers are separate processes, so they do not keep metrics of their own: when the
supervisor serves metrics it hands each worker a Redis list (``FARM_METRICS_KEY``) where
the worker pushes one small record per job it ends (queue, outcome, seconds); the
supervisor drains it every tick into its job latency histogram. Workers by state are read
from rq's worker registry for this supervisor's children.
"""

from __future__ import annotations

import errno
import json
import logging
import os
from collections.abc import Iterable

import redis
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from jobs.status import read_workers
from shardfarm.errors import ConfigError

log = logging.getLogger(__name__)
ENV_KEY = "FARM_METRICS_KEY"
KEEP = 10_000          # records a list holds at most while nobody drains it
KEY_TTL = 3600
DRAIN = 1000           # records taken per tick
MAX_SERIES = 200       # (queue, outcome) pairs the job histogram holds at most
BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)


def report_job(conn: redis.Redis, queue: str, outcome: str, seconds: float) -> None:
    """From a worker: record one job's end, if this worker's supervisor collects them."""
    key = os.environ.get(ENV_KEY)
    if not key:
        return
    doc = json.dumps({"queue": queue, "outcome": outcome, "seconds": round(seconds, 6)})
    pipe = conn.pipeline(transaction=False)
    pipe.rpush(key, doc).ltrim(key, -KEEP, -1).expire(key, KEY_TTL)
    try:
        pipe.execute()
    except redis.ResponseError:  # not a list (written into Redis): the supervisor replaces it
        log.debug("job record not kept: %s is not a list", key)


class SupervisorMetrics:
    """The supervisor's registry: job latency histogram, jobs ended, workers by state."""

    def __init__(self, host: str, key: str) -> None:
        self.host, self.key = host, key
        self._series: set[tuple[str, str]] = set()  # (queue, outcome) label pairs in use
        self.registry = CollectorRegistry(auto_describe=True)
        self.latency = Histogram("shardfarm_job_duration_seconds", "Seconds a job ran on a "
                                 "worker of this supervisor, by queue and outcome.",
                                 ["queue", "outcome"], buckets=BUCKETS, registry=self.registry)
        self.ended = Counter("shardfarm_jobs_ended", "Jobs ended on this supervisor's "
                             "workers, by queue and outcome.", ["queue", "outcome"],
                             registry=self.registry)
        self.workers = Gauge("shardfarm_supervisor_workers", "This supervisor's workers by "
                             "state (desired, alive, and rq's busy / idle / …).",
                             ["host", "state"], registry=self.registry)

    def serve(self, port: int, addr: str = "127.0.0.1") -> None:
        """Start the HTTP endpoint (a thread); a port in use is one line."""
        try:
            start_http_server(port, addr=addr, registry=self.registry)
        except OSError as exc:
            why = "the port is in use" if exc.errno == errno.EADDRINUSE else exc.strerror
            raise ConfigError(f"cannot serve metrics on {addr}:{port}: {why} "
                              "(choose another --metrics-port)") from None

    def drain(self, conn: redis.Redis) -> int:
        """Move the workers' job records into the histogram; returns how many."""
        try:
            records = conn.lpop(self.key, DRAIN) or []
        except redis.ResponseError:  # not a list (written into Redis): it holds no record
            conn.delete(self.key)
            return 0
        for raw in records:
            got = self._record(raw)
            if got is None:
                continue
            queue, outcome, seconds = got
            self.latency.labels(queue, outcome).observe(seconds)
            self.ended.labels(queue, outcome).inc()
        return len(records)

    def _record(self, raw: bytes) -> tuple[str, str, float] | None:
        """``(queue, outcome, seconds)`` of a worker's record; ``None`` for anything else
        that was pushed on the list (anyone may write to Redis: text that is not JSON, a
        number where a name belongs, a new name past ``MAX_SERIES`` series), skipped."""
        try:
            doc = json.loads(raw)
            queue, outcome, seconds = doc["queue"], doc["outcome"], doc["seconds"]
        except (ValueError, TypeError, KeyError):
            return None
        if not (isinstance(queue, str) and isinstance(outcome, str) and len(queue) <= 200
                and len(outcome) <= 40 and isinstance(seconds, int | float)
                and not isinstance(seconds, bool) and 0 <= seconds < 1e9):
            return None
        if (queue, outcome) not in self._series:
            if len(self._series) >= MAX_SERIES:
                return None
            self._series.add((queue, outcome))
        return queue, outcome, float(seconds)

    def observe_workers(self, conn: redis.Redis, pids: Iterable[int], desired: int) -> None:
        """Workers of this supervisor by state, from rq's registry of workers."""
        mine = set(pids)
        states: dict[str, int] = {"busy": 0, "idle": 0}
        for w in read_workers(conn)[0]:
            if w.pid in mine:
                state = w.get_state()
                state = str(getattr(state, "value", state))
                states[state] = states.get(state, 0) + 1
        states.update(desired=desired, alive=len(mine))
        for state, n in states.items():
            self.workers.labels(self.host, state).set(n)
