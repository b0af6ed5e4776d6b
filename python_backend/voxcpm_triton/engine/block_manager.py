"""KV block bookkeeping with prefix caching: which blocks are free, held (and by how many
requests), promised, or kept as cache entries. Plain Python (no torch, nothing of the package),
so the policy can be read and tested alone; the engine owns the K/V tensors themselves.

A block is in exactly one of three states:

    free      no request holds it and it holds nothing worth keeping
    held      refcount > 0: in the block table of that many requests
    idle      refcount 0 but it holds a cache entry (a hash): kept, in least-recently-used
              order, for a later request with the same prompt prefix; evicted (its hash
              dropped) only when a block is needed and no free one is left

Cache entries: a full block of a prompt, keyed by a hash that chains the previous block's hash
with this block's contents (`chain_hashes`), so equal hashes mean an equal prefix up to and
including that block, hence equal K/V in both LMs. Only blocks whose prefill has been launched
are registered, and only prompt blocks that decoding never writes to (see the engine).

Admission reserves a request's worst case (prompt + max_len positions) as a count, and physical
blocks are taken only as it grows, so a running request can always grow and a full pool makes
newcomers wait instead of deadlocking running ones. A request whose prompt starts with k cached
blocks holds those k at once and reserves k fewer; taking an idle one removes it from what others
can be promised, so it costs one block of room, a held one costs none (`admission_cost`).
Invariant: free + idle >= reserved, so every promise can be kept, by eviction if need be.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict, deque
from typing import Iterable, Sequence


def chain_hashes(blocks: Iterable[Sequence[bytes]], salt: bytes = b"") -> list[bytes]:
    """One hash per block, each over the previous block's hash and this block's byte strings.
    salt: whatever else changes the K/V of the positions (an adapter, ...); it seeds the chain."""
    out, prev = [], hashlib.blake2b(salt, digest_size=16).digest()
    for parts in blocks:
        h = hashlib.blake2b(prev, digest_size=16)
        for part in parts:
            h.update(len(part).to_bytes(8, "little"))  # no two splits of the same bytes collide
            h.update(part)
        prev = h.digest()
        out.append(prev)
    return out


class BlockManager:
    def __init__(self, num_blocks: int, first: int = 0):
        """Manages blocks first .. first + num_blocks - 1."""
        self.total = num_blocks
        self._free = deque(range(first, first + num_blocks))
        self._idle: OrderedDict[int, None] = OrderedDict()  # idle cache entries, least recently used first
        self._refs: dict[int, int] = {}  # held block -> refcount
        self._hash_of: dict[int, bytes] = {}  # block -> its cache entry's hash (held or idle)
        self._block_of: dict[bytes, int] = {}  # hash -> block
        self.reserved = 0  # promised to admitted requests, not yet taken
        self.evictions = 0

    # ------------------------------------------------------------------ counts
    @property
    def free(self) -> int:
        """Blocks no request holds (free or idle cache entries)."""
        return len(self._free) + len(self._idle)

    @property
    def cached(self) -> int:
        """Blocks holding a cache entry, held or idle."""
        return len(self._hash_of)

    @property
    def idle(self) -> int:
        return len(self._idle)

    def refcount(self, block: int) -> int:
        return self._refs.get(block, 0)

    def is_cached(self, block: int) -> bool:
        return block in self._hash_of

    # ------------------------------------------------------------------ admission
    def match(self, hashes: Sequence[bytes]) -> list[int]:
        """The blocks of the longest cached prefix of `hashes` (a request's chained block hashes)."""
        hits = []
        for h in hashes:
            b = self._block_of.get(h)
            if b is None:
                break
            hits.append(b)
        return hits

    def admission_cost(self, need: int, hits: Sequence[int]) -> int:
        """Room a request of `need` blocks whose prompt starts with the cached `hits` takes: the
        blocks it still has to take, plus the idle hits it takes out of the evictable set."""
        return need - len(hits) + sum(1 for b in hits if b not in self._refs)

    def can_admit(self, need: int, hits: Sequence[int] = ()) -> bool:
        return self.free - self.reserved >= self.admission_cost(need, hits)

    def admit(self, need: int, hits: Sequence[int] = ()):
        """Hold the hit blocks and reserve the rest of `need`."""
        assert self.can_admit(need, hits) and len(hits) <= need
        for b in hits:
            assert b in self._hash_of, b
            if b in self._refs:
                self._refs[b] += 1
            else:
                del self._idle[b]
                self._refs[b] = 1
        self.reserved += need - len(hits)

    # ------------------------------------------------------------------ growing and ending
    def take_reserved(self) -> int:
        """One promised block: a free one, else the least recently used idle entry (evicted)."""
        assert self.reserved > 0 and self.free > 0
        self.reserved -= 1
        if self._free:
            b = self._free.popleft()
        else:
            b, _ = self._idle.popitem(last=False)
            del self._block_of[self._hash_of.pop(b)]
            self.evictions += 1
        self._refs[b] = 1
        return b

    def release(self, blocks: Sequence[int], unused_reservation: int):
        """A request lets go of its table and its promise. Blocks nobody holds any more return:
        cache entries as idle (most recently used), the rest as free. In reverse table order, so
        a prefix's tail is evicted before its head (a chain is useless without its head)."""
        for b in reversed(blocks):
            n = self._refs[b] - 1  # KeyError: a block released more often than held
            if n:
                self._refs[b] = n
                continue
            del self._refs[b]
            if b in self._hash_of:
                self._idle[b] = None
            else:
                self._free.append(b)
        self.reserved -= unused_reservation
        assert 0 <= self.reserved <= self.free

    def register(self, block: int, h: bytes) -> bool:
        """Make a held block the cache entry for hash `h` (its K/V is written, or its write is
        ordered before any reader's). False if `h` already has a block (a prefix computed twice
        at once): this one stays private and returns to the free list when released."""
        assert self._refs.get(block, 0) > 0, f"block {block} is not held"
        if h in self._block_of or block in self._hash_of:
            return False
        self._block_of[h] = block
        self._hash_of[block] = h
        return True

    # ------------------------------------------------------------------ checks
    def check(self):
        """AssertionError if the books do not balance (tests call this)."""
        free, idle, held = set(self._free), set(self._idle), set(self._refs)
        assert len(free) == len(self._free), "a block is free twice"
        assert not (free & idle or free & held or idle & held), "a block is in two states"
        assert len(free) + len(idle) + len(held) == self.total
        assert all(n > 0 for n in self._refs.values())
        assert idle <= set(self._hash_of) and not free & set(self._hash_of)
        assert all(self._block_of[h] == b for b, h in self._hash_of.items())
        assert len(self._block_of) == len(self._hash_of)
        assert 0 <= self.reserved <= self.free
