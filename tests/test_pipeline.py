"""Pipelined statements: sent together, judged before the commit, and a refusal rolls back
every statement of the transaction, also those sent after the one it guards."""

from __future__ import annotations

import pytest

from loaders.migration import writer
from loaders.migration.build import TargetRows
from shardfarm.errors import FarmError, FencedError, ShardFrozenError, StaleMapError
from shardfarm.mysql.pipeline import Pipeline
from shardfarm.retry import RetryPolicy
from sharding import fencing
from sharding.mapsource import FixedSource
from sharding.schema import shard_table
from sharding.shardmap import ShardMap
from tests.conftest import SHARDS_A, SHARDS_B

ONCE = RetryPolicy(attempts=1)
GROUP = [SHARDS_A[0] + 1, SHARDS_A[0] + 2]
TABLE = "user_has_boards"


@pytest.fixture
def clean(router):
    """The group's mapping table, shard state and fences emptied before and after."""
    def empty() -> None:
        for s in [*GROUP, SHARDS_B[0] + 1]:
            with router.transaction(router.host_for(s)) as cur:  # unchecked: state may block
                for t in (TABLE, "chunk_fences", "shard_state"):
                    cur.execute(f"DELETE FROM {shard_table(s, t)}")
    empty()
    yield
    empty()


def _count(router, shard: int) -> int:
    return router.query(router.host_for(shard),
                        f"SELECT COUNT(*) FROM {shard_table(shard, TABLE)}", (), shard)[0][0]


def _insert(shard: int, n: int) -> tuple[str, list]:
    return (f"INSERT INTO {shard_table(shard, TABLE)} (from_id, to_id, sequence) VALUES "
            + ",".join(["(%s,%s,%s)"] * n), [v for i in range(n) for v in (shard, i, i)])


def test_results_come_back_in_order_and_checks_see_them_all(router, clean):
    """Every statement runs before any check: a check of the first statement already sees
    what a later one wrote, over as many round trips as the size allows."""
    seen: list = []
    host = router.host_for(GROUP[0])
    with router.transaction(host, multi=True) as cur:
        pipe = Pipeline(cur, max_chars=60)  # a round trip per statement or two
        pipe.add(*_insert(GROUP[0], 2), check=lambda r: seen.append(("insert", r.rowcount)))
        pipe.add(f"SELECT COUNT(*) FROM {shard_table(GROUP[0], TABLE)}",
                 check=lambda r: seen.append(("count", r.rows)))
        pipe.add(*_insert(GROUP[1], 3), check=lambda r: seen.append(
            ("later", _count_in(cur, GROUP[1]))))
        pipe.then(lambda c: seen.append(("then", None)))
        assert seen == []  # nothing sent yet
        pipe.flush()
    assert seen == [("insert", 2), ("count", ((2,),)), ("later", 3), ("then", None)]
    assert (_count(router, GROUP[0]), _count(router, GROUP[1])) == (2, 3)


def _count_in(cur, shard: int) -> int:
    cur.execute(f"SELECT COUNT(*) FROM {shard_table(shard, TABLE)}")
    return cur.fetchone()[0]


def test_a_refusing_check_rolls_back_the_statements_sent_after_it(router, clean):
    def fn(pipe: Pipeline, shard: int) -> None:
        pipe.add(*_insert(shard, 1), check=(lambda r: _refuse()) if shard == GROUP[0] else None)
        pipe.add(f"INSERT INTO {shard_table(shard, TABLE)} VALUES (%s, 99, 1)", [shard])
    with pytest.raises(FencedError):
        router.run_group(GROUP, fn, ONCE, pipelined=True)
    assert [_count(router, s) for s in GROUP] == [0, 0]


def _refuse() -> None:
    raise FencedError("refused by the test")


def test_an_error_midway_runs_nothing_after_it_and_commits_nothing(router, clean):
    def fn(pipe: Pipeline, shard: int) -> None:
        pipe.add(*_insert(shard, 1))
        if shard == GROUP[0]:
            pipe.add("SELECT no_such_column FROM " + shard_table(shard, TABLE))
    with pytest.raises(FarmError):
        router.run_group(GROUP, fn, ONCE, pipelined=True)
    assert [_count(router, s) for s in GROUP] == [0, 0]


def test_a_check_may_add_work_that_runs_in_the_same_transaction(router, clean):
    def fn(pipe: Pipeline, shard: int) -> None:
        pipe.add(*_insert(shard, 1), check=lambda r: pipe.then(lambda cur: cur.execute(
            f"INSERT INTO {shard_table(shard, TABLE)} VALUES (%s, 7, 7)", [shard])))
    router.run_group(GROUP, fn, ONCE, pipelined=True)
    assert [_count(router, s) for s in GROUP] == [2, 2]


def _small_rows(shards: list[int]) -> TargetRows:
    rows = TargetRows()
    for s in shards:
        rows.mappings[(s, TABLE)] = [(s << 46 | 5, 9, 1), (s << 46 | 6, 9, 2)]
    return rows


def test_a_zombie_pipelined_write_is_refused_and_leaves_nothing(router, clean):
    """The chunk was taken over (a higher fence on one shard of the group): the zombie's
    pipelined group writes nothing on any of its shards."""
    heir = fencing.FenceToken("t-pipe", 3, 2)
    router.run(GROUP[1], lambda cur: fencing.check(cur, GROUP[1], heir))
    with pytest.raises(FencedError, match="taken over"):
        writer.write_shards(router, fencing.FenceToken("t-pipe", 3, 1), _small_rows(GROUP),
                            threads=1)
    assert [_count(router, s) for s in GROUP] == [0, 0]
    writer.write_shards(router, heir, _small_rows(GROUP), threads=1)
    assert [_count(router, s) for s in GROUP] == [2, 2]


def test_a_pipelined_group_checks_each_shards_state(router, clean):
    """Frozen for a move, or moved by a newer map: the whole group is refused."""
    v = router.shardmap.version
    router.run(GROUP[1], lambda cur: fencing.set_state(cur, GROUP[1], v, True))
    with pytest.raises(ShardFrozenError):
        router.run_group(GROUP, lambda pipe, s: pipe.add(*_insert(s, 1)), ONCE, pipelined=True)
    _set_state(router, GROUP[1], v + 1)
    m = router.shardmap
    stale = router.pinned()
    stale.source = FixedSource(ShardMap(v, m.hosts, m.shard_ranges, m.open_ranges, m.buckets,
                                        m.mod_ranges))
    with pytest.raises(StaleMapError, match=f"version {v + 1}"):
        stale.run_group(GROUP, lambda pipe, s: pipe.add(*_insert(s, 1)), ONCE, pipelined=True)
    assert [_count(router, s) for s in GROUP] == [0, 0]


def _set_state(router, shard: int, version: int) -> None:
    with router.transaction(router.host_for(shard)) as cur:  # unchecked: the shard is frozen
        fencing.set_state(cur, shard, version, False)


def _spy_groups(router, monkeypatch) -> list[dict]:
    """The keyword arguments of every ``run_group`` call from now on (``pipelined`` or
    ``infile``), the calls still made."""
    calls: list[dict] = []
    real = router.run_group

    def spy(shards, fn, policy=None, **kw):
        calls.append(kw)
        return real(shards, fn, policy, **kw)
    monkeypatch.setattr(router, "run_group", spy)
    return calls


def test_only_groups_of_small_tables_are_pipelined(router, clean, monkeypatch):
    """A group with a table over ``INSERT_ROWS`` rows loads files as before."""
    calls = _spy_groups(router, monkeypatch)
    monkeypatch.setattr(writer, "INSERT_ROWS", 1)
    rows = _small_rows(GROUP)
    rows.mappings[(SHARDS_B[0] + 1, TABLE)] = [(1, 9, 1)]
    writer.write_shards(router, None, rows, threads=1)
    assert sorted(calls, key=str) == sorted([{"infile": True}, {"pipelined": True}], key=str)
    assert [_count(router, s) for s in [*GROUP, SHARDS_B[0] + 1]] == [2, 2, 1]


def test_a_refused_guard_sends_nothing_it_guards(router, clean):
    """Guards go first and are judged before anything else is sent: a statement that would
    fail if it ran is never sent once a guard refused (a zombie's writes never run, so they
    hold no lock of the heir's rows either)."""
    heir = fencing.FenceToken("t-guard", 4, 2)
    router.run(GROUP[1], lambda cur: fencing.check(cur, GROUP[1], heir))

    def fn(pipe: Pipeline, shard: int) -> None:
        fencing.queue_check(pipe, shard, fencing.FenceToken("t-guard", 4, 1))
        pipe.add(*_insert(shard, 1))
        pipe.add("SELECT no_such_column FROM " + shard_table(shard, TABLE))
    with pytest.raises(FencedError, match="taken over"):
        router.run_group(GROUP, fn, ONCE, pipelined=True)
    assert [_count(router, s) for s in GROUP] == [0, 0]


def test_guards_are_judged_first_whatever_the_order_they_were_added_in(router, clean):
    seen: list = []
    host = router.host_for(GROUP[0])
    with router.transaction(host, multi=True) as cur:
        pipe = Pipeline(cur)
        pipe.add(*_insert(GROUP[0], 2), check=lambda r: seen.append(("write", r.rowcount)))
        pipe.add(f"SELECT COUNT(*) FROM {shard_table(GROUP[0], TABLE)}",
                 check=lambda r: seen.append(("guard", r.rows)), guard=True)
        pipe.flush()
    assert seen == [("guard", ((0,),)), ("write", 2)]


def test_a_few_large_documents_are_not_pipelined_but_loaded_from_a_file(router, clean,
                                                                       monkeypatch):
    """Documents of 500,000 characters, a few more than fit in the server's
    ``max_allowed_packet``: one statement of them would be refused, so the group takes a
    file however few rows it has, and every document arrives whole."""
    calls = _spy_groups(router, monkeypatch)
    shard, size = GROUP[0], 500_000
    (packet,), = router.query(router.host_for(shard), "SELECT @@max_allowed_packet", (), shard)
    n = packet // size + 2
    assert n <= writer.INSERT_ROWS
    first = 1 << 34  # slots no other test uses: only these are counted and removed
    rows = TargetRows()
    rows.objects[(shard, "pins")] = [(i, f'{{"legacy_id": {i}, "details": "{"q" * size}"}}', i)
                                     for i in range(first, first + n)]
    q, mine = shard_table(shard, "pins"), f"local_id BETWEEN {first} AND {first + n}"
    try:
        writer.write_shards(router, None, rows, threads=1)
        stored = router.query(router.host_for(shard), "SELECT COUNT(*), SUM(CHAR_LENGTH("
                              f"JSON_VALUE(data, '$.details'))) FROM {q} WHERE {mine}", (),
                              shard)
    finally:
        router.run(shard, lambda cur: cur.execute(f"DELETE FROM {q} WHERE {mine}"))
    assert calls == [{"infile": True}]
    assert [tuple(map(int, r)) for r in stored] == [(n, n * size)]
