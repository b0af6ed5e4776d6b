"""The engine's Scheduler alone: no model, no tensors (prompts are only a length, patches any object)."""

import random
from types import SimpleNamespace

import pytest

from tests.conftest import assert_standalone_without_torch
from voxcpm_triton.engine import scheduler as scheduler_module
from voxcpm_triton.engine.block_manager import BlockManager, chain_hashes
from voxcpm_triton.engine.request import RequestState
from voxcpm_triton.engine.scheduler import EngineBusy, Scheduler

BLOCK = 4


class FakePrompt:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


def loop_bucket(timesteps):
    return 10 if timesteps <= 10 else 100


def make(num_blocks=64, max_num_seqs=8, chunk_schedule=(1, 4, 16), max_waiting=None):
    return Scheduler(BlockManager(num_blocks, first=1), BLOCK, max_num_seqs, chunk_schedule, loop_bucket,
                     max_waiting)


def request(s, rid, prompt_len=8, max_len=8, min_len=0, timesteps=10, voice=None):
    """A request as the engine's submit() builds it: worst case reserved = prompt + max_len positions.
    voice: requests with the same voice share their prompts' leading blocks (the prefix cache's
    hashes of the full blocks before the last prompt position); None: caching off."""
    req = SimpleNamespace(request_id=rid, prompt=FakePrompt(prompt_len), min_len=min_len,
                          inference_timesteps=timesteps)
    hashes = [] if voice is None else chain_hashes([voice.encode(), bytes([i])] for i in range((prompt_len - 1) // BLOCK))
    return RequestState(req=req, sink=None, max_len=max_len, seed_key=0, block_hashes=hashes,
                        blocks_reserved=s.blocks_needed(rid, prompt_len, max_len))


def add(s, *states):
    for st in states:
        s.add(st)
    return states


def prefill(s, states):
    for st in states:
        st.prompt_len = len(st.req.prompt)
        s.grow_to(st, st.prompt_len)
        s.cache_prompt(st)


def admit(s):
    admitted = s.admit()
    prefill(s, admitted)
    s.check_invariants()
    return [st.request_id for st in admitted]


def run_step(s, stop=lambda st: False):
    """One step without overlap: launch everyone who takes part, then deliver; returns
    {id: Delivery} and ends the finished ones, as the engine does."""
    batch = s.decode_candidates()
    for st in batch:
        s.grow_to(st, st.position + 1)
        st.launched += 1
    outs = {}
    for st in batch:
        out = outs[st.request_id] = s.on_patch(st, ("patch", st.request_id, st.step), stop(st))
        if out.finish:
            s.finish(st)
    s.check_invariants()
    return outs


def run_to_end(s, st, stop=lambda st: False):
    chunks, finish = [], None
    while finish is None:
        out = run_step(s, stop)[st.request_id]
        if out.patches is not None:
            chunks.append((out.first_step, len(out.patches)))
        finish = out.finish
    return chunks, finish


# -- admission

def test_admission_waits_for_blocks_and_returns_them_at_the_end():
    s = make(num_blocks=10)  # each request: 8 + 8 positions = 4 blocks of 4
    a, b, c = add(s, request(s, "a"), request(s, "b"), request(s, "c"))
    assert a.blocks_reserved == 4
    assert admit(s) == ["a", "b"]  # 2 left, c needs 4
    assert list(s.waiting) == [c] and s.blocks.reserved == 2 * (4 - 2)  # prefill took 2 of each 4
    assert admit(s) == []
    s.finish(a)
    assert a.slot is None and a.block_table == []
    assert admit(s) == ["c"]
    assert s.blocks.free + sum(len(st.block_table) for st in s.running.values()) == s.blocks.total


def test_admission_is_bounded_by_the_batch_size_and_slots_are_unique():
    s = make(num_blocks=1000, max_num_seqs=3)
    states = add(s, *[request(s, f"r{i}") for i in range(5)])
    assert admit(s) == ["r0", "r1", "r2"]
    assert sorted(st.slot for st in states[:3]) == [0, 1, 2]
    freed = states[1].slot
    s.finish(states[1])
    assert admit(s) == ["r3"] and states[3].slot == freed
    assert [st.request_id for st in s.waiting] == ["r4"]


def test_a_big_request_at_the_head_is_not_overtaken():
    s = make(num_blocks=10)
    a = request(s, "a", prompt_len=8, max_len=8)  # 4 blocks
    big = request(s, "big", prompt_len=16, max_len=16)  # 8 blocks
    small = request(s, "small", prompt_len=4, max_len=4)  # 2 blocks: would fit now
    add(s, a, big, small)
    assert admit(s) == ["a"]
    assert admit(s) == [] and list(s.waiting) == [big, small]  # FIFO: small waits behind big
    run_to_end(s, a)  # a ends by max_len and gives its blocks back
    assert admit(s) == ["big", "small"]


def test_a_request_that_can_never_fit_is_refused():
    s = make(num_blocks=4)
    assert s.blocks_needed("ok", 8, 8) == 4
    with pytest.raises(ValueError, match="needs 5 KV blocks .* the pool has only 4"):
        s.blocks_needed("big", 8, 9)


def test_waiting_bound():
    s = make(max_num_seqs=1, max_waiting=2)
    add(s, request(s, "a"))
    assert admit(s) == ["a"]  # running requests do not count
    add(s, request(s, "b"))
    s.check_room()
    with pytest.raises(EngineBusy, match="max_waiting_requests"):
        s.check_room(queued_elsewhere=1)  # one more handed over but not yet added
    add(s, request(s, "c"))
    with pytest.raises(EngineBusy, match="2 requests are already waiting"):
        s.check_room()
    s.cancel("b")
    s.check_room()
    assert make(max_waiting=None).check_room(queued_elsewhere=10 ** 6) is None


# -- prefix caching

def test_a_cached_prefix_starts_the_table_and_is_shared_read_only():
    s = make(num_blocks=12)
    a = request(s, "a", prompt_len=10, max_len=6, voice="v")  # 16 positions = 4 blocks; blocks 0-1 cacheable
    assert len(a.block_hashes) == 2  # block 2 holds the last prompt position: never cached
    add(s, a)
    assert admit(s) == ["a"] and a.cached_blocks == 0 and s.blocks.cached == 2
    b = request(s, "b", prompt_len=13, max_len=8, voice="v")  # same prefix, longer text: 3 cacheable blocks
    add(s, b)
    assert admit(s) == ["b"]
    assert b.cached_blocks == 2 and b.block_table[:2] == a.block_table[:2]
    assert set(b.block_table[2:]).isdisjoint(a.block_table)
    assert (s.prefix_hits, s.prefix_hit_blocks) == (1, 2) and s.blocks.cached == 3  # b added its third block
    # a pool of 12: a holds 3 and is promised 1 more, b holds the 2 shared + 2 of its own and is promised 2
    assert s.blocks.free - s.blocks.reserved == 12 - (3 + 1) - (2 + 2)
    run_to_end(s, a)
    assert [s.blocks.refcount(x) for x in b.block_table[:2]] == [1, 1]
    run_to_end(s, b)
    assert s.blocks.free == 12 and s.blocks.idle == 3 and s.blocks.reserved == 0
    c = request(s, "c", prompt_len=14, max_len=2, voice="v")  # after both ended: hits on idle blocks
    add(s, c)
    assert admit(s) == ["c"] and c.cached_blocks == 3 and (s.prefix_hits, s.prefix_hit_blocks) == (2, 5)
    d = request(s, "d", prompt_len=14, max_len=2, voice="w")  # another voice: no hit
    add(s, d)
    assert admit(s) == ["d"] and d.cached_blocks == 0 and s.prefix_hits == 2


def test_a_full_pool_admits_by_evicting_idle_cache_entries():
    s = make(num_blocks=8)
    for i, voice in enumerate("xy"):  # two voices' prompts cached, then idle: the pool is all cache
        st = request(s, f"r{i}", prompt_len=13, max_len=3, voice=voice)
        add(s, st)
        assert admit(s) == [st.request_id]
        run_to_end(s, st)
    assert s.blocks.free == 8 and s.blocks.idle == 6
    big = request(s, "big", prompt_len=20, max_len=12)  # needs the whole pool
    add(s, big)
    assert admit(s) == ["big"]  # promised all 8: the 2 free blocks first, then idle entries as it grows
    assert len(big.block_table) == 5 and s.blocks.evictions == 3 and s.blocks.cached == 3
    assert s.blocks.match(request(s, "probe", prompt_len=13, voice="x").block_hashes) == []  # x went first (LRU)
    run_to_end(s, big)
    assert s.blocks.evictions == 6 and s.blocks.cached == 0
    again = request(s, "again", prompt_len=13, max_len=3, voice="x")
    add(s, again)
    assert admit(s) == ["again"] and again.cached_blocks == 0  # evicted: computed afresh, cached again
    assert s.blocks.cached == 3


@pytest.mark.parametrize("seed", range(4))
def test_prefix_cached_requests_under_pool_pressure_all_finish(seed):
    """Random requests of three voices and no voice on a small pool, with the engine's overlap:
    the books balance after every operation, and every request ends (nothing deadlocks)."""
    rng = random.Random(seed)
    s = make(num_blocks=14, max_num_seqs=4, chunk_schedule=(2,))
    pending = [request(s, f"r{i}", prompt_len=rng.randint(1, 30), max_len=rng.randint(1, 20), min_len=40,
                       voice=rng.choice(["a", "b", "c", None])) for i in range(60)]
    pending = [st for st in pending if st.blocks_reserved <= 14]
    n, finished, in_flight = len(pending), set(), []
    for _ in range(5000):
        if pending and rng.random() < 0.3:
            s.add(pending.pop())
        admit(s)
        batch = s.decode_candidates()
        for st in batch:
            s.grow_to(st, st.position + 1)
            st.launched += 1
        previous, in_flight = in_flight, batch
        for st in previous:
            if s.is_running(st) and s.on_patch(st, None, False).finish:
                s.finish(st)
                finished.add(st.request_id)
        s.check_invariants()
        s.blocks.check()
        if not pending and not s.running and not s.waiting and not in_flight:
            break
    assert len(finished) == n
    assert s.prefix_hits > 0 and s.blocks.evictions > 0
    assert s.blocks.free == s.blocks.total and s.blocks.reserved == 0


# -- cancels

def test_cancel_a_waiting_request():
    s = make(max_num_seqs=1)
    a, b = add(s, request(s, "a"), request(s, "b"))
    admit(s)
    free, reserved = s.blocks.free, s.blocks.reserved
    assert s.cancel("b") is b
    assert not s.waiting and (s.blocks.free, s.blocks.reserved) == (free, reserved)
    assert s.cancel("b") is None and s.cancel("nobody") is None
    s.check_invariants()


def test_cancel_a_running_request_returns_its_slot_and_all_its_blocks():
    s = make(num_blocks=20)
    a, b = add(s, request(s, "a", max_len=30), request(s, "b", max_len=30))
    admit(s)
    for _ in range(5):
        run_step(s)
    assert len(a.block_table) == 4  # 8 prompt + 5 steps (+1 being written) = 14 positions
    assert s.cancel("a") is a
    assert a.slot is None and a.block_table == [] and a.pending == []
    assert not s.is_running(a) and s.decode_candidates() == [b]
    s.check_invariants()
    s.cancel("b")
    assert s.blocks.free == s.blocks.total and s.blocks.reserved == 0
    assert sorted(s._free_slots) == list(range(s.max_num_seqs))


# -- steps, chunks and finishing

def test_chunks_follow_the_schedule_and_the_last_repeats():
    s = make(chunk_schedule=(1, 4, 16))
    (st,) = add(s, request(s, "a", max_len=40))
    admit(s)
    chunks, finish = run_to_end(s, st)
    assert finish == "max_len" and st.step == 40
    assert chunks == [(0, 1), (1, 4), (5, 16), (21, 16), (37, 3)]  # the last is short: it ends the request
    assert not s.running and s.blocks.free == s.blocks.total


@pytest.mark.parametrize("playback", [True, False])
def test_fills_first_chunk_is_true_exactly_before_the_patch_that_completes_the_first_chunk(playback):
    """What the engine's audio fence goes by: the next patch completes the first chunk (of a
    client that plays as it receives); not before it, not after."""
    s = make(chunk_schedule=(3, 4))
    (st,) = add(s, request(s, "a", max_len=9))
    st.req.playback = playback
    admit(s)
    fills, sent = [], []
    while s.is_running(st):
        fills.append(s.fills_first_chunk(st))
        sent.append(run_step(s)["a"].patches is not None)
    assert sent == [False, False, True, False, False, False, True, False, True]
    assert fills == ([False, False, True] + [False] * 6 if playback else [False] * 9)


def test_first_audio_goes_first_only_where_nobody_already_playing_waits_for_it():
    """A step's first chunks have their audio before the next step (the engine's audio fence) when
    every running row of it fills its first chunk: a lone newcomer, a burst's first wave; not when a
    request already playing shares the step, nor for rows that have ended."""
    s = make(chunk_schedule=(1, 4))
    a, b = add(s, request(s, "a", max_len=9), request(s, "b", max_len=9))
    admit(s)
    assert s.first_audio_first([a]) and s.first_audio_first([a, b])
    run_step(s)
    (c,) = add(s, request(s, "c", max_len=9))
    admit(s)
    assert s.first_audio_first([c]) and not s.first_audio_first([a, b, c]) and not s.first_audio_first([a])
    s.finish(a)
    s.finish(b)
    assert s.first_audio_first([a, b, c])  # the ended rows do not count
    assert not s.first_audio_first([a, b]) and not s.first_audio_first([])


def test_chunk_patches_are_the_steps_in_order():
    s = make(chunk_schedule=(2,))
    (st,) = add(s, request(s, "a", max_len=5))
    admit(s)
    outs = [run_step(s)["a"] for _ in range(5)]
    assert [o.patches for o in outs] == [None, [("patch", "a", i) for i in (0, 1)], None,
                                        [("patch", "a", i) for i in (2, 3)], [("patch", "a", 4)]]
    assert [o.finish for o in outs] == [None] * 4 + ["max_len"]


def _timed_chunks(s, st, step_times):
    """Run `st` to its end, step i delivered at step_times(i) seconds: [(first step, patches, time
    sent)]. Chunks follow each other with no patch lost, repeated or reordered; the patches not
    yet sent are the newest ones, and none is left at the end."""
    chunks, i, sent = [], 0, 0
    while True:
        st.launched += 1
        s.grow_to(st, st.position)
        now = step_times(i)
        out = s.on_patch(st, ("patch", st.request_id, st.step), False, now)
        i += 1
        if out.patches is not None:
            assert out.first_step == sent
            assert [p[2] for p in out.patches] == list(range(sent, sent + len(out.patches)))
            sent += len(out.patches)
            assert [p[2] for p in st.pending] == list(range(sent, st.step))
            chunks.append((out.first_step, len(out.patches), round(now, 6)))
        if out.finish:
            assert sent == st.step and not st.pending
            s.finish(st)
            return chunks


def _margin_scheduler(margin):
    return Scheduler(BlockManager(64, first=1), BLOCK, 8, (1, 4, 16), loop_bucket, None,
                     playback_margin_s=margin, patch_seconds=0.16)


def test_playback_margin_sends_early_when_the_client_runs_low():
    """Slow steps (a 0.16 s patch every 0.1 s): after the first chunk the client would starve
    waiting for 4 patches, so its pending patches go out as soon as its buffer is below the margin,
    as the largest schedule size they fill (the VAE's graph lengths), until the stream is far
    enough ahead; then the schedule's sizes again."""
    s = _margin_scheduler(0.25)
    (st,) = add(s, request(s, "a", max_len=30))
    admit(s)
    chunks = _timed_chunks(s, st, lambda i: 0.1 * (i + 1))
    assert [c[:2] for c in chunks[:5]] == [(0, 1), (1, 1), (2, 1), (3, 1), (4, 1)]
    sent = 0
    for k, (first, n, t) in enumerate(chunks):
        buffered = sent * 0.16 - (t - chunks[0][2])
        sent += n
        if n < (1, 4, 16)[min(k, 2)] and first + n < 30:  # early: the client was below the margin
            assert buffered < 0.25 and n in (1, 4, 16), (first, n, t, buffered)
    assert sum(n for _, n, _ in chunks) == 30 and s.early_chunks > 0
    assert not s.running and s.blocks.free == s.blocks.total


def test_playback_margin_restarts_the_clock_of_a_client_that_ran_dry():
    """A 1 s gap (the server was busy) empties the client's buffer: it waits, then plays on from
    the next chunk. Counted from its first chunk it would look 1 s behind for good and get
    one-patch chunks to the end; counted from the restart it is ahead again after a few steps."""
    s = _margin_scheduler(0.1)
    (st,) = add(s, request(s, "a", max_len=40))
    admit(s)
    chunks = _timed_chunks(s, st, lambda i: 0.01 * (i + 1) + (1.0 if i >= 3 else 0.0))
    # the client ran dry in the gap: its 3 pending patches go at once (not a schedule size); then
    # the schedule (16s) again, not one-patch chunks to the end
    assert [n for _, n, _ in chunks] == [1, 3, 16, 16, 4] and s.early_chunks == 1


def test_a_client_that_ran_dry_is_never_left_waiting_for_patches_already_made():
    """A gap, then steps slower than real time (0.2 s per 0.16 s patch): the client keeps running
    dry. Early chunks of schedule sizes alone would send 1 of every 2-3 pending patches and hold
    the rest to the end; a client that is waiting gets every pending patch, so none waits more than
    the steps a 4-patch chunk takes to fill."""
    s = _margin_scheduler(0.1)
    (st,) = add(s, request(s, "a", max_len=40))
    admit(s)
    times = lambda i: 0.01 * (i + 1) if i < 3 else 1.0 + 0.01 * (i - 2) if i < 6 else 1.03 + 0.2 * (i - 5)  # noqa: E731
    chunks = _timed_chunks(s, st, times)
    sent_at = {}  # step -> the step at which its chunk went out
    step_of = {round(times(i), 6): i for i in range(40)}
    for first, n, t in chunks:
        sent_at.update({k: step_of[t] for k in range(first, first + n)})
    assert max(sent_at[k] - k for k in range(40)) <= 3, chunks


def test_playback_margin_leaves_fast_streams_on_the_schedule():
    """Fast steps keep the client ahead of a margin below the first chunk's audio: the chunks are
    exactly the schedule's, as with no margin."""
    s = _margin_scheduler(0.1)
    (st,) = add(s, request(s, "a", max_len=40))
    admit(s)
    assert [c[:2] for c in _timed_chunks(s, st, lambda i: 0.01 * (i + 1))] == [(0, 1), (1, 4), (5, 16), (21, 16),
                                                                             (37, 3)]
    assert s.early_chunks == 0


def test_no_early_chunks_where_nobody_plays_along():
    """`tts` answers once at the end (req.playback false): the schedule only, however slow."""
    s = _margin_scheduler(0.25)
    (st,) = add(s, request(s, "a", max_len=30))
    st.req.playback = False
    admit(s)
    assert [c[:2] for c in _timed_chunks(s, st, lambda i: 0.1 * (i + 1))] == [(0, 1), (1, 4), (5, 16), (21, 9)]
    assert s.early_chunks == 0


@pytest.mark.parametrize("min_len", [0, 1, 3])
def test_the_stop_head_counts_only_after_min_len(min_len):
    s = make()
    (st,) = add(s, request(s, "a", max_len=20, min_len=min_len))
    admit(s)
    chunks, finish = run_to_end(s, st, stop=lambda st: True)
    # Step i's stop counts when i > min_len: steps 0 .. min_len + 1 are delivered.
    assert finish == "stop" and st.step == min_len + 2
    assert sum(n for _, n in chunks) == st.step


def test_stop_at_the_last_allowed_step_reports_stop():
    s = make()
    (st,) = add(s, request(s, "a", max_len=4, min_len=0))
    admit(s)
    _, finish = run_to_end(s, st, stop=lambda st: st.step == 3)
    assert finish == "stop" and st.step == 4


def test_a_request_whose_last_step_is_in_flight_sits_out_the_next_launch():
    s = make()
    a, b = add(s, request(s, "a", max_len=2), request(s, "b", max_len=5))
    admit(s)
    for _ in range(2):  # launch twice, deliver nothing (steps in flight)
        for st in s.decode_candidates():
            s.grow_to(st, st.position + 1)
            st.launched += 1
    assert s.decode_candidates() == [b]


def test_launch_groups_by_loop_bucket_shortest_first():
    s = make()
    add(s, *[request(s, f"r{i}", timesteps=k) for i, k in enumerate([50, 4, 100, 10, 11])])
    admit(s)
    groups = s.launch_groups(s.decode_candidates())
    assert [[st.request_id for st in g] for g in groups] == [["r1", "r3"], ["r0", "r2", "r4"]]
    assert s.launch_groups([]) == []


# -- the books balance whatever happens

@pytest.mark.parametrize("seed", range(5))
def test_invariants_hold_over_random_operations(seed):
    """Random submits, cancels and steps, with the engine's overlap (step N delivered after
    N+1 is launched, results of ended requests dropped)."""
    rng = random.Random(seed)
    s = make(num_blocks=40, max_num_seqs=4, chunk_schedule=(1, 2, 4))
    in_flight, ended, n = [], {}, 0
    delivered: dict = {}
    for _ in range(400):
        op = rng.random()
        if op < 0.25:
            st = request(s, f"r{n}", prompt_len=rng.randint(1, 30), max_len=rng.randint(1, 20),
                         min_len=rng.randint(0, 5), timesteps=rng.choice([4, 10, 37]))
            n += 1
            s.add(st)
        elif op < 0.35:
            ids = [st.request_id for st in s.all_requests()]
            if ids:
                rid = rng.choice(ids)
                assert s.cancel(rid) is not None
                ended[rid] = "cancelled"
        else:
            admit(s)
            batch = s.decode_candidates()
            for st in batch:
                s.grow_to(st, st.position + 1)
                st.launched += 1
            previous, in_flight = in_flight, s.launch_groups(batch)
            for group in previous:
                for st in group:
                    if not s.is_running(st):
                        continue  # ended meanwhile: its row is dropped
                    out = s.on_patch(st, st.step, rng.random() < 0.1)
                    if out.patches is not None:
                        got = delivered.setdefault(st.request_id, [])
                        assert out.first_step == len(got) and out.patches == list(range(len(got), st.step))
                        got.extend(out.patches)
                    if out.finish:
                        s.finish(st)
                        ended[st.request_id] = out.finish
        s.check_invariants()
        for st in s.running.values():
            assert st.step <= st.launched <= st.max_len
            assert len(st.block_table) * BLOCK >= st.prompt_len + st.launched  # every launched step has its slot
    assert {"stop", "max_len", "cancelled"} <= set(ended.values())
    for st in s.all_requests():
        s.cancel(st.request_id)
    s.check_invariants()
    assert s.blocks.free == s.blocks.total and s.blocks.reserved == 0
    assert sorted(s._free_slots) == list(range(4)) and not s.running and not s.waiting


# -- no torch

def test_the_scheduler_module_imports_no_torch_and_nothing_of_the_package():
    assert_standalone_without_torch(scheduler_module,
                                    "s = m.Scheduler(None, 16, 2, (1, 2), lambda k: k); assert s.admit() == []")
