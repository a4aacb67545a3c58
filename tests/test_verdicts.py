"""Judging legacy rows: verdicts shared across the chunks of one process equal fresh ones."""

from __future__ import annotations

import pytest

from demo.legacygen.generate import generate
from loaders.migration import legacy
from loaders.migration.spec import SPEC
from loaders.migration.verdicts import Resolver, Verdicts, user_placement
from shardfarm.mysql.db import drop_database
from shardfarm.mysql.dsn import DSN
from tests.conftest import ns_db

DSN_TEST = DSN.parse(f"mysql://root@127.0.0.1:3306/{ns_db('legacy_resolve_test')}")
PLACE = user_placement(list(range(8)))


class CountingReader(legacy.LegacyReader):
    """The real reader, counting the IDs it is asked to fetch per table."""

    def __init__(self, dsn: DSN) -> None:
        super().__init__(dsn)
        self.asked: dict[str, int] = {}

    def by_ids(self, table, ids, cols=None):
        ids = list(ids)
        self.asked[table.name] = self.asked.get(table.name, 0) + len(ids)
        return super().by_ids(table, ids, cols)


@pytest.fixture(scope="module")
def reader():
    generate(DSN_TEST, 120, 5)
    r = CountingReader(DSN_TEST)
    yield r
    r.close()
    drop_database(DSN_TEST)


def _judge(reader, table: str, verdicts: Verdicts | None) -> list[tuple]:
    spec = SPEC[table]
    rows = reader.chunk(spec, 0, 2**64 - 1)
    resolver = Resolver(reader, PLACE, verdicts)
    resolver.load(spec, rows)
    return [(r[spec.key[0]], resolver.judge(spec, r)) for r in rows]


def test_shared_verdicts_skip_fetches_and_match_fresh_ones(reader):
    shared = Verdicts()
    _judge(reader, "boards", shared)
    reader.asked.clear()
    cached = _judge(reader, "pins", shared)
    existing = {r[0] for r in reader.query("SELECT id FROM boards")}
    # only boards that do not exist are asked for: the boards chunk judged all the others
    assert reader.asked.get("boards", 0) == len(
        {r["board_id"] for r in reader.chunk(SPEC["pins"], 0, 2**64 - 1)} - existing - {None})
    reader.asked.clear()
    fresh = _judge(reader, "pins", None)
    assert reader.asked["boards"] > 0
    assert cached == fresh
    assert any(not v.valid for *_, v in fresh) and any(v.valid for *_, v in fresh)


def test_missing_parents_are_remembered_as_absent(reader):
    shared = Verdicts()
    first = _judge(reader, "comments", shared)
    assert any(v.reason == "missing_pin" for *_, v in first)
    reader.asked.clear()
    again = _judge(reader, "comments", shared)
    assert reader.asked == {} and again == first


def test_trim_forgets_everything_past_the_limit(reader):
    shared = Verdicts(limit=10)
    _judge(reader, "boards", shared)
    assert shared.size() > 10
    shared.trim()
    assert shared.size() == 0
    small = Verdicts(limit=10**9)
    _judge(reader, "users", small)
    n = small.size()
    small.trim()
    assert small.size() == n
