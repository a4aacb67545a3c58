"""Supervises N worker processes on this machine and converges to a desired count.

- SIGTERM / SIGINT: every worker finishes the job in hand and exits (warm);
  a second signal passes on, and rq's workers stop at once (cold).
- SIGUSR1 / SIGUSR2: one worker more / one fewer.
- ``farm scale N [--host H]`` writes a desired count to Redis; every supervisor
  (or the one on host H) adopts it within a second or two.
- Scale-down sends SIGTERM to the newest workers: they finish their job first.
- One supervisor at a time also runs the farm's housekeeping (``maintenance``).
- A Redis that does not answer stops nothing (``workers.outage``): the workers keep
  running on the last desired count; a burst gives up after ``BURST_OUTAGE_LIMIT``.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from functools import partial

import redis

from farmcore import keys
from farmcore.identity import farm_id
from jobs.policy import JobPolicy
from jobs.runtime import Runtime
from shardfarm.bounds import wrong_type
from shardfarm.errors import FarmError
from shardfarm.mysql.infile import sweep_temp
from shardfarm.redact import redact, redact_url
from shardfarm.settings import Settings
from workers import burst, maintenance
from workers.metrics import ENV_KEY, SupervisorMetrics
from workers.outage import UNREACHABLE, UNWRITABLE, Outage

log = logging.getLogger(__name__)
TICK = 0.5
MAINTENANCE_EVERY = 3.0
COLD_GRACE = 3.0
OBSERVE_EVERY = 2.0
FAST_FAIL = 10.0  # a worker that exits with an error this soon after starting "fails to start"
MAX_RESPAWN_PAUSE = 30.0
# signals a process raises by its own fault (a crash in an extension, an abort at import):
# like an error exit, soon after start they mean "fails to start"; SIGKILL or SIGTERM come
# from outside (an operator, the OOM killer) and the worker is replaced at once
CRASH_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGILL,
                           signal.SIGFPE, signal.SIGSYS})
REDIS_REPLY_SECONDS = 10.0  # a Redis that stalls (no reply) is an outage, not a hang
BURST_OUTAGE_LIMIT = 300.0  # seconds without Redis after which a burst stops (a daemon waits)
MAX_WORKERS = 1000  # per supervisor: 'farm workers --count', 'farm scale', the dashboard's scale
_refused: dict[str, bytes] = {}  # scale keys whose value was ignored (warned once)


def read_desired(conn: redis.Redis, host: str) -> int | None:
    """The desired worker count for ``host`` (host-specific beats farm-wide), if one is set.

    A value that is not an integer from 0 to ``MAX_WORKERS`` (whatever was written into Redis)
    is ignored, with one warning while it stays: ``None``, the supervisor keeps its count."""
    names = (keys.desired_workers(host), keys.desired_workers(None))
    for name, value in zip(names, conn.mget(*names), strict=True):
        if value is None:
            _refused.pop(name, None)
            continue
        count = parse_desired(value)
        if count is not None:
            _refused.pop(name, None)
        elif _refused.get(name) != value:
            _refused[name] = value
            log.warning("ignoring %s = %r: not a worker count from 0 to %d (the count stays; "
                        "'farm scale N' sets one)", name, value[:40].decode(errors="replace"),
                        MAX_WORKERS)
        return count
    return None


def parse_desired(value: bytes | str) -> int | None:
    """A desired worker count as stored in Redis; ``None`` unless an integer from 0 to
    ``MAX_WORKERS``."""
    try:
        count = int(value)
    except ValueError:
        return None
    return count if 0 <= count <= MAX_WORKERS else None


def write_desired(conn: redis.Redis, count: int | None, host: str | None = None) -> None:
    """Set the desired worker count of ``host`` (``None``: every host); ``count`` ``None``
    removes it, and supervisors keep the count they have."""
    if count is None:
        conn.delete(keys.desired_workers(host))
    else:
        conn.set(keys.desired_workers(host), count)


def _signal_name(number: int) -> str:
    """``SIGKILL`` for 9; ``signal 40`` for a signal Python has no name for (most real-time
    signals)."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


@dataclass
class Supervisor:
    """Keeps ``desired`` worker processes alive on this host."""

    settings: Settings
    desired: int
    queues: list[str]
    burst: bool = False
    policy: JobPolicy = field(default_factory=JobPolicy.from_env)
    host: str = field(default_factory=socket.gethostname)
    children: list[subprocess.Popen] = field(default_factory=list)
    stopping: int = 0
    _seen_remote: int | None = None
    _retiring: set[int] = field(default_factory=set)
    _kill_at: float | None = None
    metrics_port: int | None = None
    metrics_addr: str = "127.0.0.1"
    metrics: SupervisorMetrics | None = None
    _observed: float = 0.0
    # "pid 12: exit code 1", ...: the first MAX_WORKERS (all of a burst's; a supervisor that
    # runs for months restarting crashed workers keeps no more)
    ended_badly: list[str] = field(default_factory=list)
    _started: dict[int, float] = field(default_factory=dict)
    _failing: int = 0  # workers in a row that exited on their own soon after starting
    _spawn_after: float = 0.0
    _farm_id: str | None = None  # of the control database its workers serve (identity)
    # a burst's: where its workers note what did not succeed, and the line that says it
    burst_key: str | None = None
    not_done: str | None = None

    def __post_init__(self) -> None:
        self.rt = Runtime(self.settings, redis_seconds=REDIS_REPLY_SECONDS)
        self.conn = self.rt.redis
        self.redis = Outage(redact_url(self.settings.redis_url))
        self.me = f"{self.host}:{os.getpid()}"
        if self.burst:
            self.burst_key = burst.new_key(self.me)
        if self.metrics_port is not None:
            self.metrics = SupervisorMetrics(self.host, keys.job_timings(self.me))
        self._seen_remote = read_desired(self.conn, self.host)
        if self._seen_remote is not None and not self.burst and self._seen_remote != self.desired:
            log.warning("--count %d is overridden by the 'farm scale' target of %d workers "
                        "for %s ('farm scale --clear' removes it)", self.desired,
                        self._seen_remote, self.host)
            self.desired = self._seen_remote

    # -- signals ------------------------------------------------------------------------
    def install_signals(self) -> None:
        """Route SIGTERM/SIGINT/SIGUSR1/SIGUSR2 to this supervisor."""
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        signal.signal(signal.SIGUSR1, lambda *_: self._adjust(+1))
        signal.signal(signal.SIGUSR2, lambda *_: self._adjust(-1))

    def _adjust(self, delta: int) -> None:
        self.desired = min(MAX_WORKERS, max(0, self.desired + delta))
        log.info("desired workers now %d (signal)", self.desired)

    def _on_stop(self, signum: int, _frame: object) -> None:
        self.stopping += 1
        log.info("stopping (%s); signal %d", "warm" if self.stopping == 1 else "cold", signum)
        # not alive(): a handler may run while the loop is inside it (a child reaped twice);
        # send_signal skips a child that has exited
        for child in list(self.children):
            child.send_signal(signal.SIGTERM)
        if self.stopping > 1:  # cold: rq stops the job at once; anything left is killed
            self._kill_at = time.monotonic() + COLD_GRACE

    def _enforce_cold_stop(self) -> None:
        if self._kill_at is not None and time.monotonic() > self._kill_at:
            for child in self.alive():
                log.warning("worker %d did not stop; killing it", child.pid)
                child.kill()

    def _stop_children(self) -> None:
        """Stop every worker still running when the supervisor exits on an error it cannot
        handle (Redis or the control database refusing it): asked to stop, killed after
        ``COLD_GRACE`` (a chunk one held is taken over when its lease expires)."""
        live = self.alive()
        for child in live:
            log.warning("stopping worker %d: its supervisor exits on an error", child.pid)
            child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + COLD_GRACE
        for child in live:
            try:
                child.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()

    # -- children -----------------------------------------------------------------------
    def alive(self) -> list[subprocess.Popen]:
        """Children that have not exited, reaping those that did (and noting which ended
        badly: ``ended_badly``)."""
        for child in [c for c in self.children if c.poll() is not None]:
            self._reaped(child)
        self.children = [c for c in self.children if c.returncode is None]
        return self.children

    def _reaped(self, child: subprocess.Popen) -> None:
        """Note how ``child`` ended. A worker that fails soon after it started (an error exit:
        a configuration only the worker checks; or a crash signal, ``CRASH_SIGNALS``) is
        restarted after a growing pause, not in a loop; a killed one (SIGKILL: an operator,
        the OOM killer) at once."""
        started = self._started.pop(child.pid, time.monotonic())
        code = child.returncode
        self._retiring.discard(child.pid)
        if code == 0:
            self._failing = 0
            return
        how = f"killed by {_signal_name(-code)}" if code < 0 else f"exit code {code}"
        if len(self.ended_badly) < MAX_WORKERS:  # every one of a burst; bounded for a daemon
            self.ended_badly.append(f"pid {child.pid}: {how}")
        log.warning("worker %d ended (%s)", child.pid, how)
        crashed = code > 0 or -code in CRASH_SIGNALS
        if not (crashed and time.monotonic() - started < FAST_FAIL):
            self._failing = 0  # it had started well (a worker rq ended on an error exits 1)
            return
        self._failing += 1
        pause = min(MAX_RESPAWN_PAUSE, 2.0 ** self._failing)
        self._spawn_after = time.monotonic() + pause
        log.warning("workers fail as they start; the next starts in %g s", pause)

    def spawn(self) -> None:
        """Start one worker process."""
        # -P: not the working directory first, where a folder named like a farm package
        # would be imported in its place; the worker appends it last (add_operator_path)
        cmd = [sys.executable, "-P", "-m", "workers.worker", "--queues", ",".join(self.queues)]
        if self.burst:
            cmd.append("--burst")
        child = subprocess.Popen(cmd, env=self._child_env())
        self._started[child.pid] = time.monotonic()
        self.children.append(child)

    def _child_env(self) -> dict[str, str]:
        env = dict(os.environ)
        s = self.settings
        env.update({"FARM_REDIS_URL": s.redis_url, "FARM_EXPORT_URL": s.export_url,
                    "FARM_JOB_MODULES": self.policy.env_value(),
                    "FARM_CONTROL_DSN": s.control_dsn.url(),
                    "FARM_LEGACY_DSN": s.legacy_dsn.url(),
                    "FARM_SHARDMAP": s.shardmap_spec})
        if self.metrics:
            env[ENV_KEY] = self.metrics.key
        env.pop(burst.ENV_KEY, None)  # never another supervisor's burst
        if self.burst_key:
            env[burst.ENV_KEY] = self.burst_key
        return env

    def converge(self) -> None:
        """Start or stop (warm) workers until ``desired`` are running; none is started while
        Redis does not answer or refuses writes (rq's worker could not register: it would
        exit at once, and be taken for one that fails as it starts)."""
        live = [c for c in self.alive() if c.pid not in self._retiring]
        if time.monotonic() >= self._spawn_after and self.redis.since is None:
            for _ in range(self.desired - len(live)):
                self.spawn()
        for child in live[self.desired:][::-1]:
            child.send_signal(signal.SIGTERM)
            self._retiring.add(child.pid)

    # -- loop ---------------------------------------------------------------------------
    def poll_remote(self) -> None:
        """Adopt a desired count newly written by ``farm scale``."""
        remote = read_desired(self.conn, self.host)
        if remote is not None and remote != self._seen_remote:
            log.info("desired workers now %d (farm scale)", remote)
            self.desired = remote
        self._seen_remote = remote

    def report(self) -> None:
        """Heartbeat this supervisor in Redis for ``farm status``."""
        doc = {"host": self.host, "pid": os.getpid(), "workers": len(self.alive()),
               "desired": self.desired, "queues": self.queues, "at": time.time(),
               "farm_id": self._farm_id}
        try:
            self.conn.hset(keys.supervisors(), self.me, json.dumps(doc))
        except redis.ResponseError as exc:  # not a hash (written into Redis): no heartbeat
            if not wrong_type(exc):  # OOM, READONLY: nothing to replace
                raise
            log.warning("%s held no supervisors' heartbeats; replaced", keys.supervisors())
            self.conn.delete(keys.supervisors())
            self.conn.hset(keys.supervisors(), self.me, json.dumps(doc))
        if self.metrics:
            self.metrics.drain(self.conn)
            if time.monotonic() - self._observed > OBSERVE_EVERY:
                self.metrics.observe_workers(self.conn, [c.pid for c in self.alive()],
                                             self.desired)
                self._observed = time.monotonic()

    def _burst_ended(self) -> int:
        """A burst's exit status once its workers are gone: 1 when one ended badly
        (``ended_badly``: killed, or an error) or something they ran did not succeed
        (``not_done`` says what), else 0."""
        assert self.burst_key is not None
        self.not_done = burst.summary_line(burst.count(self.conn, self.burst_key),
                                           self.burst_key)
        return 1 if self.ended_badly or self.not_done else 0

    def run(self) -> int:
        """Supervise until stopped (or, in burst mode, until every worker is done). Exit
        status 1 when a burst did not do all its work (``_burst_ended``)."""
        self.install_signals()
        if self.metrics:
            self.metrics.serve(self.metrics_port, self.metrics_addr)
        if swept := sweep_temp():
            log.info("deleted %d LOAD DATA temp file(s) left by killed workers", swept)
        last_maint = 0.0
        # a shard map it cannot read or a control database it may not use (a wrong password;
        # for a burst also one not there or not set up) stops it before any worker runs, in
        # one line
        self.rt.router.source.current()
        self._farm_id = farm_id(self.rt.ledger.pool, required=self.burst)
        if self.burst and not self.stopping:  # a Ctrl-C during the checks: none started
            for _ in range(self.desired):
                self.spawn()
        try:
            while True:
                if self.stopping or self.burst:
                    self._enforce_cold_stop()
                    if not self.alive():
                        ended = self.redis.call(self._burst_ended, None, writes=False) \
                            if self.burst else 0
                        if ended is not None:  # a burst's count waits for Redis
                            return ended
                        if self.stopping:  # not for the outage limit: asked to stop now
                            raise FarmError(f"stopped while Redis at {self.redis.where} does "
                                            "not answer: what the burst ran is not known "
                                            "('farm status' once Redis is back)")
                else:  # while Redis does not answer, the last desired count holds
                    self.redis.call(self.poll_remote, None, writes=False)
                    self.converge()
                self.redis.call(self.report, None)
                if self.burst:
                    self._give_up_on_redis()
                if time.monotonic() - last_maint > MAINTENANCE_EVERY:
                    self._farm_id = self._farm_id or farm_id(self.rt.ledger.pool)
                    self.redis.call(partial(maintenance.run_once, self.rt, self.me,
                                            self.queues), False)
                    if swept := sweep_temp():
                        log.info("deleted %d LOAD DATA temp file(s) of ended workers", swept)
                    last_maint = time.monotonic()
                time.sleep(TICK)
        except BaseException:
            if not self.stopping:  # else they were told already: a warm stop finishes chunks
                self._stop_children()  # none is left running unsupervised
            raise
        finally:
            try:
                self._forget()
            except UNREACHABLE + UNWRITABLE as exc:
                log.warning("this supervisor's heartbeat is left in Redis at %s (%s); 'farm "
                            "status' ages it out", self.redis.where, redact(str(exc)))
            self.rt.close()

    def _give_up_on_redis(self) -> None:
        """A burst stops, its workers with it, once Redis has not answered for
        ``BURST_OUTAGE_LIMIT`` seconds: the script that waits on it learns (a daemon rides
        any outage out)."""
        since = self.redis.since
        if since is not None and time.monotonic() - since >= BURST_OUTAGE_LIMIT:
            raise FarmError(f"Redis at {self.redis.where} {self.redis.what} for "
                            f"{BURST_OUTAGE_LIMIT:g} s; the burst stops (a chunk it held is "
                            "taken over once its lease expires; 'farm resume RUN' once Redis "
                            "is back)")

    def _forget(self) -> None:
        """Remove this supervisor's heartbeat, burst count and metrics from Redis."""
        self.conn.hdel(keys.supervisors(), self.me)
        if self.burst_key:
            self.conn.delete(self.burst_key)
        if self.metrics:
            self.conn.delete(self.metrics.key)
