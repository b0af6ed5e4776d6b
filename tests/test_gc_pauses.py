"""serving/gc_pauses: start-up's objects frozen (the served log and metrics are checked in
tests/test_server.py), and collections timed by generation."""

import gc
import weakref

import pytest

from voxcpm_triton.serving import gc_pauses


@pytest.fixture
def unfrozen():
    """The test process as it was: nothing left frozen for the tests after this one."""
    gc.unfreeze()
    yield
    gc.unfreeze()


class _Node:
    pass


def test_freeze_moves_what_start_up_left_to_the_permanent_generation(unfrozen, monkeypatch):
    monkeypatch.delenv("VOXCPM_GC_FREEZE", raising=False)
    keep = [[i] for i in range(1000)]  # start-up's objects: tracked, alive
    garbage = _Node()
    garbage.me = garbage  # a cycle: only a collection frees it
    gone = weakref.ref(garbage)
    del garbage
    got = gc_pauses.freeze("test")
    assert gone() is None  # collected first, not frozen with the rest
    assert got["frozen"] and gc.get_freeze_count() >= got["objects"] - 10 > len(keep)
    assert got["full_collection_s"] > 0 and got["full_collection_frozen_s"] >= 0
    assert not any(o is keep for o in gc.get_objects())  # a collection's walk skips it


def test_freeze_off_leaves_the_collector_as_it_was(unfrozen, monkeypatch):
    monkeypatch.setenv("VOXCPM_GC_FREEZE", "0")
    got = gc_pauses.freeze("test")
    assert not got["frozen"] and "full_collection_frozen_s" not in got
    assert gc.get_freeze_count() == 0


def test_pauses_counts_and_times_collections_by_generation():
    pauses = gc_pauses.Pauses()
    try:
        gc.collect(2)
        gc.collect(0)
        assert pauses.count[2] == 1 and pauses.count[0] >= 1
        assert pauses.seconds[2] > 0 and pauses.longest_s >= pauses.seconds[2]
    finally:
        pauses.close()
    counted = list(pauses.count)
    gc.collect(2)
    assert pauses.count == counted  # closed: no longer called
