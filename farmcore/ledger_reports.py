"""What the ledger reports of a run: progress per chunk kind, failed chunks, chunk counts.

Read-only queries of the ``chunks`` table, kept beside ``farmcore.ledger`` (the table's
only writer), whose ``Ledger`` offers them.
"""

from __future__ import annotations

import json

from shardfarm.mysql.pool import Pool


class LedgerReports:
    """Reads of ``chunks`` for status, the dashboard, ``farm failed`` and run summaries."""

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
