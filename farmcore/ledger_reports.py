"""What the ledger reports of a run: progress per chunk kind, failed chunks, chunk counts,
the runs at work and which run a command means.

Read-only queries of the ``runs`` and ``chunks`` tables, kept beside ``farmcore.ledger`` (the
tables' only writer), whose ``Ledger`` offers them.
"""

from __future__ import annotations

import json

from shardfarm.errors import ConfigError
from shardfarm.mysql.pool import Pool


class LedgerReports:
    """Reads of ``chunks`` for status, the dashboard, ``farm failed`` and run summaries
    (``run`` and ``latest_run`` are ``Ledger``'s)."""

    pool: Pool

    def progress(self, run_id: str) -> list[dict]:
        """Per chunk kind: chunk counts by state, row totals and timings."""
        cols = ("kind", "total", "done", "failed", "running", "pending", "rows_read",
                "rows_written", "rows_quarantined", "busy_seconds", "first_start",
                "last_finish", "now")
        rows = self.pool.query(
            "SELECT kind, COUNT(*), SUM(state = 'done'), SUM(state = 'failed'), "
            "SUM(state = 'running'), SUM(state = 'pending'), SUM(rows_read), SUM(rows_written), "
            "SUM(rows_quarantined), SUM(seconds), MIN(started_at), MAX(finished_at), NOW(3) "
            "FROM chunks WHERE run_id = %s GROUP BY kind ORDER BY MIN(chunk_id)", (run_id,))
        out = []
        for r in rows:
            d = dict(zip(cols, r, strict=True))
            for k in cols[1:10]:
                d[k] = float(d[k] or 0) if k == "busy_seconds" else int(d[k] or 0)
            out.append(d)
        return out

    def failures(self, run_id: str | None = None, limit: int = 100) -> list[dict]:
        """Failed chunks (newest runs first) with their reasons."""
        where, params = ("AND run_id = %s", [run_id]) if run_id else ("", [])
        cols = ("run_id", "chunk_id", "kind", "attempts", "last_error", "args")
        rows = self.pool.query(f"SELECT {', '.join(cols)} FROM chunks WHERE state = 'failed' "
                               f"{where} ORDER BY run_id DESC, chunk_id LIMIT %s",
                               [*params, limit])
        return [dict(zip(cols, r, strict=True)) for r in rows]


    def chunk_counts(self, run_id: str) -> list[dict]:
        """The ``counts`` JSON of every done chunk of a run."""
        return [json.loads(r[0]) for r in self.pool.query(
            "SELECT counts FROM chunks WHERE run_id = %s AND state = 'done' AND counts IS NOT NULL",
            (run_id,))]

    def run_kinds(self) -> list[str]:
        """The kinds of the runs in the ledger, in name order (for 'farm runs --kind')."""
        return [r[0] for r in self.pool.query("SELECT DISTINCT kind FROM runs ORDER BY kind")]

    def active_runs(self, kind: str, since: object = None, grace: float = 0.0) -> tuple:
        """Runs of ``kind`` with a chunk leased (or expired < ``grace`` s ago; a cancelled chunk
        keeps its lease, its worker writing until its next renewal) or claimed after ``since``
        (default now) less ``grace`` and unfinished then; and the time of asking."""
        now, us = self.pool.query("SELECT NOW(3)")[0][0], int(grace * 1e6)
        sql = "SELECT DISTINCT run_id FROM chunks c JOIN runs r USING(run_id) WHERE r.kind=%s AND "
        out = [r[0] for r in self.pool.query(sql + "c.state IN ('running', 'failed') AND c.lease_"
                                             "expires >= NOW(3) - INTERVAL %s MICROSECOND",
                                             (kind, us))]
        at = since or now
        more = self.pool.query(sql + "c.started_at >= %s - INTERVAL %s MICROSECOND AND (c."
                               "finished_at IS NULL OR c.finished_at >= %s)", (kind, at, us, at))
        return out + [r[0] for r in more if r[0] not in out], now

    def run_or_latest(self, run_id: str | None, kind: str, missing: str) -> str:
        """``run_id`` if given and a run of ``kind`` (else ``FatalError``: no such run, or
        ``ConfigError``: another kind), else the newest run of ``kind``; ``ConfigError(missing)``
        when there is none."""
        if run_id:
            if (of := self.run(run_id)["kind"]) != kind:
                raise ConfigError(f"{run_id} is a{'n' * (of[:1] in 'aeiou')} {of} run, not a "
                                  f"{kind} run")
            return run_id
        run_id = self.latest_run(kind)
        if not run_id:
            raise ConfigError(missing)
        return run_id
