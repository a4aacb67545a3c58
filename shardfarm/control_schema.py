"""Tables of the control database (runs, chunk ledger, quarantine), created idempotently.

The farm issue fills this in; each later job kind adds nothing here but rows.
"""

from __future__ import annotations

from shardfarm.db import connect
from shardfarm.dsn import DSN

STATEMENTS: list[str] = []


def ensure(dsn: DSN) -> None:
    """Create every control table that does not exist yet."""
    if not STATEMENTS:
        return
    conn = connect(dsn)
    try:
        with conn.cursor() as cur:
            for sql in STATEMENTS:
                cur.execute(sql)
    finally:
        conn.close()
