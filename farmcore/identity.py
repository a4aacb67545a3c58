"""Which farm a process serves: a random ID made once per control database (table
``farm_identity``, by ``control_schema.ensure``), so that a command can tell workers of
another control database from its own, whatever address each reaches the server by."""

from __future__ import annotations

from shardfarm.errors import FarmError, RetryableError
from shardfarm.mysql.connect import NOT_SET_UP
from shardfarm.mysql.pool import Pool
from shardfarm.retry import NO_RETRY


def farm_id(pool: Pool, required: bool = False) -> str | None:
    """The control database's farm ID; ``None`` while it is not set up (or unreachable: a
    worker that cannot reach it yet says nothing false). ``required``: a database that does
    not exist or is not set up is the error (one line naming the database and what to run),
    as for a burst, which a script waits on."""
    try:
        rows = pool.run(lambda cur: (cur.execute(
            "SELECT farm_id FROM farm_identity WHERE one = 1"), cur.fetchall())[1],
            policy=NO_RETRY)
    except FarmError as exc:
        not_set_up = getattr(exc, "code", None) in NOT_SET_UP
        if (not_set_up and not required) or isinstance(exc, RetryableError):
            return None
        raise
    return str(rows[0][0]) if rows else None
