"""Masters a ``farm shards promote`` made read-only and has not finished with, durable in the
control database.

This module is the only one that reads or writes the ``promote_read_only`` table. The
promote records a master here before it sends ``SET GLOBAL read_only = 1`` to it, and
clears the row once it is done with it: the promote finished (the map names the slave),
or it was refused and gave the master its writes back. A row that stays says that a
promote stopped (killed, refused while the master was already read-only) with the master
possibly read-only; ``farm shards status`` lists it with the command that finishes the
promote and the statement that undoes the read-only.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from shardfarm.errors import FarmError
from shardfarm.mysql.connect import NOT_SET_UP
from shardfarm.mysql.pool import Pool


@dataclass(frozen=True)
class LeftReadOnly:
    """A master an unfinished promote may have left read-only."""

    master: str
    promoting: str  # the slave that promote was making master
    accept_loss: bool
    since: dt.datetime

    @property
    def finish(self) -> str:
        """The command that finishes that promote."""
        return f"farm shards promote {self.promoting}{' --accept-loss' if self.accept_loss else ''}"

    @property
    def undo(self) -> str:
        """What gives the master its writes back instead."""
        return f"SET GLOBAL read_only = 0 on {self.master}"

    def as_dict(self) -> dict:
        """JSON-safe form (``farm shards status --json``)."""
        return {"master": self.master, "promoting": self.promoting,
                "since": self.since.isoformat(timespec="seconds") + "Z",
                "finish": self.finish, "undo": self.undo}

    def line(self) -> str:
        """One line of ``farm shards status``."""
        return (f"{self.master} may be left read-only by an unfinished '{self.finish}' "
                f"(since {self.since:%Y-%m-%d %H:%M:%S} UTC): run '{self.finish}' to finish "
                f"it, or {self.undo} to undo it")


class ReadOnlyMasters:
    """The ``promote_read_only`` table: one row per master a promote is making read-only."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool  # the control database's pool

    def left_read_only(self, master: str, promoting: str, accept_loss: bool) -> None:
        """Record, before it is sent, that a promote of ``promoting`` makes ``master``
        read-only (a row already there keeps its time: the first promote that did)."""
        self.pool.execute(
            "INSERT INTO promote_read_only (master, promoting, accept_loss, since) "
            "VALUES (%s, %s, %s, UTC_TIMESTAMP(3)) ON DUPLICATE KEY UPDATE "
            "promoting = VALUES(promoting), "
            "accept_loss = VALUES(accept_loss)", (master, promoting, int(accept_loss)))

    def settled(self, *, master: str | None = None, promoting: str | None = None) -> None:
        """Forget the row of ``master`` (writable again, or the promote finished), or those
        of every master a promote of ``promoting`` recorded (it finished). A control database
        not set up holds none to forget."""
        try:
            if master is not None:
                self.pool.execute("DELETE FROM promote_read_only WHERE master = %s", (master,))
            if promoting is not None:
                self.pool.execute("DELETE FROM promote_read_only WHERE promoting = %s",
                                  (promoting,))
        except FarmError as exc:
            if getattr(exc, "code", None) not in NOT_SET_UP:
                raise

    def listed(self) -> list[LeftReadOnly]:
        """Every master an unfinished promote may have left read-only, oldest first (none
        while the control database is not set up: no promote could record one)."""
        try:
            rows = self.pool.query("SELECT master, promoting, accept_loss, since FROM "
                                   "promote_read_only ORDER BY since, master")
        except FarmError as exc:
            if getattr(exc, "code", None) in NOT_SET_UP:
                return []
            raise
        return [LeftReadOnly(m, p, bool(a), s) for m, p, a, s in rows]
