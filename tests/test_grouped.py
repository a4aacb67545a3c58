"""Telling the groups the server joined whole from those it cut (``shardfarm.mysql.grouped``)."""

from shardfarm.mysql.grouped import split_joined


def test_whole_groups_are_kept_and_cut_ones_named_by_key():
    groups = [(2, 10, "a\x1eb\x1e"),   # whole
              (3, 11, "a\x1eb\x1e"),   # a line missing
              (2, 12, "a\x1eb"),       # the last line cut short (its count still matches)
              (1, 13, None),           # past max_allowed_packet
              (1, 14, "c\x1e")]        # whole
    assert split_joined(groups, "\x1e") == (["a\x1eb\x1e", "c\x1e"], 3, [11, 12, 13])


def test_bytes_work_the_same():
    assert split_joined([(1, 5, b'{"x":1}\n'), (2, 6, b'{"x":1}\n{"x"')], b"\n") == \
        ([b'{"x":1}\n'], 1, [6])
