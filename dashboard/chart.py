"""A run's rows/s over time: rows read by chunks as they finish, in equal time buckets, drawn
as a small inline SVG on the server (no script, no library in the browser)."""

from __future__ import annotations

from markupsafe import Markup

from farmcore.ledger import Ledger

BUCKETS = 40
WIDTH, HEIGHT = 320, 64


def series(ledger: Ledger, run_id: str, buckets: int = BUCKETS) -> list[tuple[float, float]]:
    """``(seconds since the run's first start, rows/s)`` per bucket, from its first start to
    its last finish (or now, while it runs). Two aggregates on the run's done chunks."""
    (start, end, now, chunk_s), = ledger.pool.query(
        "SELECT MIN(started_at), MAX(finished_at), NOW(3), AVG(IF(state = 'done', seconds, "
        "NULL)) FROM chunks WHERE run_id = %s AND state IN ('done', 'running')", (run_id,))
    if start is None:
        return []
    span = max(((end if end and end > start else now) - start).total_seconds(), 1.0)
    if end is None or (now - end).total_seconds() < span / buckets:
        span = max((now - start).total_seconds(), 1.0)
    # a bucket spans at least two chunks' time, or rows would show as spikes at finishes
    buckets = max(2, min(buckets, int(span / max(2 * float(chunk_s or 0), 1e-3))))
    width = span / buckets
    got = dict(ledger.pool.query(
        "SELECT LEAST(FLOOR(TIMESTAMPDIFF(MICROSECOND, %s, finished_at) / %s), %s), "
        "SUM(rows_read) FROM chunks WHERE run_id = %s AND state = 'done' GROUP BY 1",
        (start, width * 1e6, buckets - 1, run_id)))
    return [(round((i + 1) * width, 1), round(float(got.get(i) or 0) / width, 1))
            for i in range(buckets)]


def svg(points: list[tuple[float, float]]) -> Markup:
    """The series as an SVG line chart with its peak and time span written beside it."""
    if not points:
        return Markup('<svg class="chart" width="%d" height="%d" role="img" '
                      'aria-label="no rows yet"></svg>') % (WIDTH, HEIGHT)
    peak = max(r for _, r in points)
    scale = peak or 1.0
    span = points[-1][0] or 1.0
    step = WIDTH / max(len(points) - 1, 1)
    coords = " ".join(f"{i * step:.1f},{HEIGHT - 14 - (r / scale) * (HEIGHT - 20):.1f}"
                      for i, (_, r) in enumerate(points))
    return Markup(
        '<svg class="chart" width="%d" height="%d" viewBox="0 0 %d %d" role="img" '
        'aria-label="rows per second over time">'
        '<polyline fill="none" stroke="#2b6cb0" stroke-width="1.5" points="%s"/>'
        '<text x="2" y="10" font-size="9">peak %s rows/s</text>'
        '<text x="%d" y="%d" font-size="9" text-anchor="end">%s</text></svg>'
    ) % (WIDTH, HEIGHT, WIDTH, HEIGHT, coords, f"{peak:,.0f}", WIDTH - 2, HEIGHT - 2,
         duration(span))


def duration(seconds: float | None) -> str:
    """``42s``, ``7m05s``, ``3h05m`` (``–`` when unknown)."""
    if seconds is None:
        return "–"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"
