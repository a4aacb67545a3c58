"""The survey of a chunk's slots: held by their own row, taken by another, or empty, read
for many shard tables on two servers in a few ``UNION ALL`` statements."""

from __future__ import annotations

import json

import pytest

from loaders.migration import claims, present
from loaders.migration.build import TargetRows
from sharding.ids import FIRST_ALLOCATED
from sharding.schema import shard_table
from tests.conftest import SHARDS_A, SHARDS_B

SHARDS = [SHARDS_A[0] + 4, SHARDS_A[0] + 5, SHARDS_B[0] + 4]


@pytest.fixture
def slots(router):
    """Per shard: slot 10 held by legacy 10, slot 11 by legacy 99 (taken), slot 12 empty;
    a placeholder in the allocated half; on the last shard, boards as well as pins."""
    def empty() -> None:
        for s in SHARDS:
            router.run(s, lambda cur, s=s: [cur.execute(f"DELETE FROM {shard_table(s, t)}")
                                            for t in ("pins", "boards")])
    empty()
    for s in SHARDS:
        def fill(cur, s=s) -> None:
            for table in ("pins", "boards"):
                cur.executemany(f"INSERT INTO {shard_table(s, table)} VALUES (%s, %s, 1)", [
                    (10, json.dumps({"legacy_id": 10})), (11, json.dumps({"legacy_id": 99})),
                    (FIRST_ALLOCATED + 1, json.dumps({"allocating": "x"}))])
        router.run(s, fill)
    yield
    empty()


def _wants(taker: int) -> list[tuple]:
    """Slots 10, 11 (wanted by legacy ``taker``: each table's own, to tell them apart), 12
    and two of the allocated half, ``(local, document, legacy)``."""
    return [(local, "{}", legacy) for local, legacy in
            [(10, 10), (11, taker), (12, 12), (FIRST_ALLOCATED + 1, 1 << 40),
             (FIRST_ALLOCATED + 2, (1 << 40) + 1)]]


@pytest.mark.parametrize("parts", [200, 2])
def test_the_survey_names_held_and_taken_slots_on_every_shard(router, slots, parts,
                                                              monkeypatch):
    monkeypatch.setattr(present, "UNION_PARTS", parts)  # 2: several statements a server
    tables = [(s, "pins") for s in SHARDS] + [(SHARDS[-1], "boards")]
    target = TargetRows()
    for i, t in enumerate(tables):
        target.objects[t] = _wants(1100 + i)
    found = claims.survey(router, target)
    assert dict(found.held) == {t: {10, FIRST_ALLOCATED + 1} for t in tables}
    assert found.taken == {1100 + i: f"shard {s} local_id 11 holds legacy 99"
                           for i, (s, _) in enumerate(tables)}


def test_scattered_keys_are_read_by_key(router, slots):
    """Keys too sparse for one range (a sync's) are read by key, in lists."""
    far = [(10, "{}", 10), (5_000_000, "{}", 5_000_000), (11, "{}", 11)]
    target = TargetRows()
    target.objects[(SHARDS[0], "pins")] = far
    found = claims.survey(router, target)
    assert dict(found.held) == {(SHARDS[0], "pins"): {10}}
    assert set(found.taken) == {11}


def test_a_ranged_survey_reads_sparse_keys_as_one_range(router, slots):
    """A chunk's slice (``ranged``): its sparse keys on a shard are read as one index range,
    and only the wanted slots in it count (slot 10 is in the range but not wanted)."""
    far = [(5, "{}", 5), (11, "{}", 11), (5_000_000, "{}", 5_000_000)]
    assert claims._conditions([r[0] for r in far], ranged=True) == [
        ("local_id BETWEEN %s AND %s", [5, 5_000_000])]
    target = TargetRows()
    target.objects[(SHARDS[0], "pins")] = far
    found = claims.survey(router, target, ranged=True)
    assert dict(found.held) == {}
    assert found.taken == {11: f"shard {SHARDS[0]} local_id 11 holds legacy 99"}
