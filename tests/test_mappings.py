"""Mapping store: idempotent adds, stable pages without gaps or repeats, counts."""

import random

import pytest

from shardfarm.errors import FatalError, InvalidIdError
from sharding import ids
from sharding.mappings import Edge, MappingStore
from sharding.objects import ObjectStore
from tests.conftest import SHARDS_B


@pytest.fixture
def board(router):
    return ObjectStore(router).create(SHARDS_B[0] + 3, "board", {"name": "b"})


def _pins(n, shard=SHARDS_B[0] + 3):
    return [ids.encode(shard, "pin", 10_000 + i) for i in range(n)]


def test_many_pins_one_sequence_page_stably(router, board):
    store = MappingStore(router, "board_has_pins")
    pins = _pins(230)
    rng = random.Random(7)
    edges = [Edge(board, p, 1_400_000_000 + (i % 3)) for i, p in enumerate(pins)]
    rng.shuffle(edges)
    store.add_many(edges)
    expected = [e.to_id for e in sorted(edges, key=lambda e: (-e.sequence, -e.to_id))]

    def walk_cursor():
        out, cursor = [], None
        while True:
            page = store.page(board, limit=50, cursor=cursor)
            out += page.ids
            if page.next_cursor is None:
                return out
            cursor = page.next_cursor

    first, second = walk_cursor(), walk_cursor()
    assert first == second == expected
    by_offset = [i for off in range(0, 230, 50) for i in store.page(board, 50, offset=off).ids]
    assert by_offset == expected
    assert store.count(board) == 230


def test_add_is_idempotent_and_remove(router, board):
    store = MappingStore(router, "board_has_pins")
    pin = _pins(1)[0] + 5000
    store.add(board, pin, 5)
    store.add(board, pin, 5)
    store.add(board, pin, 9)
    assert store.count(board) == 1
    assert store.page(board).edges == [Edge(board, pin, 9)]
    assert store.remove(board, pin) and not store.remove(board, pin)
    assert store.count(board) == 0


def test_last_page_has_no_cursor(router, board):
    store = MappingStore(router, "board_has_pins")
    store.add_many([Edge(board, p, 1) for p in _pins(50)])
    page = store.page(board, limit=50)
    assert len(page.ids) == 50 and page.next_cursor is None


def test_bad_requests(router, board):
    with pytest.raises(FatalError):
        MappingStore(router, "pins_of_nobody")
    store = MappingStore(router, "board_has_pins")
    with pytest.raises(InvalidIdError):
        store.page(board, cursor="garbage")
    with pytest.raises(FatalError):
        store.page(board, limit=0)
