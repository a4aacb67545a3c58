"""Binlog positions and row images as ``farm sync`` reads them (pure functions), and the
keys a batch of changes touches."""

import pytest

from loaders.migration import binlog, sync
from loaders.migration.present import Selection
from loaders.migration.sync import Changes


def test_positions_parse_render_and_count_what_is_behind():
    pos = binlog.parse("0-7-26,1-9-3")
    assert pos == {0: (7, 26), 1: (9, 3)}
    assert binlog.render(pos) == "0-7-26,1-9-3"
    assert binlog.behind("0-7-20", "0-7-26,1-9-3") == 9
    assert binlog.behind("0-7-26,1-9-3", "0-7-26,1-9-3") == 0
    assert binlog.behind("", "") == 0


def test_unnamed_row_images_are_named_and_unsigned_by_the_legacy_schema():
    image = {"UNKNOWN_COL0": -1, "UNKNOWN_COL1": 5, "UNKNOWN_COL2": None}
    assert binlog.named("follows", image) == {"user_id": (1 << 64) - 1, "board_id": 5,
                                              "created_at": None}
    assert binlog.named("users", {"id": 3, "username": "a"}) == {"id": 3, "username": "a"}
    # logged names (binlog_row_metadata=FULL) with a column added in the middle: by name
    logged = {"user_id": 1, "note": "x", "board_id": 5, "created_at": None}
    assert binlog.named("follows", logged) == logged


def test_changes_cascade_only_when_a_judged_column_changes():
    c = Changes()
    c.add("users", {"id": 1, "username": "a", "full_name": "x", "created_at": "2015-01-01"},
          {"id": 1, "username": "a", "full_name": "y", "created_at": "2015-01-01"})
    assert c.keys["users"] == {1} and not c.roots["users"]  # a full name: no dependents
    judged = Changes()  # an e-mail is judged (too long for its lookup key): dependents too
    judged.add("users", {"id": 1, "username": "a", "email": "x", "created_at": "2015-01-01"},
               {"id": 1, "username": "a", "email": "y", "created_at": "2015-01-01"})
    assert judged.roots["users"] == {1}
    c.add("users", {"id": 2, "username": "b", "created_at": "2015-01-01"},
          {"id": 2, "username": None, "created_at": "2015-01-01"})
    c.add("boards", None, {"id": 9, "user_id": 2, "created_at": None})
    c.add("likes", {"user_id": 4, "pin_id": 5, "created_at": None}, None)
    assert c.roots == {"users": {2}, "boards": {9}}
    assert c.keys == {"users": {1, 2}, "boards": {9}}
    assert c.pairs == {"likes": {(4, 5)}}  # a like is its own key, not all its user's likes
    big = 1 << 35
    c.add("follows", None, {"user_id": 4, "board_id": big, "created_at": None})
    assert c.keys["follows"] == {4}  # an allocated local ID names no key: the user whole
    c.add("elsewhere", None, {"id": 1})  # a table the migration does not read
    assert c.rows() == 5


def test_a_selection_of_pairs_takes_small_ids_only():
    sel = Selection.of_pairs({(7, 42), (3, 9), (7, 1)})
    assert sel.values == (3, 7) and sel.pairs == {(7, 42), (3, 9), (7, 1)}
    with pytest.raises(ValueError):
        Selection.of_pairs({(7, 1 << 35)})


def test_only_a_changed_placing_column_looks_for_an_old_slot_on_every_shard():
    c = Changes()
    pin = {"id": 1, "user_id": 2, "board_id": 3, "created_at": "2015-01-01"}
    c.add("pins", pin, {**pin, "created_at": None})  # judged, but placed the same
    c.add("pins", {**pin, "id": 4}, {**pin, "id": 4, "board_id": 5, "user_id": 6})  # moved
    c.add("pins", None, {**pin, "id": 8})  # new: nothing of it anywhere but where mapped
    comment = {"id": 7, "pin_id": 1, "user_id": 2, "created_at": "2015-01-01"}
    c.add("comments", comment, {**comment, "pin_id": 4})  # placed with its pin: moved
    c.add("users", {"id": 2, "username": "a"}, {"id": 2, "username": "b"})  # users never move
    assert c.moved == {"pins": {4}, "comments": {7}}
    got = [(s.values, s.mapped_only, keys) for s, keys, _ in sync._selections(c, "pins")]
    assert got == [((4,), False, ["4"]), ((1, 8), True, ["1", "8"])]
    assert [s.mapped_only for s, _, _ in sync._selections(c, "users")] == [True]
