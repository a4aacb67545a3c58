"""The last schedule slot each ``farm cron`` entry fired for, durable in the control database.

This module is the only one that reads or writes the ``cron_state`` table. A slot
only moves forward (compare-and-set on the stored slot), so two schedulers that
both believe they lead record each slot once, and a Redis that lost everything
neither fires a night again nor forgets one.
"""

from __future__ import annotations

import datetime as dt

from shardfarm.mysql.pool import Pool

EPOCH = dt.datetime(1970, 1, 1)  # the stored slot of an entry that never fired


class CronState:
    """The ``cron_state`` table: one row per cron entry name."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool  # the control database's pool

    def last_slot(self, name: str) -> dt.datetime | None:
        """The last slot ``name`` fired for, or ``None`` before the first."""
        rows = self.pool.query("SELECT last_slot FROM cron_state WHERE name = %s", (name,))
        return None if not rows or rows[0][0] <= EPOCH else rows[0][0]

    def advance(self, name: str, slot: dt.datetime, run_id: str) -> bool:
        """Record that ``name`` fired ``slot`` as ``run_id``; ``False`` if that slot (or a
        later one) was recorded already."""
        self.pool.execute("INSERT IGNORE INTO cron_state (name, last_slot) VALUES (%s, %s)",
                          (name, EPOCH))
        return self.pool.execute("UPDATE cron_state SET last_slot = %s, run_id = %s "
                                 "WHERE name = %s AND last_slot < %s",
                                 (slot, run_id, name, slot)) == 1
