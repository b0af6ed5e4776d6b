"""The decoder engine on the CPU: batching must never change a request's output."""

import logging
import threading
import time

import pytest
import torch

from tests.conftest import sine_wave
from voxcpm_triton import VoxCPM2
from voxcpm_triton.engine import Engine, EngineConfig, EngineRequest, Finished, LatentChunk, RequestError
from voxcpm_triton.engine.kv_cache import PagedKVCache
from voxcpm_triton.engine.request import prompt_block_hashes
from voxcpm_triton.engine.step_runner import check_batch_buckets, check_timestep_buckets
from voxcpm_triton import checks
from voxcpm_triton.checks import TIMESTEPS_RANGE
from voxcpm_triton.model import split_k
from voxcpm_triton.model.local_modules import CfmSchedule, row_tables, zero_velocity_steps

TOL = 1e-4
TIMEOUT = 120


@pytest.fixture(scope="module")
def vox(checkpoint_dirs):
    return VoxCPM2.from_pretrained(checkpoint_dirs["real_shaped"], device="cpu", dtype="float32")


def prompt_for(vox, mode, text):
    rate = vox.encode_sample_rate
    kw = {}
    if mode in ("reference", "combined"):
        kw.update(reference_audio=sine_wave(0.5, rate, 170.0, 3), reference_sample_rate=rate)
    if mode in ("continuation", "combined"):
        kw.update(prompt_audio=sine_wave(0.3, rate, 260.0, 4), prompt_sample_rate=rate, prompt_text="Before that.")
    return vox.prepare_prompt(text, **kw)


def solo(vox, prompt, **gen):
    return vox.generate_latents(None, prompt=prompt, **gen)


def assert_same(got, want):
    assert got.shape == want.shape, (got.shape, want.shape)
    assert (got - want).abs().max().item() <= TOL


def wait_for(cond, timeout=TIMEOUT):
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, "timed out"
        time.sleep(0.01)


def test_single_request_matches_offline_api(vox):
    eng = Engine(vox, EngineConfig(num_blocks=64, block_size=4))
    try:
        prompt = prompt_for(vox, "zero_shot", "Hello there, engine.")
        h = eng.submit(EngineRequest("r1", prompt, seed=42))
        events = list(h.events(timeout=TIMEOUT))
        chunks = [e for e in events if isinstance(e, LatentChunk)]
        final = events[-1]
        assert isinstance(final, Finished) and final.reason in ("stop", "max_len") and final.error is None
        got = torch.cat([c.patches for c in chunks])
        assert_same(got, solo(vox, prompt, seed=42))
        assert final.steps == got.shape[0]
        # Chunk schedule: 1, 2, 4, then 8s (the last may be short).
        sizes = [c.patches.shape[0] for c in chunks]
        want = []
        while sum(want) < got.shape[0]:
            want.append([1, 2, 4, 8][min(len(want), 3)])
        want[-1] -= sum(want) - got.shape[0]
        assert sizes == want
        assert [c.first_step for c in chunks] == [sum(sizes[:i]) for i in range(len(sizes))]
    finally:
        eng.shutdown()


def test_playback_margin_sends_every_patch_at_once_and_changes_nothing_else(vox):
    """A margin no client can reach (1000 s): every patch goes out as soon as it is delivered, in
    order, and the latents are exactly the offline run's; the engine counts the early chunks."""
    eng = Engine(vox, EngineConfig(num_blocks=64, block_size=4, playback_margin_s=1000.0))
    try:
        prompt = prompt_for(vox, "zero_shot", "Hello there, engine.")
        h = eng.submit(EngineRequest("r1", prompt, seed=42, min_len=12, max_len=12))
        chunks = [e for e in h.events(timeout=TIMEOUT) if isinstance(e, LatentChunk)]
        assert [c.patches.shape[0] for c in chunks] == [1] * 12
        assert [c.first_step for c in chunks] == list(range(12))
        assert_same(torch.cat([c.patches for c in chunks]), solo(vox, prompt, seed=42, min_len=12, max_len=12))
        assert eng.stats()["early_chunks"] == 10  # the first and the last go out on their own account
    finally:
        eng.shutdown()


class _FirstAudio:
    """A recording stand-in for `StreamAudio`'s mark / fence: what was delivered and launched when
    the engine asked."""

    def __init__(self, launched=True):
        self.eng, self.seen, self.launched = None, None, launched
        self.fences = []  # (runner launches so far, request ids whose chunks were delivered so far)

    def mark(self):
        return len(self.seen)

    def fence(self, mark, timeout):
        assert 0 < timeout <= 0.1 and mark <= len(self.seen)
        self.fences.append((self.eng.stats()["launches"], sorted(rid for rid, *_ in self.seen)))
        return self.launched, None  # the CPU: nothing to wait on


def _chunks_and_fences(vox, first_audio, specs, then=None):
    """Requests {rid: (max_len, playback)} submitted together (one first step) -> their chunks as
    the sinks got them [(rid, patches, runner launches so far)], and the engine's stats. then(rid,
    eng): called on the engine thread at each first chunk (to submit more)."""
    eng, seen, ended = None, [], threading.Semaphore(0)
    if first_audio is not None:
        first_audio.seen = seen
    eng = Engine(vox, EngineConfig(num_blocks=128, block_size=4), first_audio=first_audio)
    if first_audio is not None:
        first_audio.eng = eng
    prompt = prompt_for(vox, "zero_shot", "First audio first.")

    def submit(rid, max_len, playback):
        def sink(ev):
            if isinstance(ev, LatentChunk):
                seen.append((rid, ev.patches, eng.stats()["launches"]))
                if then is not None and ev.first_step == 0:
                    then(rid, submit)
            else:
                assert ev.error is None
                ended.release()

        eng.submit(EngineRequest(rid, prompt, seed=5, min_len=max_len, max_len=max_len, playback=playback), sink=sink)

    try:
        with eng._lock:  # all in the inbox before the engine thread takes any
            for rid, (max_len, playback) in specs.items():
                submit(rid, max_len, playback)
        total = len(specs) + (0 if then is None else 1)
        for _ in range(total):
            assert ended.acquire(timeout=TIMEOUT)
        stats = eng.stats()
    finally:
        eng.shutdown()
    return seen, stats, prompt


def test_first_audio_hands_out_a_first_chunk_before_the_next_step_is_launched(vox):
    """Steps are pipelined: the next is launched before the last one's patches are handed out, so
    a first chunk (and its audio, decoded elsewhere) would queue behind a whole step. With
    `first_audio` (decoder parameter first_audio_priority) the step that fills a lone streaming
    request's first chunk is handed out first, the fence is asked once, and only then is the next
    step launched; later chunks stay pipelined, a request nobody plays as it comes (playback
    false) is not fenced, and the latents are the same."""
    def run(first_audio, playback=True):
        seen, stats, prompt = _chunks_and_fences(vox, first_audio, {"f": (6, playback)})
        return [(len(p), n) for _, p, n in seen], torch.cat([p for _, p, _ in seen]), stats, prompt

    plain, want, stats, prompt = run(None)
    assert plain == [(1, 2), (2, 4), (3, 6)]  # one launch ahead of each chunk (schedule 1, 2, 4)
    assert stats["first_audio_fences"] == stats["first_audio_fence_misses"] == 0
    fa = _FirstAudio()
    fenced, got, stats, _ = run(fa)
    assert fenced == [(1, 1), (2, 4), (3, 6)]
    assert fa.fences == [(1, ["f"])]  # once: after the first step, before the second
    assert (stats["first_audio_fences"], stats["first_audio_fence_misses"]) == (1, 0)
    assert torch.equal(got, want)
    assert_same(got, solo(vox, prompt, seed=5, min_len=6, max_len=6))
    fa = _FirstAudio()
    unplayed, got, _, _ = run(fa, playback=False)
    assert fa.fences == [] and unplayed == plain and torch.equal(got, want)
    fa = _FirstAudio(launched=False)  # the audio thread busy, or past the wait: counted as a miss
    _, got, stats, _ = run(fa)
    assert len(fa.fences) == 1 and (stats["first_audio_fences"], stats["first_audio_fence_misses"]) == (0, 1)
    assert torch.equal(got, want)


def test_first_audio_fences_a_first_wave_once_and_never_holds_back_a_playing_request(vox):
    """Two requests starting together: their first step is fenced once, with both first chunks
    handed out and no second step launched. A newcomer that joins a request already playing is
    not fenced: the playing request's steps go on pipelined."""
    fa = _FirstAudio()
    seen, stats, _ = _chunks_and_fences(vox, fa, {"a": (4, True), "b": (4, True)})
    assert fa.fences == [(1, ["a", "b"])] and stats["first_audio_fences"] == 1
    assert [(rid, len(p), n) for rid, p, n in seen][:2] in ([("a", 1, 1), ("b", 1, 1)], [("b", 1, 1), ("a", 1, 1)])

    fa = _FirstAudio()
    joined = []

    def join_once(rid, submit):  # at the playing request's first chunk: a newcomer arrives
        if rid == "playing":
            joined.append(True)
            submit("newcomer", 4, True)

    seen, stats, _ = _chunks_and_fences(vox, fa, {"playing": (16, True)}, then=join_once)
    # one fence: "playing"'s first step; the newcomer's first step, shared with it, is not fenced
    assert joined and fa.fences == [(1, ["playing"])] and stats["first_audio_fences"] == 1
    assert sum(len(p) for rid, p, _ in seen if rid == "newcomer") == 4


def test_start_up_warm_up_prefills_touch_only_the_scratch_block(vox, monkeypatch):
    """The GPU start-up's throwaway prefills (`Engine.WARM_UP_PACKS`: one prompt, packs of two and
    three, lengths that are and are not a block; then a pack past `split_k.MAX_TOKENS` rows, whose
    K/V wrap round the scratch block) run here too: they write no other block and take none, and a
    request after them equals its offline run."""
    eng = Engine(vox, EngineConfig(num_blocks=64, block_size=4))
    rows, real = [], eng.model.prefill
    monkeypatch.setattr(eng.model, "prefill", lambda tok, *a, **k: rows.append(tok.shape[1]) or real(tok, *a, **k))
    pools = (eng.kv.base_k, eng.kv.base_v, eng.kv.res_k, eng.kv.res_v)
    scratch = PagedKVCache.SCRATCH_BLOCK
    for pool in pools:
        pool.fill_(7.0)
    try:
        with torch.no_grad():
            eng._warm_up_prefill()
        monkeypatch.undo()
        assert max(rows) == split_k.MAX_TOKENS + 1  # the compiled layers' unsplit branch
        for pool in pools:  # [layers, blocks, block_size, heads, dim]: only the scratch block written
            others = torch.cat([pool[:, :scratch], pool[:, scratch + 1:]], dim=1)
            assert (others == 7.0).all() and (pool[:, scratch] != 7.0).any()
        assert eng.kv.allocator.free == eng.kv.allocator.total
        prompt = prompt_for(vox, "zero_shot", "After the warm-up.")
        got, fin = eng.submit(EngineRequest("w", prompt, seed=3, min_len=4, max_len=4)).result(timeout=TIMEOUT)
        assert fin.error is None
        assert_same(got, solo(vox, prompt, seed=3, min_len=4, max_len=4))
    finally:
        eng.shutdown()


def test_the_warm_up_pack_past_the_split_bound_keeps_each_prompt_within_the_model_length(vox, monkeypatch):
    """Where a prompt can be no longer than MAX_TOKENS, the start-up still passes the bound with a pack
    of several (an eager pack's rows can), each no longer than the model's limit."""
    eng = Engine(vox, EngineConfig(num_blocks=64, block_size=4))
    seen, real = [], eng.model.prefill
    monkeypatch.setattr(eng.model, "prefill", lambda tok, zeros, mask, feats, positions, *a, **k: seen.append(
        (tok.shape[1], int(positions.max()) + 1)) or real(tok, zeros, mask, feats, positions, *a, **k))
    eng.max_positions = 700
    try:
        with torch.no_grad():
            eng._warm_up_prefill()
    finally:
        eng.shutdown()
    assert seen[-1] == (split_k.MAX_TOKENS + 1, 700)


def test_staggered_mixed_requests_each_equal_their_solo_run(vox):
    modes = ["zero_shot", "reference", "continuation", "combined"]
    texts = ["One.", "A somewhat longer sentence for the engine to chew on.", "你好世界", "Three words here.",
             "(soft voice)Voice design text.", "Numbers 123 and 456."]
    specs = []
    for i in range(12):
        specs.append(dict(rid=f"req{i}", prompt=prompt_for(vox, modes[i % 4], texts[i % len(texts)]),
                          gen=dict(seed=1000 + i, min_len=[2, 5, 0][i % 3], max_len=[None, 9, 30, 17][i % 4],
                                   cfg_value=[2.0, 1.5, 3.0][i % 3], inference_timesteps=[10, 4, 7][i % 3])))
    eng = Engine(vox, EngineConfig(num_blocks=400, block_size=8, max_num_seqs=8))
    try:
        handles = {}
        for s in specs:
            handles[s["rid"]] = eng.submit(EngineRequest(s["rid"], s["prompt"], **s["gen"]))
            time.sleep(0.03)  # join at different step boundaries
        results = {rid: h.result(timeout=TIMEOUT) for rid, h in handles.items()}
        assert max(eng.stats()["batch_sizes"]) > 1, "requests never shared a step"
    finally:
        eng.shutdown()
    for s in specs:
        got, fin = results[s["rid"]]
        assert fin.error is None
        assert_same(got, solo(vox, s["prompt"], **s["gen"]))


def test_a_stopped_requests_slot_and_blocks_serve_the_next_while_its_extra_step_is_in_flight(checkpoint_dirs):
    """Here the stop head always says stop, so each request ends right after min_len with its
    next step already launched (the engine reads step N after launching N+1). With two slots,
    a waiting request takes over the slot and the blocks at once; stream order must keep the
    dropped step's writes from reaching it."""
    vox = VoxCPM2.from_pretrained(checkpoint_dirs["real_shaped"], device="cpu", dtype="float32")
    m = vox.model
    with torch.no_grad():
        m.stop_proj.weight.zero_()
        m.stop_proj.bias.fill_(1.0)
        m.stop_head.weight.zero_()
        m.stop_head.weight[1] = 1.0
    prompt = prompt_for(vox, "zero_shot", "Stop early.")
    min_lens = [1, 4, 0, 6, 2, 3]
    eng = Engine(vox, EngineConfig(num_blocks=-(-(len(prompt) + 24) // 4) * 2, block_size=4, max_num_seqs=2))
    events = [[] for _ in min_lens]
    try:
        for i, n in enumerate(min_lens):
            eng.submit(EngineRequest(f"s{i}", prompt, seed=i, min_len=n, max_len=20), sink=events[i].append)
        wait_for(lambda: all(ev and isinstance(ev[-1], Finished) for ev in events))
        wait_for(lambda: eng.stats()["free_blocks"] == eng.stats()["total_blocks"])
    finally:
        eng.shutdown()  # joins the engine thread: nothing more can arrive
    stats = eng.stats()
    for i, (n, evs) in enumerate(zip(min_lens, events)):
        fin = evs[-1]
        assert [isinstance(e, Finished) for e in evs].count(True) == 1, evs  # nothing after the end
        got = torch.cat([e.patches for e in evs[:-1]])
        assert fin.reason == "stop" and fin.steps == n + 2 == got.shape[0], (fin, got.shape)
        assert_same(got, solo(vox, prompt, seed=i, min_len=n, max_len=20))
    assert stats["finished"] == len(min_lens)
    rows_run = sum(size * count for size, count in stats["batch_sizes"].items())
    # At most one dropped step per request (none when an admission collects the step first);
    # the last requests, with nobody left to admit, always run one.
    assert sum(n + 2 for n in min_lens) < rows_run <= sum(n + 3 for n in min_lens)


def test_small_pool_queues_and_completes_everyone(vox):
    prompt = prompt_for(vox, "zero_shot", "Pool pressure test.")
    need = -(-(len(prompt) + 12) // 4)  # blocks of 4 for prompt + 12 steps
    # Without the prefix cache (the same prompt ten times would share blocks: see the prefix-cache tests).
    eng = Engine(vox, EngineConfig(num_blocks=3 * need, block_size=4, max_num_seqs=16,
                                   enable_prefix_caching=False))
    try:
        total = eng.stats()["free_blocks"]
        peak = []
        handles = [eng.submit(EngineRequest(f"p{i}", prompt, seed=i, min_len=12, max_len=12)) for i in range(10)]
        poll = threading.Thread(target=lambda: [peak.append(eng.stats()["running"]) or time.sleep(0.005)
                                                for _ in range(400)], daemon=True)
        poll.start()
        for h in handles:
            lat, fin = h.result(timeout=TIMEOUT)
            assert fin.reason == "max_len" and lat.shape[0] == 12
        assert max(peak) <= 3
        wait_for(lambda: eng.stats()["free_blocks"] == total)
    finally:
        eng.shutdown()


def test_request_that_can_never_fit_is_refused(vox):
    eng = Engine(vox, EngineConfig(num_blocks=4, block_size=4))
    try:
        with pytest.raises(RequestError, match="KV blocks"):
            eng.submit(EngineRequest("big", prompt_for(vox, "zero_shot", "Too long."), max_len=100))
        with pytest.raises(RequestError, match="cfg_value"):
            eng.submit(EngineRequest("bad", prompt_for(vox, "zero_shot", "x"), cfg_value=float("nan")))
        assert eng.stats()["in_flight_ids"] == 0
    finally:
        eng.shutdown()


def test_a_long_text_without_max_len_gets_the_room_the_context_leaves(vox):
    """The default limit (6 patches a token + 10, at most 4096) is cut to what the model's context leaves
    after the prompt, not refused as if the caller had asked for more; a prompt that fills the context is
    refused naming the text and prompt."""
    prompt = prompt_for(vox, "zero_shot", "Many words here. " * 200)
    room = vox.cfg.max_length - len(prompt)
    assert 0 < room < checks.default_max_len(prompt.n_target_tokens), "the text must outgrow the context"
    assert checks.default_max_len(prompt.n_target_tokens, room) == room
    eng = Engine(vox, EngineConfig(num_blocks=vox.cfg.max_length // 4 + 8, block_size=4))
    try:
        events = []
        eng.submit(EngineRequest("long", prompt, seed=1), sink=events.append)
        assert eng.cancel("long")
        wait_for(lambda: any(isinstance(e, Finished) for e in events))
        full = vox.prepare_prompt("Many words here. " * 200)
        full.tokens = torch.cat([full.tokens, full.tokens.new_zeros(room)])  # exactly the context's length
        with pytest.raises(RequestError, match=r"take 4096 of the model's 4096 positions, leaving none to generate"):
            eng.submit(EngineRequest("full", full))
        with pytest.raises(RequestError, match=rf"leaving {room}, fewer than min_len {room + 1}, to generate"):
            eng.submit(EngineRequest("min", prompt, min_len=room + 1))
        assert eng.stats()["in_flight_ids"] == 0
    finally:
        eng.shutdown()


def test_cancel_all_ends_running_and_waiting_requests_with_its_error(vox):
    """What the decoder does at the server's stop deadline: every request, running or still
    queued for a row, ends with the error, once; the KV blocks all come back."""
    eng = Engine(vox, EngineConfig(num_blocks=200, block_size=4, max_num_seqs=1))
    try:
        total = eng.stats()["free_blocks"]
        prompt = prompt_for(vox, "zero_shot", "Stop me.")
        running = eng.submit(EngineRequest("running", prompt, seed=1, min_len=500, max_len=500))
        queued = eng.submit(EngineRequest("queued", prompt, seed=2, min_len=5, max_len=5))
        wait_for(lambda: eng.stats()["running"] == 1 and eng.stats()["waiting"] == 1)
        assert eng.cancel_all("[busy] the server is shutting down") == 2
        for fut in (running, queued):
            _, fin = fut.result(timeout=TIMEOUT)
            assert fin.reason == "cancelled" and fin.error == "[busy] the server is shutting down"
        wait_for(lambda: eng.stats()["free_blocks"] == total and eng.stats()["in_flight_ids"] == 0)
        assert eng.cancel_all("[busy] the server is shutting down") == 0  # nothing left to end
    finally:
        eng.shutdown()


def test_cancel_frees_blocks_and_fault_ends_only_its_request(vox):
    def hook(st, stage):
        if st.request_id == "faulty" and stage == "step" and st.launched == 3:
            raise RuntimeError("injected fault")

    eng = Engine(vox, EngineConfig(num_blocks=200, block_size=4), fault_hook=hook)
    try:
        total = eng.stats()["free_blocks"]
        prompt = prompt_for(vox, "zero_shot", "Cancel me please.")
        # Cancel from the engine's own output path, right after the chunk that ends at step 3:
        # the request must end at the next step boundary, with no further patch delivered (the
        # step already in flight for it is dropped).
        events, cancelled_after = [], []

        def sink(ev):
            events.append(ev)
            if isinstance(ev, LatentChunk) and not cancelled_after and ev.first_step + len(ev.patches) >= 3:
                cancelled_after.append(ev.first_step + len(ev.patches))
                eng.cancel("long")

        eng.submit(EngineRequest("long", prompt, seed=1, min_len=300, max_len=300), sink=sink)
        faulty = eng.submit(EngineRequest("faulty", prompt, seed=2, min_len=20, max_len=20))
        healthy = eng.submit(EngineRequest("healthy", prompt, seed=3, min_len=20, max_len=20))
        wait_for(lambda: events and isinstance(events[-1], Finished))
        fin = events[-1]
        assert fin.reason == "cancelled" and fin.steps == cancelled_after[0] == 3
        f_lat, f_fin = faulty.result(timeout=TIMEOUT)
        assert f_fin.reason == "error" and "injected fault" in f_fin.error
        h_lat, h_fin = healthy.result(timeout=TIMEOUT)
        assert h_fin.reason == "max_len" and h_fin.error is None
        assert_same(h_lat, solo(vox, prompt, seed=3, min_len=20, max_len=20))
        wait_for(lambda: eng.stats()["free_blocks"] == total)
    finally:
        eng.shutdown()


def test_broken_sink_ends_only_that_request(vox):
    eng = Engine(vox, EngineConfig(num_blocks=100, block_size=4))
    try:
        prompt = prompt_for(vox, "zero_shot", "Sink test.")

        def bad_sink(ev):
            raise ConnectionError("client went away")

        eng.submit(EngineRequest("gone", prompt, seed=1, min_len=10, max_len=10), sink=bad_sink)
        ok = eng.submit(EngineRequest("ok", prompt, seed=2, min_len=10, max_len=10))
        lat, fin = ok.result(timeout=TIMEOUT)
        assert fin.error is None and lat.shape[0] == 10
        wait_for(lambda: eng.stats()["in_flight_ids"] == 0 and eng.stats()["free_blocks"] == 100)
    finally:
        eng.shutdown()


def test_many_short_requests_leave_no_state(vox):
    eng = Engine(vox, EngineConfig(num_blocks=64, block_size=4, max_num_seqs=16))
    try:
        prompt = prompt_for(vox, "zero_shot", "Hi.")
        for wave in range(10):
            hs = [eng.submit(EngineRequest(f"s{wave}-{i}", prompt, seed=i, min_len=1, max_len=3)) for i in range(20)]
            for h in hs:
                _, fin = h.result(timeout=TIMEOUT)
                assert fin.error is None
        wait_for(lambda: eng.stats()["in_flight_ids"] == 0)
        s = eng.stats()
        assert s["finished"] == 200 and s["running"] == 0 and s["waiting"] == 0
        assert s["free_blocks"] == s["total_blocks"] and eng.kv.allocator.reserved == 0
        assert not eng.running and not eng.waiting and not eng._ids and not eng._cancels
    finally:
        eng.shutdown()


def test_shutdown_fails_in_flight_requests(vox):
    eng = Engine(vox, EngineConfig(num_blocks=200, block_size=4))
    prompt = prompt_for(vox, "zero_shot", "Shutdown test.")
    h = eng.submit(EngineRequest("x", prompt, seed=1, min_len=500, max_len=500))
    next(h.events(timeout=TIMEOUT))
    eng.shutdown()
    fin = [e for e in h.events(timeout=TIMEOUT)][-1]
    assert fin.reason == "error" and "shut down" in fin.error
    assert not eng._thread.is_alive()


def test_a_batched_step_failing_for_one_request_is_rerun_without_it(vox):
    eng = Engine(vox, EngineConfig(num_blocks=200, block_size=4))
    orig = eng._launch_decode

    def flaky(batch, *args):  # the model step itself raises whenever "bad" is in the batch at step 2
        if any(st.request_id == "bad" and st.launched == 2 for st in batch):
            raise RuntimeError("kernel exploded")
        return orig(batch, *args)

    eng._launch_decode = flaky
    try:
        prompt = prompt_for(vox, "zero_shot", "Isolation test.")
        bad = eng.submit(EngineRequest("bad", prompt, seed=1, min_len=8, max_len=8))
        good = eng.submit(EngineRequest("good", prompt, seed=2, min_len=8, max_len=8))
        _, b_fin = bad.result(timeout=TIMEOUT)
        g_lat, g_fin = good.result(timeout=TIMEOUT)
        assert b_fin.reason == "error" and "kernel exploded" in b_fin.error
        assert g_fin.error is None
        assert_same(g_lat, solo(vox, prompt, seed=2, min_len=8, max_len=8))
        wait_for(lambda: eng.stats()["free_blocks"] == 200)
    finally:
        eng.shutdown()


def test_a_step_that_fails_only_as_a_batch_is_said_in_the_log(vox, caplog):
    """Reruns one request at a time that all pass would otherwise hide a batch-only failure (every
    such step then runs row by row, slower, with nothing said). One that lasts is said once a minute,
    not at every step."""
    eng = Engine(vox, EngineConfig(num_blocks=200, block_size=4))
    orig = eng._launch_decode

    def batch_only(batch, *args):
        if len(batch) > 1:  # every step the two share
            raise RuntimeError("batched kernel exploded")
        return orig(batch, *args)

    eng._launch_decode = batch_only
    try:
        prompt = prompt_for(vox, "zero_shot", "Isolation test.")
        with caplog.at_level(logging.WARNING, logger="voxcpm_triton.engine"):
            hs = [eng.submit(EngineRequest(f"r{i}", prompt, seed=i, min_len=6, max_len=6)) for i in range(2)]
            for h in hs:
                assert h.result(timeout=TIMEOUT)[1].error is None
    finally:
        eng.shutdown()
    said = [r for r in caplog.records if "batched kernel exploded" in str(r.exc_info and r.exc_info[1])]
    assert said and "failed for a batch of 2" in said[0].getMessage(), [r.getMessage() for r in caplog.records]
    assert sorted(r.getMessage().split(" failed")[0] for r in said) == ["decode launch", "decode step"], \
        [r.getMessage() for r in said]


@pytest.mark.parametrize("mode", ["zero_shot", "continuation"])
def test_padded_single_prompt_prefill_matches_offline_api(vox, mode):
    """The GPU's prefill graphs run a lone prompt padded to a length bucket; on the CPU the same
    padded body runs eagerly, so the padding (at the end, causal, K/V into the scratch block)
    is checked here against the offline API."""
    from voxcpm_triton.engine.prefill_runner import PrefillGraphs

    eng = Engine(vox, EngineConfig(num_blocks=64, block_size=4))
    try:
        eng.prefill_graphs = PrefillGraphs(eng.model, eng.kv, "cpu", buckets=(8, 128))
        prompt = prompt_for(vox, mode, "Padding must not leak into the prompt.")
        assert 8 < len(prompt) < 128
        h = eng.submit(EngineRequest("padded", prompt, seed=7, max_len=12))
        events = list(h.events(timeout=TIMEOUT))
        assert isinstance(events[-1], Finished) and events[-1].error is None, events[-1]
        got = torch.cat([e.patches for e in events if isinstance(e, LatentChunk)])
        assert_same(got, solo(vox, prompt, seed=7, max_len=12))
    finally:
        eng.shutdown()


# -- CFM loop buckets: a fixed set of loop lengths, one launch per bucket in each engine step

def test_a_row_padded_to_its_loop_bucket_gives_its_own_result(vox):
    """A row of k timesteps run in a wider loop (steps past k inactive with dt = 0, and the loop
    starting at the bucket's first velocity step) equals a loop of exactly k, to fp32 rounding: the
    loop's time MLP is one product over all its steps (`CFMSolver.time_embeddings`), and a BLAS may
    round a row differently at another row count (the Euler steps themselves are the same)."""
    eng = Engine(vox, EngineConfig(num_blocks=8, block_size=4))
    eng.shutdown()
    r, dec = eng.runner, vox.model.feat_decoder
    g = torch.Generator().manual_seed(0)
    D, P, h = vox.feat_dim, vox.patch_size, dec.estimator.hidden
    z, cond = torch.randn(1, D, P, generator=g), torch.randn(1, D, P, generator=g)
    mu = torch.randn(1, 2 * h, generator=g)
    # Each bucket's edges, and rows with more zero-velocity steps than their bucket's graph skips.
    for k in (1, 2, 3, 5, 9, 10, 11, 13, 17, 25, 33, 37, 49, 50, 51, 77, 99, 100):
        loop = r.loop_bucket(k)
        assert zero_velocity_steps(k) >= r.loop_first[loop]
        with torch.no_grad():
            want = dec.sample(z, mu, cond, CfmSchedule([k], torch.float32, "cpu"), 2.0)
            t, dt, active = (x[None] for x in row_tables(k, loop, torch.float32))
            got = dec.sample(z, mu, cond, CfmSchedule.from_tables(t, dt, active, r.loop_first[loop], loop), 2.0)
        assert (got - want).abs().max().item() <= 1e-6 * want.abs().max().item(), k


def test_every_timesteps_value_maps_to_a_start_up_graph_key(vox):
    eng = Engine(vox, EngineConfig(num_blocks=8, block_size=4, max_num_seqs=64))
    eng.shutdown()
    r = eng.runner
    keys = r.graph_keys()
    assert r.buckets == [1, 2, 4, 8, 16, 24, 32, 48, 64]
    assert r.loop_buckets == (4, 8, 10, 12, 16, 24, 32, 50, 100)
    assert len(keys) == len(r.buckets) * len(r.loop_buckets) == 81
    for k in range(TIMESTEPS_RANGE[0], TIMESTEPS_RANGE[1] + 1):
        loop = r.loop_bucket(k)
        assert loop >= k and not any(k <= x < loop for x in r.loop_buckets), k  # the smallest that fits
        assert zero_velocity_steps(k) >= r.loop_first[loop], k  # the graph skips no velocity step of k
        for b in range(1, 65):
            assert r.graph_key(b, k) in keys, (b, k)
    assert r.loop_bucket(10) == 10  # the default timesteps run unpadded
    assert not r.graphs and r.captures == 0 and eng.capture_summary == {"graphs": 0, "seconds": 0.0}  # CPU: eager


def test_mixed_timesteps_in_one_batch_each_equal_their_solo_run(vox):
    """One admission, so all five share every step, each in its own loop bucket (3 -> 4, 10,
    11 -> 12, 37 -> 50, 100): each request's latents are its solo run's. Each engine step launches one
    step per loop bucket, with the previous step's launches still uncollected."""
    prompt = prompt_for(vox, "zero_shot", "Timesteps side by side.")
    specs = {f"t{k}": dict(seed=k, min_len=5, max_len=5, inference_timesteps=k) for k in (3, 10, 11, 37, 100)}
    eng = Engine(vox, EngineConfig(num_blocks=100, block_size=4, max_num_seqs=8))
    try:
        with eng._lock:  # one admission takes them all (the engine's condition lock is re-entrant)
            handles = {rid: eng.submit(EngineRequest(rid, prompt, **gen)) for rid, gen in specs.items()}
        results = {rid: h.result(timeout=TIMEOUT) for rid, h in handles.items()}
        wait_for(lambda: eng.stats()["in_flight_ids"] == 0)
    finally:
        eng.shutdown()
    s = eng.stats()
    assert s["launches"] == 5 * s["steps"] and s["batch_sizes"] == {1: s["launches"]}
    r = eng.runner
    assert len(r._host_free) == len(r.host) >= 10  # every launch collected; two steps' launches were in flight
    for rid, gen in specs.items():
        got, fin = results[rid]
        assert fin.error is None and fin.reason == "max_len"
        assert_same(got, solo(vox, prompt, **gen))


def test_a_slow_requests_timesteps_run_only_in_its_own_launch(vox):
    """One request at 100 timesteps beside three at 10: each engine step launches the 10-step
    group and the 100-step request apart, so the 10-step rows never run a 100-step loop."""
    prompt = prompt_for(vox, "zero_shot", "Fast and slow.")
    specs = {"slow": 100, "a": 10, "b": 10, "c": 10}
    eng = Engine(vox, EngineConfig(num_blocks=100, block_size=4, max_num_seqs=8))
    launches = []  # (engine step, loop run, timesteps of its rows)
    launch = eng.runner.launch

    def spy(rows, bucket=None, plain=False):
        step = launch(rows, bucket, plain)
        launches.append((eng._stats["steps"], step.loop, sorted(r[8] for r in rows)))  # r[8]: timesteps
        return step

    eng.runner.launch = spy
    try:
        with eng._lock:
            handles = [eng.submit(EngineRequest(rid, prompt, seed=i, min_len=4, max_len=4, inference_timesteps=k))
                       for i, (rid, k) in enumerate(specs.items())]
        for h in handles:
            _, fin = h.result(timeout=TIMEOUT)
            assert fin.error is None
    finally:
        eng.shutdown()
    by_step: dict = {}
    for step, loop, ks in launches:
        by_step.setdefault(step, []).append((loop, ks))
    assert len(by_step) == 4 and len(launches) == 8 == eng.stats()["launches"]
    for step, group in by_step.items():
        assert sorted(group) == [(10, [10, 10, 10]), (100, [100])], (step, group)


@pytest.mark.parametrize("bad", [(10, 4, 100), (4, 10, 10, 100), (0, 10, 100), (4, 10.0, 100), (4, True, 100),
                                 (4, 10, 50), (4, 10, 200), (), "4,100", 100])
def test_bad_timestep_buckets_are_refused(bad):
    with pytest.raises(ValueError, match="timestep_buckets"):
        EngineConfig(timestep_buckets=bad)
    with pytest.raises(ValueError, match="timestep_buckets"):
        check_timestep_buckets(bad)


@pytest.mark.parametrize("bad", [(4, 2), (2, 2, 4), (0, 2), (1, 2.0), (True, 2), (), "1,2", 8])
def test_bad_batch_buckets_are_refused(bad):
    with pytest.raises(ValueError, match="batch_buckets"):
        EngineConfig(batch_buckets=bad)
    with pytest.raises(ValueError, match="batch_buckets"):
        check_batch_buckets(bad)


def test_batch_buckets_below_max_num_seqs_and_it(vox):
    """Buckets past max_num_seqs are dropped and max_num_seqs always has one; a step of b rows
    runs in the smallest bucket that holds it (the eager CPU runner runs exactly b, so this reads
    the graph side's lookup)."""
    eng = Engine(vox, EngineConfig(num_blocks=8, block_size=4, max_num_seqs=6, batch_buckets=(2, 4, 8),
                                   timestep_buckets=(10, TIMESTEPS_RANGE[1])))
    eng.shutdown()
    r = eng.runner
    assert r.buckets == [2, 4, 6]
    assert [r.batch_bucket(b) for b in (1, 2, 3, 5, 6)] == [2, 2, 4, 6, 6]
    assert r.graph_keys() == {(b, loop) for b in (2, 4, 6) for loop in (10, 100)}
    assert EngineConfig().batch_buckets[0] == 1  # a lone request is not padded by default
    from voxcpm_triton.serving.parameters import PARAMETERS

    served = next(p.default for p in PARAMETERS if (p.model, p.name) == ("decoder", "batch_buckets"))
    assert tuple(int(b) for b in served.split(",")) == EngineConfig().batch_buckets  # the server's default too


def test_custom_timestep_buckets(vox):
    cfg = EngineConfig(num_blocks=8, block_size=4, max_num_seqs=4, timestep_buckets=[10, TIMESTEPS_RANGE[1]])
    assert cfg.timestep_buckets == (10, 100)
    eng = Engine(vox, cfg)
    eng.shutdown()
    r = eng.runner
    assert r.loop_buckets == (10, 100) and r.loop_first == {10: 1, 100: zero_velocity_steps(11)}
    assert r.graph_keys() == {(b, loop) for b in (1, 2, 4) for loop in (10, 100)}
    assert [r.loop_bucket(k) for k in (1, 10, 11, 100)] == [10, 10, 100, 100]


def test_waiting_queue_bound_refuses_as_busy_and_a_crashed_loop_reports_why(vox):
    from voxcpm_triton.engine import EngineBusy

    eng = Engine(vox, EngineConfig(num_blocks=256, block_size=4, max_num_seqs=1, max_waiting=1))
    try:
        prompt = prompt_for(vox, "zero_shot", "Queue me.")
        first = eng.submit(EngineRequest("a", prompt, seed=1, min_len=400, max_len=400))
        wait_for(lambda: eng.stats()["running"] == 1)
        eng.submit(EngineRequest("b", prompt, seed=2, min_len=2, max_len=2))
        with pytest.raises(EngineBusy, match="max_waiting_requests"):
            eng.submit(EngineRequest("c", prompt, seed=3, min_len=2, max_len=2))
        assert eng.status() is None
        eng.cancel("a")
        assert list(first.events(timeout=TIMEOUT))[-1].reason == "cancelled"

        def broken(*_):
            raise RuntimeError("boom")

        eng._admit = broken  # a bug in the loop itself
        h = eng.submit(EngineRequest("d", prompt, seed=4, min_len=2, max_len=2))
        final = list(h.events(timeout=TIMEOUT))[-1]
        assert final.reason == "error" and "boom" in final.error
        wait_for(lambda: eng.status() is not None)
        assert "engine thread crashed: boom" in eng.status()
    finally:
        eng.shutdown()


# -- prefix caching: requests sharing a prompt prefix reuse its KV blocks; results as without

def ref_prompt(vox, text, voice=3):
    """Reference mode with a 2 s reference: [103] + 16 patches + [104] lead every prompt of a voice."""
    rate = vox.encode_sample_rate
    return vox.prepare_prompt(text, reference_audio=sine_wave(2.0, rate, 150.0 + 20 * voice, voice),
                              reference_sample_rate=rate)


def expected_hit_blocks(prompt, cached: list, bs: int) -> int:
    """Full blocks of `prompt` equal to the same blocks of a prompt already prefilled (`cached`),
    counted only before each one's last prompt position (those blocks are never cached)."""
    best = 0
    for q in cached:
        n = min(len(prompt), len(q))
        same = (prompt.tokens[:n] == q.tokens[:n]) & (prompt.audio_mask[:n] == q.audio_mask[:n]) \
            & (prompt.feats[:n] == q.feats[:n]).flatten(1).all(1)
        common = n if bool(same.all()) else int((~same).nonzero()[0, 0])
        best = max(best, min(common // bs, (len(prompt) - 1) // bs, (len(q) - 1) // bs))
    return best


def test_prefix_cached_requests_equal_their_uncached_runs(vox):
    """A voice's first request fills the cache (a lone prompt: the prefill graph body, run eagerly
    here); four more, admitted together after it ended, start from its idle blocks (the packed
    prefill after a cached prefix); one more joins while they run and shares their held blocks (a
    lone prompt after a cached prefix: the context graph body). Every result equals its solo run
    (the offline API, no cache) and the hit counters are exact."""
    from voxcpm_triton.engine.prefill_runner import PrefillGraphs

    bs = 4
    eng = Engine(vox, EngineConfig(num_blocks=200, block_size=bs, max_num_seqs=8))
    pg = eng.prefill_graphs = PrefillGraphs(eng.model, eng.kv, "cpu", buckets=(8, 128),
                                            max_blocks=eng.max_blocks_per_seq)
    graph_runs = []
    run = pg.run
    pg.run = lambda prompt, slots, start=0, block_table=None, **kw: graph_runs.append(start) or run(
        prompt, slots, start, block_table, **kw)
    texts = ["One.", "A somewhat longer sentence for the cache.", "你好世界", "Three words here."]
    specs = [("first", ref_prompt(vox, texts[0]), dict(seed=1, max_len=6))]
    specs += [(f"batch{i}", ref_prompt(vox, t), dict(seed=10 + i, max_len=[6, 40, 6, 6][i], min_len=0))
              for i, t in enumerate(texts[1:])]
    specs += [("same_text", ref_prompt(vox, texts[0]), dict(seed=5, max_len=6))]
    late = ("late", ref_prompt(vox, texts[1]), dict(seed=6, max_len=6))
    results, want_hits, prefilled = {}, {}, []
    try:
        rid, p, gen = specs[0]
        results[rid] = eng.submit(EngineRequest(rid, p, **gen)).result(timeout=TIMEOUT)
        want_hits[rid], prefilled = 0, [p]
        wait_for(lambda: eng.stats()["in_flight_ids"] == 0)
        with eng._lock:  # one admission: they see the first's blocks, not each other's
            handles = {rid: eng.submit(EngineRequest(rid, p, **gen)) for rid, p, gen in specs[1:]}
        want_hits.update({rid: expected_hit_blocks(p, prefilled, bs) for rid, p, _ in specs[1:]})
        prefilled += [p for _, p, _ in specs[1:]]
        long_events = []
        for ev in handles["batch0"].events(timeout=TIMEOUT):  # the 40-step one: still running after this
            long_events.append(ev)
            if isinstance(ev, LatentChunk):
                break
        rid, p, gen = late
        handles[rid] = eng.submit(EngineRequest(rid, p, **gen))
        want_hits[rid] = expected_hit_blocks(p, prefilled, bs)
        results.update({rid: h.result(timeout=TIMEOUT) for rid, h in handles.items()})
        results["batch0"] = (torch.cat([long_events[0].patches, results["batch0"][0]]), results["batch0"][1])
        wait_for(lambda: eng.stats()["in_flight_ids"] == 0)
        stats = eng.stats()
    finally:
        eng.shutdown()
    n_cacheable = {h for _, p, _ in specs + [late] for h in prompt_block_hashes(p, bs)}
    assert want_hits["same_text"] == (len(specs[0][1]) - 1) // bs  # everything before its last position
    assert want_hits["late"] > want_hits["batch0"] > 0  # it also reuses batch0's own text blocks, still held
    assert stats["prefix_cache_hits"] == sum(h > 0 for h in want_hits.values()) == 5
    assert stats["prefix_cache_hit_blocks"] == sum(want_hits.values())
    assert stats["cached_blocks"] == len(n_cacheable) and stats["prefix_cache_evictions"] == 0
    assert stats["free_blocks"] == stats["total_blocks"]
    assert graph_runs == [0, (want_hits["late"]) * bs], graph_runs  # the batch took the packed path
    for rid, p, gen in specs + [late]:
        got, fin = results[rid]
        assert fin.error is None, fin
        assert_same(got, solo(vox, p, **gen))


def test_packed_prefill_graph_bodies_equal_solo_runs(vox):
    """The GPU's packed prefill graphs (`prefill_packs`): prompts admitted together run as rows of
    the decode attention, padded to a total-length bucket; on the CPU the same padded body runs
    eagerly. A voice's first request (a pack of one) fills the prefix cache; then six are admitted
    at once: cached prefixes and none, more prompts than a pack takes (split into packs, in order),
    one prompt with more new positions than a pack allows one prompt and one longer than every
    bucket (each on the eager path, alone). Every result equals its solo run, and the blocks all
    come back."""
    from voxcpm_triton.engine.prefill_packs import PackedPrefillGraphs

    bs = 4
    eng = Engine(vox, EngineConfig(num_blocks=300, block_size=bs, max_num_seqs=8))
    first = ref_prompt(vox, "One.")
    texts = ["A somewhat longer sentence for the cache.", "你好世界", "Three words here.", "One."]
    specs = [(f"v{i}", ref_prompt(vox, t), dict(seed=10 + i, max_len=[6, 12, 6, 6][i], min_len=0))
             for i, t in enumerate(texts)]
    specs.append(("plain", prompt_for(vox, "zero_shot", "No voice at all."), dict(seed=20, max_len=6)))
    long_text = "A prompt longer than every bucket of the packed graphs, so it prefills eagerly. " * 3
    specs.append(("long", prompt_for(vox, "zero_shot", long_text), dict(seed=21, max_len=4)))
    top = len(specs[0][1])  # the largest bucket: two packs at least, and "long" past it
    assert len(specs[-1][1]) > top > max(len(first), *(len(p) for _, p, _ in specs[1:-1]))
    pg = eng.pack_graphs = PackedPrefillGraphs(eng.model, eng.kv, "cpu", 3, eng.max_blocks_per_seq,
                                               buckets=(16, top), use_triton=False, max_prompt_positions=24)
    packs, eager = [], []
    run, eager_run = pg.run, eng.model.prefill
    pg.run = lambda prompts, starts, *a, **kw: packs.append((len(prompts), list(starts))) or run(
        prompts, starts, *a, **kw)
    eng.model.prefill = lambda *a, **kw: eager.append(a[0].shape[1]) or eager_run(*a, **kw)
    results = {}
    try:
        results["first"] = eng.submit(EngineRequest("first", first, seed=1, max_len=6)).result(timeout=TIMEOUT)
        wait_for(lambda: eng.stats()["in_flight_ids"] == 0)
        with eng._lock:  # one admission
            handles = {rid: eng.submit(EngineRequest(rid, p, **gen)) for rid, p, gen in specs}
        results.update({rid: h.result(timeout=TIMEOUT) for rid, h in handles.items()})
        wait_for(lambda: eng.stats()["in_flight_ids"] == 0)
        stats = eng.stats()
    finally:
        del eng.model.prefill
        eng.shutdown()
    assert packs[0] == (1, [0]), packs
    by_eager = [n for n in eager if n not in pg.buckets]  # prefills that ran no pack body
    assert len(by_eager) == 2 and 24 < by_eager[0] <= top and by_eager[1] == len(specs[-1][1]), eager
    assert sum(k for k, _ in packs[1:]) == len(specs) - 2 and max(k for k, _ in packs) == 3, packs
    assert any(c > 0 for _, starts in packs[1:] for c in starts)  # cached prefixes rode in the packs
    assert stats["prefix_cache_hits"] >= 4
    assert stats["free_blocks"] == stats["total_blocks"]
    for rid, p, gen in [("first", first, dict(seed=1, max_len=6))] + specs:
        got, fin = results[rid]
        assert fin.error is None, (rid, fin)
        assert_same(got, solo(vox, p, **gen))


def test_packed_prefill_after_cached_prefixes_on_the_triton_path(checkpoint_dirs):
    """The GPU attention path (Triton kernels, interpreted here): two requests admitted together
    after a voice's first one prefill in one packed pass whose attention is the decode kernel with
    a row per new position (one of them from position 0 of a cached prefix's held blocks, the other
    with no text in common); both equal their solo runs."""
    vox = VoxCPM2.from_pretrained(checkpoint_dirs["real_shaped"], device="cpu", dtype="float32", attention="triton")
    bs = 4
    eng = Engine(vox, EngineConfig(num_blocks=64, block_size=bs, max_num_seqs=4))
    assert eng.runner.use_triton
    first = ref_prompt(vox, "One.")
    pair = {"a": (ref_prompt(vox, "A somewhat longer sentence."), dict(seed=3, max_len=2)),
            "b": (prompt_for(vox, "zero-shot", "No voice at all."), dict(seed=4, max_len=2))}
    try:
        eng.submit(EngineRequest("first", first, seed=1, max_len=2)).result(timeout=TIMEOUT)
        with eng._lock:
            handles = {rid: eng.submit(EngineRequest(rid, p, **gen)) for rid, (p, gen) in pair.items()}
        results = {rid: h.result(timeout=TIMEOUT) for rid, h in handles.items()}
        stats = eng.stats()
    finally:
        eng.shutdown()
    assert stats["prefix_cache_hits"] == 1 and stats["prefix_cache_hit_blocks"] == expected_hit_blocks(
        pair["a"][0], [first], bs) > 0
    for rid, (p, gen) in pair.items():
        got, fin = results[rid]
        assert fin.error is None, fin
        assert_same(got, solo(vox, p, **gen))


def test_prefix_cached_results_equal_uncached_ones_with_the_pool_under_pressure(vox):
    """Two voices and a zero-shot prompt on a pool that holds two requests at a time: idle cache
    entries are evicted for newcomers, hits still happen, nobody waits forever, and every result
    equals the engine's own run with caching off."""
    bs = 4
    prompts = [ref_prompt(vox, "Voice three speaks.", 3), ref_prompt(vox, "Voice four speaks up.", 4),
               prompt_for(vox, "zero_shot", "No voice at all."), ref_prompt(vox, "Voice three again.", 3),
               ref_prompt(vox, "Voice four once more.", 4), ref_prompt(vox, "Voice three speaks.", 3)] * 2
    gens = [dict(seed=100 + i, min_len=4, max_len=8) for i in range(len(prompts))]
    need = max(-(-(len(p) + 8) // bs) for p in prompts)
    results = {}
    for caching in (False, True):
        eng = Engine(vox, EngineConfig(num_blocks=2 * need + 2, block_size=bs, max_num_seqs=8,
                                       enable_prefix_caching=caching))
        try:
            handles = []
            for i, (p, gen) in enumerate(zip(prompts, gens)):
                handles.append(eng.submit(EngineRequest(f"r{i}", p, **gen)))
                time.sleep(0.02)  # arrivals spread over steps: some find a voice cached, some evicted
            results[caching] = [h.result(timeout=TIMEOUT) for h in handles]
            wait_for(lambda: eng.stats()["in_flight_ids"] == 0)
            stats = eng.stats()
        finally:
            eng.shutdown()
        eng.scheduler.check_invariants()
        eng.kv.allocator.check()
        assert stats["free_blocks"] == stats["total_blocks"] and eng.kv.allocator.reserved == 0
        if caching:
            assert stats["prefix_cache_hits"] > 0 and stats["prefix_cache_evictions"] > 0, stats
        else:
            assert stats["prefix_cache_hits"] == stats["cached_blocks"] == 0
    for (off, fin_off), (on, fin_on) in zip(results[False], results[True]):
        assert fin_off.error is None and fin_on.error is None
        assert_same(on, off)


def _log_order(eng: Engine, log: list, reads: bool = True):
    """Spy on the engine thread: each prefill, step launch (and, with `reads`, each read of launched
    steps) appends (kind, the request ids, sorted) to `log`."""
    ids = lambda states: sorted(st.request_id for st in states)  # noqa: E731
    run_prefill, launch, deliver = eng._run_prefill, eng._launch_decode, eng._deliver
    eng._run_prefill = lambda states, lora_slot: log.append(("prefill", ids(states))) or run_prefill(states, lora_slot)
    eng._launch_decode = lambda batch, plain: log.append(("launch", ids(batch))) or launch(batch, plain)
    if reads:
        eng._deliver = lambda launched: log.append(("deliver", ids(st for b, _ in launched for st in b))) or \
            deliver(launched)


@pytest.mark.parametrize("behind, graph", [(True, True), (False, True), (True, False)])
def test_a_graph_prefill_is_queued_behind_the_step_in_flight(vox, behind, graph):
    """A newcomer whose prefill replays a graph (taken as one here: the CPU has none) is prefilled
    while the step in flight is still unread, and that step's patches are read after the next launch,
    as any step's. With `graph_prefill_behind_step` off, or a prefill that runs eagerly, the step is
    handed out first. Either way every request's latents are its solo run's. The newcomer is
    submitted from the running request's sink, on the engine thread, so it is admitted while that
    request is mid-way whatever the machine's speed."""
    log = []
    eng = Engine(vox, EngineConfig(num_blocks=200, block_size=4, graph_prefill_behind_step=behind))
    eng._replays_graph = lambda pack: graph
    _log_order(eng, log)
    try:
        prompt = prompt_for(vox, "zero_shot", "Behind the step in flight.")
        gen = {"a": dict(seed=1, min_len=10, max_len=10), "b": dict(seed=2, min_len=4, max_len=4)}
        events_a, handles = [], []

        def sink(ev):  # b comes while a runs
            events_a.append(ev)
            if isinstance(ev, LatentChunk) and not handles and ev.first_step + len(ev.patches) >= 3:
                handles.append(eng.submit(EngineRequest("b", prompt, **gen["b"])))

        eng.submit(EngineRequest("a", prompt, **gen["a"]), sink=sink)
        wait_for(lambda: events_a and isinstance(events_a[-1], Finished))
        results = {"a": (torch.cat([e.patches for e in events_a if isinstance(e, LatentChunk)]), events_a[-1]),
                   "b": handles[0].result(timeout=TIMEOUT)}
    finally:
        eng.shutdown()
    for rid, (lat, fin) in results.items():
        assert fin.error is None
        assert_same(lat, solo(vox, prompt, **gen[rid]))
    i = log.index(("prefill", ["b"]))
    if behind and graph:  # a's step in flight is read after b's prefill and the next launch
        assert log[i + 1:i + 3] == [("launch", ["a", "b"]), ("deliver", ["a"])], log[i - 2:i + 4]
    else:  # handed out first
        assert log[i - 1] == ("deliver", ["a"]) and log[i + 1] == ("launch", ["a", "b"]), log[i - 2:i + 4]


def test_a_graph_prefill_goes_ahead_of_the_first_audio_fence(vox):
    """A newcomer admitted while a lone request's first step is in flight (a step whose first chunk
    goes first: `first_audio`): its graph prefill is queued first, then that step is read and fenced,
    and only then is the next step launched, for both. Both get their solo run's latents."""
    order, handles = [], {}
    fa = _FirstAudio()
    fa.seen = []  # its mark() and fence() read it; no chunk is recorded here
    fence = fa.fence
    fa.fence = lambda mark, timeout: order.append("fence") or fence(mark, timeout)
    prompt = prompt_for(vox, "zero_shot", "Ahead of the fence.")
    gen = {"a": dict(seed=1, min_len=5, max_len=5), "b": dict(seed=2, min_len=3, max_len=3)}

    def hook(st, stage):  # b reaches the inbox as a is prefilled: it is admitted with a's first step in flight
        if st.request_id == "a" and stage == "prefill":
            handles["b"] = eng.submit(EngineRequest("b", prompt, **gen["b"]))

    eng = Engine(vox, EngineConfig(num_blocks=200, block_size=4), fault_hook=hook, first_audio=fa)
    fa.eng = eng
    eng._replays_graph = lambda pack: True
    _log_order(eng, order, reads=False)
    try:
        ha = eng.submit(EngineRequest("a", prompt, **gen["a"]))
        results = {"a": ha.result(timeout=TIMEOUT)}
        wait_for(lambda: "b" in handles)
        results["b"] = handles["b"].result(timeout=TIMEOUT)
    finally:
        eng.shutdown()
    for rid, (lat, fin) in results.items():
        assert fin.error is None
        assert_same(lat, solo(vox, prompt, **gen[rid]))
    assert order[:5] == [("prefill", ["a"]), ("launch", ["a"]), ("prefill", ["b"]), "fence", ("launch", ["a", "b"])], \
        order[:6]


def test_a_step_whose_first_launch_finds_the_stream_idle_behind_one_in_flight_counts_as_late(vox):
    """`late_launches` counts steps launched while another was in flight (launched ahead of its
    read) whose first launch found the GPU stream idle: the GPU ran out of the engine's work and
    waited for its thread. The runner says so per launch (`LaunchedStep.stream_idle`, asked on the
    GPU just before its first copy; never on the CPU); stand-ins say it here, by loop bucket. Two
    requests in two loop buckets run each step as two launches: only the first counts (the second
    queues behind it), and the first step, with nothing in flight, never does."""
    from dataclasses import replace

    prompt = prompt_for(vox, "zero_shot", "Late or not.")
    counts = {}
    for idle_loops in ((), (10,), (32,)):
        eng = Engine(vox, EngineConfig(num_blocks=64, block_size=4))
        assert [eng.runner.loop_bucket(t) for t in (10, 30)] == [10, 32]

        def launch(rows, _launch=eng.runner.launch, _idle=idle_loops, **kw):
            step = _launch(rows, **kw)
            return replace(step, stream_idle=step.loop in _idle)

        eng.runner.launch = launch
        try:
            with eng._lock:  # one admission takes both (the engine's condition lock is re-entrant)
                handles = [eng.submit(EngineRequest("a", prompt, seed=1, min_len=6, max_len=6)),
                           eng.submit(EngineRequest("b", prompt, seed=2, min_len=6, max_len=6, inference_timesteps=30))]
            for h in handles:
                lat, fin = h.result(timeout=TIMEOUT)
                assert fin.error is None and lat.shape[0] == 6
            s = eng.stats()
        finally:
            eng.shutdown()
        assert s["launches"] == 2 * s["steps"] == 12, s
        counts[idle_loops] = s["late_launches"]
    assert counts == {(): 0, (10,): 5, (32,): 0}, counts
