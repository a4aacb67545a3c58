"""Control databases made before every session was UTC: their times moved to UTC, once.

Until 2026-11-27 a session took the server's time zone, so the control tables' times
(``NOW(3)`` and column defaults) are in it; every session is UTC now
(``shardfarm.mysql.connect.open_connection``). On a server whose zone is not UTC those
times would read hours off: the newest run not the latest, live leases expired or dead
ones live for hours. The first ``ensure`` of this version converts every such column from
the server's global zone (what the old sessions used; per value, so daylight saving is
followed) and records it in ``control_clock``, in one transaction: a second process
waits on the record's row lock and then finds it, so nothing is converted twice.
Upgrade with the workers stopped: an old worker writes local times again.
"""

from __future__ import annotations

import pymysql.cursors

# Columns written from the session's clock. Not promote_read_only.since (UTC_TIMESTAMP) nor
# cron_state.last_slot (the scheduler's UTC slot, from Python).
LOCAL_TIMES: dict[str, tuple[str, ...]] = {
    "runs": ("created_at", "finished_at", "cancelled_at"),
    "chunks": ("lease_expires", "not_before", "started_at", "finished_at"),
    "run_pauses": ("paused_at", "resumed_at"),
    "quarantine": ("created_at",),
    "export_parts": ("written_at",),
    "export_claims": ("claimed_at",),
    "export_locks": ("expires",),
    "cron_state": ("updated_at",),
    "runs_archive": ("created_at", "finished_at", "pruned_at"),
    "sync_state": ("expires", "checkpointed_at"),
}
UTC_ZONES = ("+00:00", "UTC")


def convert_once(cur: pymysql.cursors.Cursor) -> bool:
    """Move the control tables' times from the server's zone to UTC unless done before;
    whether it converted (the cursor's connection must be in autocommit mode, its tables,
    ``control_clock`` included, made: ``farmcore.control_schema``)."""
    cur.execute("START TRANSACTION")
    try:
        if not cur.execute("INSERT IGNORE INTO control_clock (id, zone, converted_at) "
                           "VALUES (1, @@GLOBAL.time_zone, NOW(3))"):
            cur.execute("COMMIT")
            return False
        cur.execute("SELECT IF(@@GLOBAL.time_zone = 'SYSTEM', @@system_time_zone, "
                    "@@GLOBAL.time_zone)")
        if cur.fetchone()[0] not in UTC_ZONES:
            for table, cols in LOCAL_TIMES.items():
                sets = ", ".join(f"`{c}` = CONVERT_TZ(`{c}`, @@GLOBAL.time_zone, '+00:00')"
                                 for c in cols)
                cur.execute(f"UPDATE `{table}` SET {sets}")
        cur.execute("COMMIT")
        return True
    except BaseException:
        cur.execute("ROLLBACK")
        raise
