"""How big the ledger is: bytes of the control tables and bytes per chunk row.

Read from ``information_schema.TABLES`` (the server's own statistics), so the answer
costs the same with a million chunk rows as with ten; the row count is InnoDB's
estimate, which ``ANALYZE TABLE`` refreshes.
"""

from __future__ import annotations

from shardfarm.mysql.pool import Pool

# The tables whose rows grow with the chunks of every run ('farm runs prune' shrinks them).
PER_RUN_TABLES = ("runs", "chunks", "quarantine", "verify_mismatches")


def size(pool: Pool) -> dict:
    """``{"chunk_rows", "bytes", "bytes_per_chunk", "tables": {table: {"rows", "bytes"}}}``
    of the control database: ``bytes`` counts data and indexes of the per-run tables,
    ``bytes_per_chunk`` divides it by the chunk rows (0 when there are none)."""
    marks = ",".join(["%s"] * len(PER_RUN_TABLES))
    rows = pool.query(
        "SELECT TABLE_NAME, COALESCE(TABLE_ROWS, 0), "
        "COALESCE(DATA_LENGTH, 0) + COALESCE(INDEX_LENGTH, 0) FROM information_schema.TABLES "
        f"WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN ({marks})", PER_RUN_TABLES)
    tables = {name: {"rows": int(n), "bytes": int(b)} for name, n, b in rows}
    chunk_rows = tables.get("chunks", {}).get("rows", 0)
    total = sum(t["bytes"] for t in tables.values())
    return {"chunk_rows": chunk_rows, "bytes": total,
            "bytes_per_chunk": round(total / chunk_rows) if chunk_rows else 0,
            "tables": tables}


def size_line(doc: dict) -> str:
    """``ledger: 1,000,000 chunk rows (estimate), 412.3 MB, 432 bytes per chunk row``."""
    return (f"ledger: {doc['chunk_rows']:,} chunk rows (estimate), "
            f"{doc['bytes'] / 1e6:,.1f} MB, {doc['bytes_per_chunk']:,} bytes per chunk row")
