"""Reading the legacy database: chunk plans by row count, and chunk rows paged by key."""

from __future__ import annotations

import pymysql
import pytest

from demo.legacygen.generate import generate
from loaders.migration import legacy
from loaders.migration.spec import SPEC
from shardfarm.mysql.db import connect, drop_database
from shardfarm.mysql.dsn import DSN
from tests.conftest import ns_db

DSN_TEST = DSN.parse(f"mysql://root@127.0.0.1:3306/{ns_db('legacy_read_test')}")


@pytest.fixture(scope="module")
def reader():
    generate(DSN_TEST, 150, 3)
    r = legacy.LegacyReader(DSN_TEST)
    yield r
    r.close()
    drop_database(DSN_TEST)


def _plain(table: str, lo: int, hi: int) -> list[tuple]:
    """The chunk by a plain SELECT (not the reader's code), in key order."""
    spec = SPEC[table]
    conn = connect(DSN_TEST)
    try:
        with conn.cursor(pymysql.cursors.Cursor) as cur:
            cols = ", ".join(f"`{c}`" for c in spec.columns)
            cur.execute(f"SELECT {cols} FROM `{table}` WHERE `{spec.key[0]}` BETWEEN %s AND %s "
                        f"ORDER BY {', '.join(spec.key)}", (lo, hi))
            return [tuple(None if v is None else str(v) if not isinstance(v, int) else v
                          for v in row) for row in cur.fetchall()]
    finally:
        conn.close()


@pytest.mark.slow
@pytest.mark.parametrize("table", ["users", "pins", "follows", "likes"])
def test_chunk_pages_by_key_and_returns_every_row_once(reader, monkeypatch, table):
    """Pages of 7 rows cut through runs of equal first-key values (follows, likes)."""
    monkeypatch.setattr(legacy, "AGG_ROWS", 7)
    spec = SPEC[table]
    ranges = list(reader.plan(spec, 60))
    assert len(ranges) > 1
    total = 0
    for lo, hi, n in ranges:
        got = [tuple(r[c] for c in spec.columns) for r in reader.chunk(spec, lo, hi)]
        want = _plain(table, lo, hi)
        assert len(got) == len(want) == n and len(got) > 7
        assert [g[:len(spec.key)] for g in got] == [w[:len(spec.key)] for w in want]
        assert [tuple(str(v) if isinstance(v, str) else v for v in g) for g in got] == want
        total += len(got)
    assert total == reader.count(spec)


def test_plan_cuts_by_row_count_on_first_key_changes():
    groups = [(1, 3), (5, 3), (9, 1), (1000, 4), (1001, 1)]
    assert list(legacy.cut_ranges(groups, 6)) == [(1, 5, 6), (9, 1001, 6)]
    assert list(legacy.cut_ranges(groups, 5)) == [(1, 1, 3), (5, 9, 4), (1000, 1001, 5)]
    assert list(legacy.cut_ranges([], 6)) == []


def test_id_batches_never_mix_ids_below_and_above_two_to_the_63(monkeypatch):
    """One ID >= 2**63 in an IN list of smaller ones makes MariaDB scan the whole index."""
    monkeypatch.setattr(legacy, "IN_BATCH", 3)
    ids = [1, 2, 3, 4, 2**40, 2**63 - 1, 2**63, 2**64 - 1]
    batches = list(legacy._id_batches(ids))
    assert [x for b in batches for x in b] == ids
    assert all(len(b) <= 3 for b in batches)
    assert all(max(b) < 2**63 or min(b) >= 2**63 for b in batches)
    assert list(legacy._id_batches([])) == []


def test_by_ids_finds_rows_on_both_sides_of_two_to_the_63(reader):
    """by_ids over every pin ID (the generator makes some >= 2**63) returns each row once."""
    spec = SPEC["pins"]
    every = [r[0] for r in reader.query("SELECT id FROM pins")]
    assert any(i >= 2**63 for i in every) and any(i < 2**36 for i in every)
    got = reader.by_ids(spec, [*every, 2**64 - 2], spec.judge_columns)
    assert sorted(got) == sorted(every)
    assert all(set(row) == set(spec.judge_columns) for row in got.values())
