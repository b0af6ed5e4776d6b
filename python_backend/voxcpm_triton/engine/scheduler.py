"""The engine's policy, apart from the model: who waits, who runs, who takes part in the next
step, when patches go out and when a request ends.

Plain Python with no imports from this package, no torch and no thread, so it can be read
and tested alone. The engine's thread makes every call; the engine does the GPU work, the
thread hand-off and the delivery to sinks.

Requests are the engine's `RequestState` objects (duck-typed here). The scheduler reads
`request_id`, `blocks_reserved`, `block_hashes`, `max_len`, `req.min_len`, `req.inference_timesteps`,
and keeps `slot`, `block_table`, `cached_blocks`, `step`, `pending`, `pending_from`, `chunks_sent`,
`patches_sent`, `first_sent_at`; it reads `req.playback` where present;
the engine advances `launched` and `prompt_len`. Patches are opaque: they are only collected into lists.

Blocks: admission reserves a request's worst case (prompt + max_len positions) as a count,
and physical blocks are taken only as it grows, so a running request can always grow and a
full pool makes newcomers wait instead of deadlocking running ones. Admission is FIFO and
head-of-line: a request that does not fit yet is not overtaken, so it cannot starve.

Chunks: a request's patches go out in chunks of the sizes on `chunk_schedule` (small first, for
time to first audio; large later, for the VAE's efficiency). With `playback_margin_s`, a request
whose client plays as it receives (`req.playback`) and is about to run out of audio does not wait
for its chunk to fill: its pending patches go out at once as the largest schedule size they fill
(the rest with its next chunk), or all of them if it has already run dry. Schedule sizes are
chunk lengths the VAE has graphs for (a check across the models' parameters warns otherwise); any
other length costs it several replays, and sending every pending patch at every early chunk
played worse under load (benchmarks/results.md). The client is taken to play from the moment its
first chunk left, so what it still has buffered is the audio sent minus the time since; a client
that ran dry waited for the next chunk, so its clock restarts there.

Prefix caching: a request's `block_hashes` (one per full prompt block that decoding never
writes, empty with caching off) are looked up at admission; the longest cached prefix starts
its block table (shared, read only) and it prefills only the positions after it. Once its
prefill is launched, `cache_prompt` offers its own full prompt blocks as cache entries. The
block pool (block_manager.BlockManager) counts idle cache entries as room, evicting them in
least-recently-used order, so caching never makes admission wait longer than without it.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from dataclasses import dataclass
from typing import Callable, Protocol


class EngineBusy(RuntimeError):
    """The waiting queue is at `max_waiting`: the caller should retry later."""


class BlockPool(Protocol):
    """What the scheduler needs of the KV block pool (block_manager.BlockManager)."""

    total: int
    reserved: int  # promised to admitted requests, not yet taken

    @property
    def free(self) -> int: ...  # blocks no request holds (idle cache entries included)
    def refcount(self, block: int) -> int: ...
    def is_cached(self, block: int) -> bool: ...
    def match(self, hashes) -> list[int]: ...
    def can_admit(self, need: int, hits=()) -> bool: ...
    def admit(self, need: int, hits=()) -> None: ...
    def take_reserved(self) -> int: ...
    def release(self, blocks: list[int], unused_reservation: int) -> None: ...
    def register(self, block: int, h) -> bool: ...


@dataclass
class Delivery:
    """What one delivered step means for its request: patches to send now, and whether it ends."""

    patches: list | None  # the oldest patches not yet sent, in step order; None: keep collecting
    first_step: int  # step index of patches[0]
    finish: str | None  # "stop" | "max_len": end the request after sending


class Scheduler:
    def __init__(self, blocks: BlockPool, block_size: int, max_num_seqs: int, chunk_schedule,
                 loop_bucket: Callable[[int], int], max_waiting: int | None = None,
                 playback_margin_s: float = 0.0, patch_seconds: float = 0.0):
        """loop_bucket(timesteps) -> the CFM loop length those timesteps run in (the step runner's).
        playback_margin_s: send early when a client has less audio than this left (0: never);
        patch_seconds: the audio one patch holds."""
        self.blocks = blocks
        self.block_size = block_size
        self.max_num_seqs = max_num_seqs
        self.chunk_schedule = tuple(chunk_schedule)  # patches per chunk; the last repeats
        self.playback_margin_s, self.patch_seconds = playback_margin_s, patch_seconds
        self.early_chunks = 0  # chunks sent before they filled (playback margin)
        self.loop_bucket = loop_bucket
        self.max_waiting = max_waiting
        self.waiting: deque = deque()
        self.running: dict = {}  # request id -> state
        self._free_slots = list(range(max_num_seqs))  # rows of the step runner's state buffers
        self.prefix_hits = 0  # requests admitted with at least one cached block
        self.prefix_hit_blocks = 0  # cached blocks they started from

    # ------------------------------------------------------------------ queueing
    def blocks_needed(self, request_id: str, prompt_len: int, max_len: int) -> int:
        """The worst-case blocks to reserve; ValueError if the whole pool could never hold them."""
        need = math.ceil((prompt_len + max_len) / self.block_size)
        if need > self.blocks.total:
            raise ValueError(f"request {request_id!r} needs {need} KV blocks (prompt {prompt_len} + max_len "
                             f"{max_len} positions) but the pool has only {self.blocks.total}")
        return need

    def check_room(self, queued_elsewhere: int = 0):
        """EngineBusy if one more request would pass `max_waiting` (counting requests handed to
        the engine but not yet added here)."""
        waiting = len(self.waiting) + queued_elsewhere
        if self.max_waiting is not None and waiting >= self.max_waiting:
            raise EngineBusy(f"server busy: {waiting} requests are already waiting for the decoder "
                             f"(parameter max_waiting_requests); retry later")

    def add(self, st):
        self.waiting.append(st)

    def admit(self) -> list:
        """Move requests from the head of the queue to running while there is a free row and
        their worst case fits (less the cached prefix they start from); the first that does not
        fit stops admission."""
        admitted = []
        while self.waiting and len(self.running) < self.max_num_seqs:
            st = self.waiting[0]
            hits = self.blocks.match(st.block_hashes)
            if not self.blocks.can_admit(st.blocks_reserved, hits):
                break
            self.waiting.popleft()
            self.blocks.admit(st.blocks_reserved, hits)
            st.block_table, st.cached_blocks = list(hits), len(hits)
            if hits:
                self.prefix_hits += 1
                self.prefix_hit_blocks += len(hits)
            st.slot = self._free_slots.pop()
            self.running[st.request_id] = st
            admitted.append(st)
        return admitted

    def cache_prompt(self, st):
        """Offer the request's own full prompt blocks as cache entries. Call once its prefill has
        been launched: a later reader's work is ordered after that write (one GPU stream)."""
        n = len(st.block_hashes)
        for block, h in zip(st.block_table[st.cached_blocks:n], st.block_hashes[st.cached_blocks:n]):
            self.blocks.register(block, h)

    # ------------------------------------------------------------------ ending
    def is_running(self, st) -> bool:
        return self.running.get(st.request_id) is st

    def get(self, request_id: str):
        """The waiting or running request with this id, or None."""
        return self.running.get(request_id) or next((w for w in self.waiting if w.request_id == request_id), None)

    def cancel(self, request_id: str):
        """Remove a waiting or running request; returns it (None if it is not here)."""
        st = self.get(request_id)
        if st is not None:
            self.finish(st)
        return st

    def finish(self, st):
        """Let go of a request wherever it is: its slot and all its blocks (taken or only
        reserved) return at once. Work already launched for it is dropped by `is_running`."""
        if self.running.pop(st.request_id, None) is not None:
            self.blocks.release(st.block_table, st.blocks_reserved - len(st.block_table))
            self._free_slots.append(st.slot)
            st.slot = None
        else:
            try:
                self.waiting.remove(st)
            except ValueError:
                pass
        st.block_table = []
        st.cached_blocks = 0
        st.pending = []

    def all_requests(self) -> list:
        return list(self.running.values()) + list(self.waiting)

    # ------------------------------------------------------------------ steps
    def grow_to(self, st, n_positions: int):
        """Take reserved blocks until the request's table covers n_positions."""
        while len(st.block_table) * self.block_size < n_positions:
            st.block_table.append(self.blocks.take_reserved())

    def decode_candidates(self) -> list:
        """Running requests that take part in the next launch: those whose last step is not yet
        launched (a step may be in flight ahead of the delivered ones)."""
        return [st for st in self.running.values() if st.launched < st.max_len]

    def launch_groups(self, batch: list) -> list[list]:
        """The batch split by CFM loop bucket, shortest loop first (its results are ready first),
        so that each group's loop is its own rows' length, not the longest request's."""
        groups: dict[int, list] = {}
        for st in batch:
            groups.setdefault(self.loop_bucket(st.req.inference_timesteps), []).append(st)
        return [groups[loop] for loop in sorted(groups)]

    # ------------------------------------------------------------------ output
    def chunk_size(self, st) -> int:
        sched = self.chunk_schedule
        return sched[min(st.chunks_sent, len(sched) - 1)]

    def fills_first_chunk(self, st) -> bool:
        """Whether the request's next patch completes its first chunk, for a client that plays as it
        receives (`req.playback`): the audio it is waiting for before anything."""
        return (st.chunks_sent == 0 and len(st.pending) + 1 >= self.chunk_size(st)
                and getattr(st.req, "playback", True))

    def first_audio_first(self, rows) -> bool:
        """Whether a step's first chunks should have their audio before the next step starts: when
        every row of it still running fills its first chunk, so nobody already playing waits for
        them (a lone request, the first wave of a burst)."""
        rows = [st for st in rows if self.is_running(st)]
        return bool(rows) and all(self.fills_first_chunk(st) for st in rows)

    def buffered_s(self, st, now: float) -> float | None:
        """The audio the request's client still has to play at `now` (None before its first chunk)."""
        if st.first_sent_at is None:
            return None
        return st.patches_sent * self.patch_seconds - (now - st.first_sent_at)

    def on_patch(self, st, patch, stop: bool, now: float = 0.0) -> Delivery:
        """Record the next step's patch (delivered at `now`, monotonic seconds). The stop head
        counts only after min_len steps; max_len ends the request regardless. A chunk goes out when
        it reaches its size on the schedule, with the last step, or early (a schedule size, the
        rest held, unless the client has run dry) when its buffer is below the playback margin."""
        i = st.step
        st.step += 1
        if not st.pending:
            st.pending_from = i
        st.pending.append(patch)
        reason = "stop" if (i > st.req.min_len and stop) else "max_len" if st.step >= st.max_len else None
        out = Delivery(None, st.pending_from, reason)
        left = self.buffered_s(st, now)
        send = bool(reason) or len(st.pending) >= self.chunk_size(st)
        n = len(st.pending)  # patches this chunk takes
        if not send and self.playback_margin_s > 0 and getattr(st.req, "playback", True):
            send = left is not None and left < self.playback_margin_s
            self.early_chunks += send
            if left is None or left >= 0:  # not dry yet: a schedule size (a waiting client gets all)
                n = max((k for k in self.chunk_schedule if k <= n), default=n)
        if send:
            if left is not None and left < 0:  # the client ran dry and waited: it plays on from now
                st.first_sent_at -= left
            if st.first_sent_at is None:
                st.first_sent_at = now
            out.patches, st.pending = st.pending[:n], st.pending[n:]
            st.pending_from += n
            st.chunks_sent += 1
            st.patches_sent += len(out.patches)
        return out

    # ------------------------------------------------------------------ checks
    def check_invariants(self):
        """AssertionError if the books do not balance (tests call this)."""
        running = list(self.running.values())
        slots = [st.slot for st in running]
        assert all(s is not None for s in slots)
        assert sorted(slots + self._free_slots) == list(range(self.max_num_seqs)), (slots, self._free_slots)
        taken = Counter(b for st in running for b in st.block_table)
        for b, n in taken.items():  # only cache entries are shared, and each table holds its reference
            assert self.blocks.refcount(b) == n, (b, n, self.blocks.refcount(b))
            assert n == 1 or self.blocks.is_cached(b), f"block {b} is in {n} tables but no cache entry"
        assert all(len(st.block_table) >= st.cached_blocks for st in running)
        assert self.blocks.free + len(taken) == self.blocks.total
        assert self.blocks.reserved == sum(st.blocks_reserved - len(st.block_table) for st in running)
        assert all(st.slot is None and not st.block_table for st in self.waiting)
        assert len(running) <= self.max_num_seqs
        assert not {st.request_id for st in self.waiting} & set(self.running)
