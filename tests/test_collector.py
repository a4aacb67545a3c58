"""The cyclic collector is off inside ``held_off`` and back as it was after, errors included."""

from __future__ import annotations

import gc
import weakref

import pytest

from shardfarm.collector import held_off


@pytest.fixture(autouse=True)
def _restore():
    was = gc.isenabled()
    yield
    (gc.enable if was else gc.disable)()


def test_off_inside_and_on_after():
    gc.enable()
    with held_off():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_back_on_after_an_error():
    gc.enable()
    with pytest.raises(RuntimeError), held_off():
        raise RuntimeError("chunk failed")
    assert gc.isenabled()


def test_left_off_when_it_was_off():
    gc.disable()
    with held_off():
        pass
    assert not gc.isenabled()


class _Node:
    me: object = None


def test_a_cycle_made_inside_waits_for_the_collector():
    gc.enable()
    with held_off():
        n = _Node()
        n.me = n
        ref = weakref.ref(n)
        del n
        for _ in range(10_000):  # allocations that would have set off collections
            _Node()
        assert ref() is not None  # reference counting alone cannot free a cycle
    gc.collect()
    assert ref() is None
