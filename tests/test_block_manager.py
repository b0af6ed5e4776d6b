"""The KV block pool with prefix caching (engine/block_manager.py) alone: no model, no torch."""

import random

import pytest

from tests.conftest import assert_standalone_without_torch
from voxcpm_triton.engine import block_manager as bm_module
from voxcpm_triton.engine.block_manager import BlockManager, chain_hashes


def hashes(name: str, n: int, salt: bytes = b"") -> list[bytes]:
    """A prompt of n cacheable blocks; prompts with the same name share every block."""
    return chain_hashes(([name.encode(), bytes([i])] for i in range(n)), salt)


def hold(m: BlockManager, need: int, hs=()) -> list[int]:
    """Admit a request of `need` blocks with prompt hashes `hs`, take all its blocks, register its
    prompt blocks (as the engine does once the prefill is launched) -> its block table."""
    hits = m.match(hs)
    m.admit(need, hits)
    table = list(hits) + [m.take_reserved() for _ in range(need - len(hits))]
    for b, h in zip(table[len(hits):len(hs)], hs[len(hits):]):
        m.register(b, h)
    m.check()
    return table


def test_chain_hashes():
    a = chain_hashes([[b"x"], [b"y"], [b"z"]])
    assert len(a) == 3 and len(set(a)) == 3 and all(len(h) == 16 for h in a)
    assert chain_hashes([[b"x"], [b"y"], [b"z"]]) == a  # deterministic
    b = chain_hashes([[b"X"], [b"y"], [b"z"]])
    assert all(x != y for x, y in zip(a, b)), "a block's hash covers every block before it"
    assert chain_hashes([[b"x"], [b"y"], [b"Z"]])[:2] == a[:2]
    assert chain_hashes([[b"x"], [b"y"], [b"z"]], salt=b"adapter")[0] != a[0]
    assert chain_hashes([[b"ab", b"c"]]) != chain_hashes([[b"a", b"bc"]])  # parts are delimited
    assert chain_hashes([]) == []


def test_a_prefix_is_shared_with_refcounts_and_idles_after_its_last_user():
    m = BlockManager(10, first=1)
    hs = hashes("voice", 3)
    a = hold(m, 5, hs)
    assert m.cached == 3 and m.free == 5 and m.reserved == 0
    b = hold(m, 4, hs)  # a second request with the same prompt: 3 hits, 1 block of its own
    assert b[:3] == a[:3] and b[3] not in a
    assert [m.refcount(x) for x in a[:3]] == [2, 2, 2] and m.free == 4
    m.release(a, 0)
    assert [m.refcount(x) for x in a[:3]] == [1, 1, 1] and m.free == 6
    m.release(b, 0)
    assert m.free == 10 and m.idle == 3 and m.cached == 3 and all(m.refcount(x) == 0 for x in a)
    m.check()
    c = hold(m, 4, hs + hashes("other", 1))  # a hit on idle blocks takes them back
    assert c[:3] == a[:3] and m.idle == 0 and m.free == 6
    m.release(c, 0)
    m.check()


def test_idle_entries_are_room_and_evicted_least_recently_used_first_tail_first():
    m = BlockManager(6, first=1)
    a = hold(m, 3, hashes("a", 3))
    b = hold(m, 3, hashes("b", 3))
    m.release(a, 0)  # a's chain idles first (least recently used), b's after it
    m.release(b, 0)
    assert m.free == 6 and m.idle == 6 and m.can_admit(6)
    m.admit(2)
    first, second = m.take_reserved(), m.take_reserved()
    assert (first, second) == (a[2], a[1])  # a's tail first: a chain is useless without its head
    assert m.evictions == 2 and not m.is_cached(first) and m.cached == 4
    assert m.match(hashes("a", 3)) == [a[0]] and m.match(hashes("b", 3)) == b
    m.release([first, second], 0)
    assert m.free == 6 and m.idle == 4  # evicted blocks come back plain free
    m.check()


def test_admission_counts_idle_hits_as_room_taken_and_held_hits_as_free():
    m = BlockManager(8, first=1)
    hs = hashes("v", 4)
    a = hold(m, 6, hs)  # 4 cached + 2 own; 2 free left
    assert m.free == 2
    # A second request of 6 with the same 4-block prompt needs only 2 more blocks: it fits.
    hits = m.match(hs)
    assert hits == a[:4] and m.admission_cost(6, hits) == 2 and m.can_admit(6, hits)
    assert not m.can_admit(3)  # without the cache it would not
    m.release(a, 0)
    assert m.free == 8 and m.idle == 4
    # Now the hits are idle: taking them costs room like any block.
    assert m.admission_cost(6, hits) == 6 and m.can_admit(8, hits) and not m.can_admit(9, hits)
    m.admit(8, hits)
    assert m.free == 4 and m.reserved == 4
    taken = [m.take_reserved() for _ in range(4)]
    assert m.evictions == 0 and set(taken) == set(range(1, 9)) - set(hits)
    m.release(hits + taken, 0)
    m.check()


def test_no_double_free_and_no_registration_of_unheld_blocks():
    m = BlockManager(4, first=1)
    t = hold(m, 2)
    m.release(t, 0)
    with pytest.raises(KeyError):
        m.release(t, 0)
    with pytest.raises(AssertionError, match="not held"):
        m.register(t[0], b"h" * 16)
    m.check()
    with pytest.raises(AssertionError):
        m.take_reserved()  # nothing promised
    m.admit(4)
    with pytest.raises(AssertionError):
        m.admit(1)  # more than the pool can keep
    m.release([], 4)
    assert m.reserved == 0
    m.check()


def test_a_prefix_computed_twice_at_once_is_cached_once():
    m = BlockManager(8, first=1)
    hs = hashes("same", 2)
    m.admit(3)
    m.admit(3)  # both admitted before either registered: both miss
    a = [m.take_reserved() for _ in range(3)]
    b = [m.take_reserved() for _ in range(3)]
    assert [m.register(x, h) for x, h in zip(a, hs)] == [True, True]
    assert [m.register(x, h) for x, h in zip(b, hs)] == [False, False]
    assert m.match(hs) == a[:2] and m.cached == 2
    m.release(b, 0)
    assert m.idle == 0 and m.free == 5  # b's copies were private: plain free
    m.release(a, 0)
    assert m.idle == 2 and m.free == 8
    m.check()


@pytest.mark.parametrize("seed", range(6))
def test_random_admissions_keep_every_promise_and_never_deadlock(seed):
    """Requests of a few shared prompts come and go in random order: every promised block can be
    taken, the books balance after every operation, and an empty pool admits anything that fits."""
    rng = random.Random(seed)
    m = BlockManager(24, first=1)
    running = []  # (table, need)
    for _ in range(600):
        if running and rng.random() < 0.4:
            table, need = running.pop(rng.randrange(len(running)))
            m.release(table, need - len(table))
        else:
            hs = hashes(rng.choice("abcd"), rng.randint(0, 6))
            need = len(hs) + rng.randint(1, 6)
            hits = m.match(hs)
            if not m.can_admit(need, hits):
                assert running, "nothing runs, yet a request that fits the pool waits"
                continue
            m.admit(need, hits)
            table = list(hits)
            grow = rng.randint(0, need - len(hits))  # part of the promise taken now, the rest later
            table += [m.take_reserved() for _ in range(grow)]
            for b, h in zip(table[len(hits):len(hs)], hs[len(hits):]):
                m.register(b, h)
            running.append((table, need))
        # grow someone by one promised block
        if running and rng.random() < 0.5:
            table, need = rng.choice(running)
            if len(table) < need:
                table.append(m.take_reserved())
        m.check()
        held = [b for t, _ in running for b in t]
        assert all(m.refcount(b) == held.count(b) for b in set(held))
        assert m.reserved == sum(need - len(t) for t, need in running)
    for table, need in running:
        m.release(table, need - len(table))
    m.check()
    assert m.free == m.total and m.reserved == 0 and m.can_admit(m.total)


def test_the_block_manager_imports_no_torch_and_nothing_of_the_package():
    assert_standalone_without_torch(bm_module, "b = m.BlockManager(4); b.admit(2); b.take_reserved()")
