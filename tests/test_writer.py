"""Shard-table bulk writes: a few rows as one INSERT, more as LOAD DATA, the same result."""

from __future__ import annotations

import json

import pytest

from loaders.migration import writer
from sharding.schema import shard_table
from tests.conftest import SHARDS_A

SHARD = SHARDS_A[0] + 5
DOCS = ['{"legacy_id": 1, "t": "a\\\\b \\"q\\" \\t é 🎉"}', '{"legacy_id": 2, "t": "x"}',
        '{"legacy_id": 3, "t": "\\\\"}']


@pytest.fixture(params=["insert", "infile"])
def path(request, monkeypatch):
    """Each test once per path: ``insert`` (one multi-row INSERT) and ``infile`` (a file)."""
    monkeypatch.setattr(writer, "INSERT_ROWS", 1000 if request.param == "insert" else 0)
    return request.param


@pytest.fixture
def tables(router):
    """This shard's pins and board_has_pins, emptied before and after."""
    names = [shard_table(SHARD, "pins"), shard_table(SHARD, "board_has_pins")]

    def empty(cur) -> None:
        for q in names:
            cur.execute(f"DELETE FROM {q}")
    router.run(SHARD, empty)
    yield names
    router.run(SHARD, empty)


def _load(router, q: str, kind: str, rows: list[tuple], mode: str) -> int:
    got = []
    router.run(SHARD, lambda cur: got.append(writer.load_rows(cur, q, kind, rows, mode)),
               infile=True)
    return got[0]


def _stored(router, q: str) -> list[tuple]:
    return router.query(router.host_for(SHARD), f"SELECT * FROM {q} ORDER BY 1, 2", (), SHARD)


def test_objects_ignore_then_replace(router, tables, path):
    """``IGNORE`` counts only the rows it inserted and keeps what is there; ``REPLACE``
    overwrites; documents with backslashes, quotes, tabs and non-ASCII text arrive intact."""
    pins = tables[0]
    first = [(3, DOCS[2], 3), (1, DOCS[0], 1)]
    assert _load(router, pins, "object", first, "IGNORE") == 2
    again = [(2, DOCS[1], 2), (1, DOCS[1], 1)]
    assert _load(router, pins, "object", again, "IGNORE") == 1
    stored = _stored(router, pins)
    assert [(n, json.loads(d), a) for n, d, a in stored] == \
        [(1, json.loads(DOCS[0]), 1), (2, json.loads(DOCS[1]), 1), (3, json.loads(DOCS[2]), 1)]
    assert _load(router, pins, "object", [(1, DOCS[2], 1)], "REPLACE") == 2  # deleted + added
    assert json.loads(_stored(router, pins)[0][1]) == json.loads(DOCS[2])


def test_mappings_replace(router, tables, path):
    """Mapping rows are loaded with ``REPLACE``: a row's key is its owner."""
    q = tables[1]
    big = 1 << 62
    assert _load(router, q, "mapping", [(big + 1, 7, 100), (5, big, 200)], "REPLACE") == 2
    assert _load(router, q, "mapping", [(5, big, 300)], "REPLACE") == 2
    assert _stored(router, q) == [(5, big, 300), (big + 1, 7, 100)]


def test_nothing_to_load(router, tables, path):
    """No rows: nothing written, nothing affected."""
    assert _load(router, tables[0], "object", [], "IGNORE") == 0
    assert _stored(router, tables[0]) == []


def test_the_path_follows_the_row_count(router, tables, monkeypatch):
    """Up to ``INSERT_ROWS`` rows take no file; more take one."""
    made = []
    real = writer.temp_tsv
    monkeypatch.setattr(writer, "temp_tsv", lambda text: made.append(text) or real(text))
    n = writer.INSERT_ROWS
    rows = [(i, 1, i) for i in range(1, n + 2)]
    assert _load(router, tables[1], "mapping", rows[:n], "REPLACE") == n
    assert made == []
    later = [(a, b, seq + 1) for a, b, seq in rows]
    assert _load(router, tables[1], "mapping", later, "REPLACE") == 2 * n + 1  # n replaced
    assert len(made) == 1
    assert _stored(router, tables[1]) == later
