"""``IN_LIST_MAX`` against the real server: a list that long stays a plain condition on
the table, one value more and MariaDB makes it a join with a derived table of the values."""

from __future__ import annotations

from shardfarm.mysql.inlist import IN_LIST_MAX
from sharding.schema import shard_db
from tests.conftest import SHARDS_A


def _plan(cur, q: str, n: int) -> list[tuple]:
    marks = ",".join(["%s"] * n)
    cur.execute(f"EXPLAIN SELECT id, v FROM {q} WHERE id IN ({marks})",
                [i * 13 for i in range(n)])
    return cur.fetchall()


def test_a_list_of_in_list_max_values_is_not_made_a_join(router):
    q = f"`{shard_db(SHARDS_A[0])}`.in_list_probe"  # a temporary table: this session's only

    def probe(cur) -> tuple[list, list]:
        cur.execute(f"CREATE TEMPORARY TABLE {q} (id BIGINT PRIMARY KEY, v INT)")
        try:
            cur.executemany(f"INSERT INTO {q} VALUES (%s, %s)",
                            [(i * 7, i) for i in range(5000)])
            return _plan(cur, q, IN_LIST_MAX), _plan(cur, q, IN_LIST_MAX + 1)
        finally:
            cur.execute(f"DROP TEMPORARY TABLE {q}")
    within, beyond = router.run(SHARDS_A[0], probe)
    assert [(r[1], r[2]) for r in within] == [("SIMPLE", "in_list_probe")]  # no join
    assert any(r[1] == "DERIVED" for r in beyond), beyond  # the values became a table
