"""The chunk ledger in the control database: runs, chunk states, leases and fencing.

A chunk is ``pending`` → ``running`` (leased to one owner, with an expiry and a
fencing token) → ``done`` or ``failed``. A claim bumps the fence; every later
step of that owner (renew, finish, fail) only succeeds while the fence is
still its own, so a zombie whose lease expired and was taken over can neither
extend it nor mark the chunk done. Times come from the database's clock only.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import pymysql.cursors

from farmcore.cronstate import CronState
from farmcore.ledger_reports import LedgerReports
from farmcore.mismatches import Mismatches
from farmcore.quarantine import Quarantine
from farmcore.runstate import RUNNING, ended_status
from farmcore.syncstate import SyncState
from shardfarm.bounds import BULK, Bound
from shardfarm.errors import FatalError, FencedError
from shardfarm.mysql.dsn import DSN, Host
from shardfarm.mysql.pool import Pool
from shardfarm.retry import NO_RETRY
from sharding.fencing import FenceToken

# A run's status while 'farm runs prune' deletes its rows (farmcore.prune): nothing
# recomputes it, and 'farm retry-failed' gives no chunk of it back.
PRUNING = "pruning"
CANCELLED = "cancelled by the operator (farm cancel)"  # the last_error of its chunks
RUN_COLUMNS = ("run_id", "kind", "status", "queue", "params", "paused", "total_chunks",
               "created_at", "finished_at", "cancelled_at")


@dataclass(frozen=True)
class ChunkSpec:
    """A chunk to create: its kind (e.g. ``pins``), JSON-safe arguments and, when planning
    counted them, the rows it is expected to read (for progress by rows)."""

    kind: str
    args: dict
    rows: int | None = None


@dataclass(frozen=True)
class Lease:
    """A claimed chunk: what to do, and the token that proves the claim is current."""

    run_id: str
    chunk_id: int
    kind: str
    args: dict
    owner: str
    fence: int
    attempts: int

    @property
    def token(self) -> FenceToken:
        """The fencing token shard writes of this lease carry."""
        return FenceToken(self.run_id, self.chunk_id, self.fence)


@dataclass
class Outcome:
    """What a chunk did: rows read, written, quarantined, plus any per-table counts."""

    rows_read: int = 0
    rows_written: int = 0
    rows_quarantined: int = 0
    counts: dict = field(default_factory=dict)


@dataclass(frozen=True)
class ClaimRefused:
    """Why a chunk could not be claimed: ``done``, ``failed``, ``leased``, ``paused``,
    ``not_before`` (backing off) or ``missing``."""

    reason: str


def new_run_id(kind: str) -> str:
    """A sortable, unique run ID such as ``migrate-20261122T0542-3f9a``."""
    return f"{kind}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{secrets.token_hex(2)}"


# a run has a chunk pending or running (an SQL condition on ``runs``, its run ID bound)
_BUSY = ("EXISTS (SELECT 1 FROM chunks WHERE chunks.run_id = %s "
         "AND chunks.state IN ('pending', 'running'))")


class Ledger(LedgerReports):
    """Runs and chunks in the control database (the only writer of ``runs`` and ``chunks``).

    It opens the control database's pool (``pool``), which the other control stores
    share: ``quarantine`` (bad legacy rows), ``mismatches`` (what verify found) and
    ``cron_state`` (the scheduler's last slots) are those stores, each the only writer of
    its table. ``bound``: how long a statement may wait (``shardfarm.bounds``; a status
    reader's ledger is bounded, a worker's is not).
    """

    def __init__(self, dsn: DSN, pool_size: int = 4, bound: Bound = BULK) -> None:
        host = Host.from_dsn("control", dsn)
        self.pool = Pool(host, size=pool_size, database=dsn.database, bound=bound)
        self.quarantine = Quarantine(self.pool)
        self.mismatches = Mismatches(self.pool)
        self.cron_state = CronState(self.pool)
        self.sync_state = SyncState(self.pool)

    def close(self) -> None:
        """Close pooled connections."""
        self.pool.close()

    # -- runs ---------------------------------------------------------------------------
    def create_run(self, kind: str, queue: str, params: dict, chunks: Iterable[ChunkSpec],
                   run_id: str | None = None, batch: int = 2000) -> str:
        """Create a run and all its chunks (``pending``) in one transaction."""
        run_id = run_id or new_run_id(kind)

        def write(cur: pymysql.cursors.Cursor) -> None:
            cur.execute("INSERT INTO runs (run_id, kind, queue, params) VALUES (%s,%s,%s,%s)",
                        (run_id, kind, queue, json.dumps(params)))
            total = self._insert_chunks(cur, run_id, chunks, batch)
            cur.execute("UPDATE runs SET total_chunks = %s WHERE run_id = %s", (total, run_id))
        # not retried: ``chunks`` may be a one-pass iterator, and a lost commit reply would
        # turn a retry into "run exists" (error 1062, which cron reads as "created already")
        self.pool.run(write, transaction=True, policy=NO_RETRY)
        return run_id

    @staticmethod
    def _insert_chunks(cur: pymysql.cursors.Cursor, run_id: str, chunks: Iterable[ChunkSpec],
                       batch: int) -> int:
        sql = ("INSERT INTO chunks (run_id, chunk_id, kind, args, rows_planned) "
               "VALUES (%s,%s,%s,%s,%s)")
        rows, n = [], 0
        for spec in chunks:
            rows.append((run_id, n, spec.kind, json.dumps(spec.args), spec.rows))
            n += 1
            if len(rows) >= batch:
                cur.executemany(sql, rows)
                rows = []
        if rows:
            cur.executemany(sql, rows)
        return n

    def run(self, run_id: str) -> dict:
        """One run's row as a dict; ``FatalError`` if there is no such run."""
        rows = self.pool.query(f"SELECT {', '.join(RUN_COLUMNS)} FROM runs WHERE run_id = %s",
                               (run_id,))
        if not rows:
            raise FatalError(f"no run {run_id!r} (see 'farm status' for the runs there are)")
        out = dict(zip(RUN_COLUMNS, rows[0], strict=True))
        out["params"] = json.loads(out["params"])
        out["paused"] = bool(out["paused"])
        return out

    def runs(self, limit: int = 20, active_only: bool = False,
             unfinished: bool = False, kind: str | None = None) -> list[str]:
        """Newest run IDs first (of ``kind``, if given): all, active ones (running or paused),
        or those with a chunk not done (failed runs included, cancelled ones not)."""
        conds = (["status IN ('running', 'paused')"] if active_only else
                 ["status <> 'done' AND cancelled_at IS NULL"] if unfinished else [])
        params: list = [kind] if kind else []
        conds += ["kind = %s"] if kind else []
        where = f"WHERE {' AND '.join(conds)}" if conds else ""
        return [r[0] for r in self.pool.query(
            f"SELECT run_id FROM runs {where} ORDER BY created_at DESC LIMIT %s",
            (*params, limit))]

    def list_runs(self, kind: str | None = None, limit: int = 50) -> list[dict]:
        """The newest ``limit`` runs (of ``kind``), each with its chunks done and failed and
        the rows it wrote: a run that ended keeps them in its row (``refresh_status``), the
        chunks are summed for the others only."""
        where, params = ("WHERE kind = %s", [kind]) if kind else ("", [])
        cols = ("run_id", "kind", "status", "paused", "total_chunks", "created_at",
                "finished_at", "chunks_done", "chunks_failed", "rows_written")
        runs = [dict(zip(cols, r, strict=True)) for r in self.pool.query(
            f"SELECT {', '.join(cols)} FROM runs {where} ORDER BY created_at DESC LIMIT %s",
            [*params, limit])]
        live = [r["run_id"] for r in runs if r["chunks_done"] is None]
        sums = {r[0]: r[1:] for r in self.pool.query(
            "SELECT run_id, SUM(state = 'done'), SUM(state = 'failed'), SUM(rows_written) "
            f"FROM chunks WHERE run_id IN ({','.join(['%s'] * len(live))}) GROUP BY run_id",
            live)} if live else {}
        for r in runs:
            d, f, w = sums.get(r["run_id"], (r["chunks_done"], r["chunks_failed"],
                                             r["rows_written"]))
            r.update(paused=bool(r["paused"]), chunks_done=int(d or 0),
                     chunks_failed=int(f or 0), rows_written=int(w or 0))
        return runs

    def set_paused(self, run_id: str, paused: bool) -> None:
        """Pause or unpause a run: workers take no new chunks of a paused run. The change and
        its time are one transaction (``run_pauses``), so rates can leave paused time out."""
        self.run(run_id)

        def write(cur: pymysql.cursors.Cursor) -> None:
            if not cur.execute("UPDATE runs SET paused = %s WHERE run_id = %s AND paused <> %s",
                               (int(paused), run_id, int(paused))):
                return  # already so (or a retry of a commit whose reply was lost)
            if paused:
                cur.execute("INSERT INTO run_pauses (run_id, paused_at) VALUES (%s, NOW(3))",
                            (run_id,))
            else:
                cur.execute("UPDATE run_pauses SET resumed_at = NOW(3) WHERE run_id = %s "
                            "AND resumed_at IS NULL", (run_id,))
        self.pool.run(write, transaction=True)

    def refresh_status(self, run_id: str) -> str:
        """Recompute a run's status from its chunks and ``cancelled_at``: ``running``, else
        as ``farmcore.runstate.ended_status`` names it (``done``, ``failed``, ``cancelled``).

        Called after every chunk, so its cost must not grow with the run: while a chunk is
        pending or running it is two index look-ups (and no write unless the run had ended);
        the chunks are summed once, when none is left, into the run's summary columns (not
        when ``cancelled_at`` changed meanwhile: ``cancel`` and a retry refresh it again, nor
        once a chunk is pending again: a retry came between the sums and the write). Each
        write is guarded by what it read (a chunk pending or running, or none), so a refresh
        that read before another's write never undoes it.
        """
        if self._busy(run_id):
            self.pool.execute("UPDATE runs SET status = 'running', finished_at = NULL, "
                              "chunks_done = NULL, chunks_failed = NULL, rows_written = NULL "
                              f"WHERE run_id = %s AND status <> 'running' AND {_BUSY}",
                              (run_id, run_id))
            return RUNNING
        (failed, done, written, cancelled), = self.pool.query(
            "SELECT COALESCE(SUM(state = 'failed'), 0), COALESCE(SUM(state = 'done'), 0), "
            "COALESCE(SUM(rows_written), 0), (SELECT cancelled_at IS NOT NULL FROM runs WHERE "
            "run_id = %s) FROM chunks WHERE run_id = %s", (run_id, run_id))
        status = ended_status(int(failed), bool(cancelled))
        ended = self.pool.execute(
            "UPDATE runs SET status = %s, finished_at = COALESCE(finished_at, NOW(3)), "
            "chunks_done = %s, chunks_failed = %s, rows_written = %s "
            f"WHERE run_id = %s AND status <> '{PRUNING}' "  # rows going
            f"AND (cancelled_at IS NOT NULL) = %s AND NOT {_BUSY}",
            (status, done, failed, written, run_id, bool(cancelled), run_id))
        return RUNNING if not ended and self._busy(run_id) else status

    def _busy(self, run_id: str) -> bool:
        """Whether a chunk of the run is pending or running (two index look-ups)."""
        (busy,), = self.pool.query(f"SELECT {_BUSY}", (run_id,))
        return bool(busy)

    # -- chunks -------------------------------------------------------------------------
    def claim(self, run_id: str, chunk_id: int, owner: str,
              lease_seconds: float = 60) -> Lease | ClaimRefused:
        """Lease a pending (or expired) chunk to ``owner``, bumping its fence."""
        self.pool.execute(
            "UPDATE chunks c JOIN runs r ON r.run_id = c.run_id "
            "SET c.state = 'running', c.attempts = c.attempts + 1, c.fence = c.fence + 1, "
            "c.lease_owner = %s, c.lease_expires = NOW(3) + INTERVAL %s MICROSECOND, "
            "c.started_at = NOW(3) "
            "WHERE c.run_id = %s AND c.chunk_id = %s AND r.paused = 0 "
            "AND (c.not_before IS NULL OR c.not_before <= NOW(3)) "
            "AND (c.state = 'pending' OR (c.state = 'running' AND c.lease_expires < NOW(3)))",
            (owner, int(lease_seconds * 1e6), run_id, chunk_id))
        rows = self.pool.query(
            "SELECT c.kind, c.args, c.fence, c.attempts, c.state, c.lease_owner, r.paused, "
            "c.not_before > NOW(3) FROM chunks c JOIN runs r ON r.run_id = c.run_id "
            "WHERE c.run_id = %s AND c.chunk_id = %s", (run_id, chunk_id))
        if not rows:
            return ClaimRefused("missing")
        kind, args, fence, attempts, state, lease_owner, paused, backing_off = rows[0]
        if lease_owner == owner and state == "running":  # n == 0: a retry after a lost reply
            return Lease(run_id, chunk_id, kind, json.loads(args), owner, fence, attempts)
        if state in ("done", "failed"):
            return ClaimRefused(state)
        if paused:
            return ClaimRefused("paused")
        return ClaimRefused("not_before" if backing_off else "leased")

    def _fenced(self, lease: Lease, sql: str, params: tuple,
                then: tuple[str, ...] = ("running",)) -> None:
        """A state change that only the current lease may make.

        If the statement matched nothing but the chunk already shows this fence in the
        target state, an earlier attempt committed and only its reply was lost.
        """
        n = self.pool.execute(sql + " WHERE run_id = %s AND chunk_id = %s AND fence = %s "
                              "AND state = 'running'", (*params, lease.run_id, lease.chunk_id,
                                                 lease.fence))
        if n == 1:
            return
        row = self.pool.query("SELECT fence, state FROM chunks WHERE run_id = %s AND chunk_id = %s",
                              (lease.run_id, lease.chunk_id))
        if not (row and row[0][0] == lease.fence and row[0][1] in then):
            raise FencedError(f"chunk {lease.chunk_id} of run {lease.run_id}: lease "
                              f"{lease.fence} of {lease.owner} is no longer current")

    def renew(self, lease: Lease, lease_seconds: float = 60) -> None:
        """Extend a lease; ``FencedError`` if it was taken over."""
        self._fenced(lease, "UPDATE chunks SET lease_expires = NOW(3) + INTERVAL %s MICROSECOND",
                     (int(lease_seconds * 1e6),))

    def finish(self, lease: Lease, outcome: Outcome) -> None:
        """Mark the chunk done with its counts; ``FencedError`` if it was taken over."""
        self._fenced(lease, "UPDATE chunks SET state = 'done', finished_at = NOW(3), "
                     "seconds = TIMESTAMPDIFF(MICROSECOND, started_at, NOW(3)) / 1e6, "
                     "rows_read = %s, rows_written = %s, rows_quarantined = %s, counts = %s, "
                     "lease_owner = NULL, lease_expires = NULL, last_error = NULL",
                     (outcome.rows_read, outcome.rows_written, outcome.rows_quarantined,
                      json.dumps(outcome.counts)), then=("done",))

    def fail(self, lease: Lease, error: str, retry_in: float | None) -> str:
        """Record a failure: back to ``pending`` after ``retry_in`` seconds, or ``failed``."""
        state = "pending" if retry_in is not None else "failed"
        self._fenced(lease, "UPDATE chunks SET state = %s, last_error = %s, lease_owner = NULL, "
                     "lease_expires = NULL, not_before = NOW(3) + INTERVAL %s MICROSECOND",
                     (state, error[:1000], int((retry_in or 0) * 1e6)), then=(state,))
        return state

    def release(self, lease: Lease) -> None:
        """Give a chunk back untouched (e.g. on warm shutdown before any work)."""
        self._fenced(lease, "UPDATE chunks SET state = 'pending', attempts = attempts - 1, "
                     "lease_owner = NULL, lease_expires = NULL", (), then=("pending",))

    def unfinished(self, run_id: str, include_failed: bool = False, limit: int = 2**62) -> list:
        """Chunk IDs not done (pending, running; failed too if asked), at most ``limit``."""
        states = ("pending", "running", "failed") if include_failed else ("pending", "running")
        marks = ",".join(["%s"] * len(states))
        return [r[0] for r in self.pool.query(
            f"SELECT chunk_id FROM chunks WHERE run_id = %s AND state IN ({marks}) "
            "ORDER BY chunk_id LIMIT %s", (run_id, *states, limit))]

    def expire_leases(self) -> int:
        """Give every chunk whose lease expired (its worker died) back as ``pending``, noting
        why, paused runs included; returns how many. The zombie, if any, is fenced out."""
        return self.pool.execute("UPDATE chunks SET state = 'pending', lease_owner = NULL, "
                                 "lease_expires = NULL, last_error = 'lease expired: its worker "
                                 "was lost' WHERE state = 'running' AND lease_expires < NOW(3)")

    def dispatchable(self, limit: int = 10_000) -> dict[str, list[int]]:
        """Pending chunks of every running, unpaused run: ``run_id -> chunk IDs``."""
        out: dict[str, list[int]] = {}
        for run_id, chunk_id in self.pool.query(
                "SELECT c.run_id, c.chunk_id FROM chunks c JOIN runs r ON r.run_id = c.run_id "
                "WHERE r.status = 'running' AND r.paused = 0 AND c.state = 'pending' "
                "ORDER BY c.run_id, c.chunk_id LIMIT %s", (limit,)):
            out.setdefault(run_id, []).append(chunk_id)
        return out

    def cancel(self, run_id: str) -> int:
        """End a run: its pending and running chunks fail as cancelled (a worker holding one
        is fenced out at its next renewal or check, and until then its lease still counts in
        ``active_runs``); returns how many. ``farm retry-failed --run`` takes them up again."""
        self.run(run_id)

        def write(cur: pymysql.cursors.Cursor) -> int:
            n = cur.execute("UPDATE chunks SET state = 'failed', last_error = %s WHERE run_id = "
                            "%s AND state IN ('pending', 'running')", (CANCELLED, run_id))
            if n:  # a run with nothing left to cancel stays as it ended
                cur.execute("UPDATE runs SET cancelled_at = COALESCE(cancelled_at, NOW(3)) "
                            "WHERE run_id = %s", (run_id,))
            return n
        n = self.pool.run(write, transaction=True)
        self.refresh_status(run_id)
        return n

    def reset_failed(self, run_id: str, cancelled: bool = True) -> int:
        """Failed chunks back to pending with a fresh attempt budget (a cancelled run's only if
        ``cancelled``, then no longer cancelled); returns how many (none of a run being
        pruned: ``farmcore.prune``)."""
        n = self.pool.execute("UPDATE chunks c JOIN runs r ON r.run_id = c.run_id SET c.state = "
                              "'pending', c.attempts = 0, c.not_before = NULL, c.lease_expires = "
                              "NULL WHERE c.run_id = %s AND c.state = 'failed' AND r.status <> "
                              f"'{PRUNING}'" + ("" if cancelled else " AND r.cancelled_at IS NULL"),
                              (run_id,))
        if n:
            self.pool.execute("UPDATE runs SET status = 'running', finished_at = NULL, "
                              "chunks_done = NULL, chunks_failed = NULL, rows_written = NULL, "
                              "cancelled_at = NULL WHERE run_id = %s", (run_id,))
        return n

    def chunk(self, run_id: str, chunk_id: int) -> dict:
        """One chunk's row as a dict (for tests and ``farm failed``)."""
        cols = ("state", "attempts", "fence", "lease_owner", "rows_read", "rows_written",
                "rows_quarantined", "last_error", "kind", "args")
        rows = self.pool.query(f"SELECT {', '.join(cols)} FROM chunks WHERE run_id = %s "
                               "AND chunk_id = %s", (run_id, chunk_id))
        if not rows:
            raise FatalError(f"no chunk {chunk_id} in run {run_id!r}")
        return dict(zip(cols, rows[0], strict=True))

    # -- stores of their own, reached through the ledger by chunk handlers and the CLI -------
    def latest_run(self, kind: str) -> str | None:
        """The newest run of ``kind``, if any."""
        return next((r[0] for r in self.pool.query(
            "SELECT run_id FROM runs WHERE kind = %s ORDER BY created_at DESC, run_id DESC "
            "LIMIT 1", (kind,))), None)
