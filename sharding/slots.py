"""Allocated local IDs: the upper half of the local ID space, handed out by AUTO_INCREMENT.

Every object table's counter starts at ``ids.FIRST_ALLOCATED`` (2**35): the tables are
created so, ``farm shards init`` raises an existing table whose counter is below, and an
insert that nevertheless got a lower ID (a table truncated or restored by hand) is rolled
back, the counter raised and the insert tried again (so is one that met a row written
meanwhile with its own local ID). So an allocated slot never lies where a legacy ID (always
below 2**35 when it is its own local ID) could want it.
"""

from __future__ import annotations

from collections.abc import Callable

from pymysql.constants import ER

from shardfarm.errors import FarmError, FatalError, PermanentDatabaseError
from sharding.ids import FIRST_ALLOCATED
from sharding.router import Router
from sharding.schema import OBJECT_TABLES, shard_db, shard_table


class _BelowAllocated(FarmError):
    """Internal: an insert got a local ID below ``FIRST_ALLOCATED`` (rolled back)."""


def raise_counter_sql(q: str) -> str:
    """The statement that lifts a table's AUTO_INCREMENT to ``FIRST_ALLOCATED``.

    (An InnoDB counter is never set below the largest stored ID, whatever is asked.)
    """
    return f"ALTER TABLE {q} AUTO_INCREMENT = {FIRST_ALLOCATED}"


def raise_counters(cur, shard: int) -> list[str]:
    """Lift every object table of ``shard`` whose counter is below ``FIRST_ALLOCATED``;
    returns the tables raised."""
    names = list(OBJECT_TABLES)
    cur.execute("SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s "
                f"AND TABLE_NAME IN ({','.join(['%s'] * len(names))}) "
                "AND AUTO_INCREMENT < %s", (shard_db(shard), *names, FIRST_ALLOCATED))
    low = sorted(str(r[0]) for r in cur.fetchall() if r[0] in OBJECT_TABLES)
    for name in low:
        cur.execute(raise_counter_sql(shard_table(shard, name)))
    return low


ATTEMPTS = 3


def insert_allocated(router: Router, shard: int, table: str,
                     insert: Callable[..., list[int]]) -> list[int]:
    """Run ``insert(cursor)`` (it inserts rows by AUTO_INCREMENT and returns their local
    IDs) in one transaction on ``shard``; if any ID is below ``FIRST_ALLOCATED`` the
    transaction is rolled back, the counter raised and ``insert`` run once more.

    A duplicate key there is a race lost, not bad data: InnoDB takes a statement's values
    before it writes the rows, and a row written meanwhile with its own local ID (a small
    legacy ID, while a truncated table's counter is still below 2**35) can take one of
    them. It is handled the same way: the counter raised (past every stored ID), the insert
    run again."""
    def guarded(cur) -> list[int]:
        got = insert(cur)
        if got and min(got) < FIRST_ALLOCATED:
            raise _BelowAllocated(f"{table} on shard {shard}: AUTO_INCREMENT below 2**35")
        return got
    lift = raise_counter_sql(shard_table(shard, table))
    for _ in range(ATTEMPTS):
        try:
            return router.run(shard, guarded)
        except _BelowAllocated:
            pass
        except PermanentDatabaseError as exc:
            if exc.code != ER.DUP_ENTRY:
                raise
        router.run(shard, lambda cur: cur.execute(lift))
    raise FatalError(f"shard {shard}: AUTO_INCREMENT of {table} stays below 2**35 or on "
                     f"stored rows after raising it {ATTEMPTS} times")
