# python3 -m pytest -q tests/test_engine_gpu.py   (on a GPU machine; skipped without CUDA)
"""The engine on a GPU: CUDA graphs and overlapped steps (step N+1 launched before step N is read).

Skipped without CUDA (CI runs on CPU); on the GPU machine it runs with the other GPU tests
(benchmarks/README.md). The CPU tests in test_engine.py check the same engine logic, but there
every step is done before `launch` returns.
"""

import time

import pytest
import torch

from voxcpm_triton import VoxCPM2
from voxcpm_triton.engine import Engine, EngineConfig, EngineRequest, Finished, LatentChunk
from voxcpm_triton.checks import TIMESTEPS_RANGE

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
TIMEOUT = 300


def wait_finished(events: dict):
    t0 = time.monotonic()
    while not all(ev and isinstance(ev[-1], Finished) for ev in events.values()):
        assert time.monotonic() - t0 < TIMEOUT
        time.sleep(0.01)


def test_several_launches_in_flight_leave_every_result_in_its_place(checkpoint_dirs):
    """A (10 timesteps), B (30, loop bucket 32) and C (10, ends first): each engine step launches
    the 10-step group and B apart, and reads the previous step's two launches after that. When C
    ends, A moves to batch bucket 2. Nothing is captured while serving, and each step's result
    must reach its own patch: a launch refilling the host buffers of a launch not read yet would
    hand that one the next one's patches (duplicates)."""
    # python -m pytest -q tests/test_engine_gpu.py -k several_launches   (on a GPU machine)
    vox = VoxCPM2.from_pretrained(checkpoint_dirs["real_shaped"], device="cuda", dtype="bfloat16")
    prompt = vox.prepare_prompt("Graphs on the GPU, several launches in flight.")
    eng = Engine(vox, EngineConfig(num_blocks=256, block_size=16, max_num_seqs=4))
    try:
        r = eng.runner
        captured, graphs = r.captures, dict(r.graphs)
        events = {rid: [] for rid in "ABC"}
        specs = {"A": dict(seed=1, min_len=40, max_len=40), "B": dict(seed=2, min_len=40, max_len=40,
                 inference_timesteps=30), "C": dict(seed=3, min_len=6, max_len=6)}
        with eng._lock:  # one admission takes all three (the engine's condition lock is re-entrant)
            for rid, gen in specs.items():
                eng.submit(EngineRequest(rid, prompt, **gen), sink=events[rid].append)
        wait_finished(events)
    finally:
        eng.shutdown()
    assert r.captures == captured and r.graphs == graphs and set(graphs) == r.graph_keys()
    s = eng.stats()
    assert s["launches"] == 2 * s["steps"] and s["batch_sizes"] == {2: 6, 1: 74}, s
    assert len(r._host_free) == len(r.host)  # every launch collected
    for rid, ev in events.items():
        assert ev[-1].error is None, ev[-1]
        lat = torch.cat([e.patches for e in ev if isinstance(e, LatentChunk)])
        assert lat.shape[0] == specs[rid]["max_len"]
        same_as_next = [i for i in range(len(lat) - 1) if torch.equal(lat[i], lat[i + 1])]
        assert not same_as_next, (rid, same_as_next)


def test_a_timesteps_sweep_captures_nothing_and_each_result_equals_its_solo_run(checkpoint_dirs):
    """Every INFERENCE_TIMESTEPS value at once: all run on the graphs captured at start-up (one per
    batch bucket and loop bucket), none is captured while serving, and a request's latents equal
    the offline API's exact-width run (fp32 and PyTorch attention, so they compare closely)."""
    # python -m pytest -q tests/test_engine_gpu.py -k sweep   (on a GPU machine)
    vox = VoxCPM2.from_pretrained(checkpoint_dirs["real_shaped"], device="cuda", dtype="float32", attention="torch")
    prompt = vox.prepare_prompt("Every timesteps value, one set of graphs.")
    eng = Engine(vox, EngineConfig(num_blocks=256, block_size=16, max_num_seqs=8))
    ks = range(TIMESTEPS_RANGE[0], TIMESTEPS_RANGE[1] + 1)
    gen = {k: dict(seed=k, min_len=3, max_len=3, inference_timesteps=k) for k in ks}
    try:
        r = eng.runner
        keys, graphs, captured = r.graph_keys(), dict(r.graphs), r.captures
        assert set(graphs) == keys and all(g is not None for g in graphs.values())
        assert captured == len(keys) == eng.capture_summary["graphs"] == len(r.buckets) * len(r.loop_buckets)
        handles = {k: eng.submit(EngineRequest(f"k{k}", prompt, **gen[k])) for k in ks}
        results = {k: h.result(timeout=TIMEOUT) for k, h in handles.items()}
        assert r.captures == captured and r.graph_keys() == keys and r.graphs == graphs
        s = eng.stats()
        assert s["launches"] > s["steps"]  # the batches mixed loop buckets
    finally:
        eng.shutdown()
    for k, (lat, fin) in results.items():
        assert fin.error is None and lat.shape[0] == 3, (k, fin)
    for k in (1, 3, 10, 11, 37, 49, 51, 99, 100):
        want = vox.generate_latents(None, prompt=prompt, **gen[k])
        err = (results[k][0] - want).abs().max().item()
        assert err <= 1e-3, (k, err)


def _run_together(vox, config: EngineConfig, prompts: dict, specs: dict):
    """Every request admitted at once (one batch), then each one's latents and Finished event."""
    eng = Engine(vox, config)
    try:
        with eng._lock:  # one admission takes all of them (the engine's condition lock is re-entrant)
            handles = {rid: eng.submit(EngineRequest(rid, prompts[rid], **gen)) for rid, gen in specs.items()}
        results = {rid: h.result(timeout=TIMEOUT) for rid, h in handles.items()}
        return results, eng.stats()
    finally:
        eng.shutdown()


def test_graphs_compile_and_kernels_give_the_eager_engines_latents(checkpoint_dirs):
    """The serving engine (CUDA graphs, torch.compile, the Triton attention kernels) and the plain
    eager one (no graphs, no compile, PyTorch attention) run the same batch of five requests, with
    mixed INFERENCE_TIMESTEPS (several loop buckets, padded CFM steps masked) and seeds, and give
    every request the same latents.

    fp32 in both, so the bound checks the fast path's logic, not bf16 rounding: with fp32 operands
    torch's matmuls do not use TF32 (allow_tf32 is off by default) and the Triton kernels use
    precision="ieee", so what differs is summation order (fused kernels, compiled fusions, graph
    vs eager GEMM choices), ~1e-6 relative per op. Over 12 autoregressive steps that stays far
    below 1e-3 (the CPU parity tests see <= 1e-4 after 24 steps between two implementations),
    while a wrong row, step, mask or bucket moves latents of magnitude ~1 by O(1)."""
    path = checkpoint_dirs["real_shaped"]
    texts = ["The first request, ten timesteps.", "A second one, with four.", "Twenty-five steps for this.",
             "One timestep only.", "And the last, ten again but another seed."]
    specs = {f"r{i}": dict(seed=s, inference_timesteps=k, min_len=n, max_len=n, cfg_value=c)
             for i, (s, k, n, c) in enumerate([(11, 10, 12, 2.0), (12, 4, 9, 1.5), (13, 25, 12, 2.5),
                                               (14, 1, 7, 2.0), (15, 10, 10, 3.0)])}
    steps = max(g["max_len"] for g in specs.values())
    out = {}
    for name, build, config in [
        ("fast", dict(attention="auto", compile=True), EngineConfig(num_blocks=256, block_size=16, max_num_seqs=8,
                                                                     cuda_graphs=True)),
        ("eager", dict(attention="torch", compile=False), EngineConfig(num_blocks=256, block_size=16,
                                                                        max_num_seqs=8, cuda_graphs=False)),
    ]:
        vox = VoxCPM2.from_pretrained(path, device="cuda", dtype="float32", **build)
        prompts = {rid: vox.prepare_prompt(t) for rid, t in zip(specs, texts)}
        results, stats = _run_together(vox, config, prompts, specs)
        # One batch: as many engine steps as the longest request has patches.
        assert stats["steps"] == steps, (name, stats)
        out[name], out[name + "_rows"] = results, stats["batch_sizes"]
        del vox
        torch.cuda.empty_cache()
    assert out["fast_rows"] == out["eager_rows"]  # the same launches (grouped by loop bucket), row for row
    for rid, gen in specs.items():
        (fast, fin_f), (eager, fin_e) = out["fast"][rid], out["eager"][rid]
        assert fin_f.error is None and fin_e.error is None, (rid, fin_f, fin_e)
        assert fast.shape == eager.shape and fast.shape[0] == gen["max_len"], (rid, fast.shape, eager.shape)
        assert torch.isfinite(fast).all() and fast.abs().max() > 0.1, rid
        err = (fast - eager).abs().max().item()
        assert err <= 1e-3, (rid, gen, err)


def test_prefix_cached_prefills_on_the_gpu_match_the_uncached_ones(checkpoint_dirs):
    """As served (bf16, CUDA graphs, Triton attention): a voice's second request prefills after its
    cached prefix in a context graph (positions offset on the device, attention through the block
    table), two more admitted together take a packed prefill graph after it; each one's latents
    match an engine without the cache (cosine >= 0.999), and nothing is captured while serving."""
    # python -m pytest -q tests/test_engine_gpu.py -k prefix_cached   (on a GPU machine)
    import torch.nn.functional as F

    from tests.conftest import sine_wave

    vox = VoxCPM2.from_pretrained(checkpoint_dirs["real_shaped"], device="cuda", dtype="bfloat16")
    rate = vox.encode_sample_rate
    ref = sine_wave(2.0, rate, 170.0, 3)
    texts = {"first": "The voice's first words.", "lone": "Another sentence entirely, and a longer one.",
             "pair_a": "Two at once.", "pair_b": "Two at once, the second."}
    prompts = {rid: vox.prepare_prompt(t, reference_audio=ref, reference_sample_rate=rate) for rid, t in texts.items()}
    gen = {rid: dict(seed=i, min_len=8, max_len=8) for i, rid in enumerate(texts)}
    results = {}
    for caching in (True, False):
        eng = Engine(vox, EngineConfig(num_blocks=256, block_size=4, max_num_seqs=4,
                                       enable_prefix_caching=caching))
        pg = eng.prefill_graphs
        starts, run = [], pg.run
        pg.run = lambda prompt, slots, start=0, block_table=None, **kw: starts.append(start) or run(
            prompt, slots, start, block_table, **kw)
        captured = (dict(pg.graphs), dict(pg.context_graphs), dict(eng.pack_graphs.graphs), eng.runner.captures)
        try:
            out = {rid: eng.submit(EngineRequest(rid, prompts[rid], **gen[rid])).result(timeout=TIMEOUT)
                   for rid in ("first", "lone")}
            with eng._lock:
                handles = {rid: eng.submit(EngineRequest(rid, prompts[rid], **gen[rid])) for rid in ("pair_a", "pair_b")}
            out.update({rid: h.result(timeout=TIMEOUT) for rid, h in handles.items()})
            stats = eng.stats()
        finally:
            eng.shutdown()
        assert (pg.graphs, pg.context_graphs, eng.pack_graphs.graphs, eng.runner.captures) == captured
        assert len(pg.context_graphs) == (len(pg.buckets) if caching else 0)
        if caching:
            assert starts[0] == 0 and starts[1] > 0 and len(starts) == 2, starts  # the pair: packed path
            assert stats["prefix_cache_hits"] == 3, stats
        else:
            assert starts == [0, 0] and stats["prefix_cache_hits"] == 0
        results[caching] = out
    for rid in texts:
        (got, fin_c), (want, fin_u) = results[True][rid], results[False][rid]
        assert fin_c.error is None and fin_u.error is None
        cos = F.cosine_similarity(got.flatten(1), want.flatten(1), dim=1).min().item()
        assert cos >= 0.999, (rid, cos)


def test_packed_prefill_graphs_give_the_eager_packed_prefills_latents(checkpoint_dirs):
    """A burst as served (CUDA graphs, compile, Triton attention), fp32 as in the test above: seven
    prompts admitted at once (a voice's prompts after its cached blocks and plain ones) prefill
    in packed graphs (the rows of the paged decode kernel, padded to a bucket), split in two packs
    at least by small buckets; the same engine without pack graphs prefills them eagerly in one
    packed call. Every request's latents agree (<= 1e-3), every pack replayed a graph captured at
    start-up, and none was captured while serving."""
    # python -m pytest -q tests/test_engine_gpu.py -k packed_prefill_graphs   (on a GPU machine)
    from tests.conftest import sine_wave

    vox = VoxCPM2.from_pretrained(checkpoint_dirs["real_shaped"], device="cuda", dtype="float32")
    rate = vox.encode_sample_rate
    ref = sine_wave(2.0, rate, 170.0, 3)
    voiced = ["The voice's first words.", "Two at once.", "Another sentence entirely, and a longer one.", "Short."]
    plain = ["No voice here.", "Nor here, a little longer than that.", "Last."]
    prompts = {"first": vox.prepare_prompt("Its cache.", reference_audio=ref, reference_sample_rate=rate)}
    prompts.update({f"v{i}": vox.prepare_prompt(t, reference_audio=ref, reference_sample_rate=rate)
                    for i, t in enumerate(voiced)})
    prompts.update({f"p{i}": vox.prepare_prompt(t) for i, t in enumerate(plain)})
    gen = {rid: dict(seed=i, min_len=8, max_len=8) for i, rid in enumerate(prompts)}
    burst = [rid for rid in prompts if rid != "first"]
    bs, buckets = 4, (16, 32, 48)
    cached = (len(prompts["first"]) - 1) // bs * bs  # at most: the voice's blocks before its text
    assert max(len(prompts[rid]) for rid in burst) <= buckets[-1]  # each fits a pack
    assert sum(len(prompts[rid]) for rid in burst) > cached * len(voiced) + buckets[-1]  # two packs at least
    results, packs = {}, []
    for packed in (True, False):
        eng = Engine(vox, EngineConfig(num_blocks=512, block_size=bs, max_num_seqs=8,
                                       prefill_pack_graphs=packed, prefill_pack_buckets=buckets))
        pp = eng.pack_graphs
        assert (pp is not None) == packed
        if packed:
            assert tuple(pp.graphs) == buckets
            captured, run = (dict(pp.graphs), eng.runner.captures), pp.run
            pp.run = lambda p, starts, *a, **kw: packs.append((len(p), list(starts))) or run(p, starts, *a, **kw)
            lone = eng.prefill_graphs.run  # a pack of one takes the lone prompt's graph
            eng.prefill_graphs.run = lambda p, slots, start=0, *a, **kw: packs.append((1, [start])) or lone(
                p, slots, start, *a, **kw)
        try:
            out = {"first": eng.submit(EngineRequest("first", prompts["first"], **gen["first"])).result(timeout=TIMEOUT)}
            with eng._lock:  # one admission
                handles = {rid: eng.submit(EngineRequest(rid, prompts[rid], **gen[rid])) for rid in burst}
            out.update({rid: h.result(timeout=TIMEOUT) for rid, h in handles.items()})
        finally:
            eng.shutdown()
        if packed:
            assert (pp.graphs, eng.runner.captures) == captured
        results[packed] = out
        del eng
        torch.cuda.empty_cache()
    assert packs[0] == (1, [0]) and sum(k for k, _ in packs[1:]) == len(burst), packs  # "first", then the burst
    assert sum(k > 1 for k, _ in packs) >= 2, packs
    assert any(c > 0 for k, starts in packs if k > 1 for c in starts), packs  # cached prefixes in the packs
    for rid in prompts:
        (got, fin_g), (want, fin_e) = results[True][rid], results[False][rid]
        assert fin_g.error is None and fin_e.error is None, (rid, fin_g, fin_e)
        assert torch.isfinite(got).all() and got.abs().max() > 0.1, rid
        err = (got - want).abs().max().item()
        assert err <= 1e-3, (rid, err)


def test_vae_chunks_without_a_graph_of_their_own_decode_as_graph_pieces(checkpoint_dirs):
    """A chunk length with no graph (a last chunk, a chunk sent early) replays graph-sized pieces,
    longest first, and gives the eager decode's audio; past the longest graph it decodes eagerly.
    Decodes queued together give the same audio."""
    from voxcpm_triton.audio.vae_streams import VAEStreams
    from voxcpm_triton.loading import load_audio_vae

    _, vae = load_audio_vae(checkpoint_dirs["real_shaped"], torch.device("cuda"))
    P = 4
    graphs = VAEStreams(vae, P, max_streams=4, cuda_graphs=True, graph_patches=(1, 4))
    eager = VAEStreams(vae, P, max_streams=4, cuda_graphs=False)
    assert graphs.pieces(2, 3 * P) == [P, P, P] and graphs.pieces(2, 2 * P) == [P, P]
    assert graphs.pieces(2, 4 * P) == [4 * P] and graphs.pieces(2, 6 * P) is None
    g = torch.Generator(device="cuda").manual_seed(0)
    z = torch.randn(2, vae.latent_dim, 20 * P, device="cuda", generator=g)
    for s in (graphs, eager):
        s.open("a")
        s.open("b")
    start = 0
    for n in (1, 3, 4, 2, 6):  # 3 and 2: pieces; 6: eager on both
        chunk = z[..., start * P:(start + n) * P]
        got, want = graphs.decode(["a", "b"], chunk), eager.decode(["a", "b"], chunk)
        assert got.shape == want.shape
        assert (got - want).abs().max().item() <= 1e-3 * max(1.0, want.abs().max().item()), n
        start += n
    # As vae_decoder runs a batch: every decode queued (latents from the CPU, copies through pinned
    # buffers) before the first wait. c and d replay the same graph three times each: each piece's
    # audio must be copied out before the next replay overwrites the graph's output; e is one
    # replay. Each result is copied as soon as it is returned, before anything else waits for the
    # GPU: a result() that did not wait would show up as audio not yet written.
    for s in (graphs, eager):
        s.close("a")
        s.close("b")
        for key in "cde":
            s.open(key)
    chunks = {"c": z[:1, :, :3 * P].cpu(), "d": z[1:, :, 5 * P:8 * P].cpu(), "e": z[1:, :, 8 * P:12 * P].cpu()}
    queued = {key: graphs.decode_async([key], chunk) for key, chunk in chunks.items()}
    got = {key: q.result().clone() for key, q in queued.items()}
    for key, chunk in chunks.items():
        want = eager.decode([key], chunk)
        assert got[key].device.type == "cpu" and got[key].shape == want.shape
        assert (got[key] - want).abs().max().item() <= 1e-3 * max(1.0, want.abs().max().item()), key


def test_stream_audio_on_the_gpu_gives_the_eager_decodes_audio_beside_busy_gpu_work(checkpoint_dirs):
    """The decoder's own audio (`decode_audio`): its thread replays the VAE graphs (and graph pieces:
    3 patches as 1 + 1 + 1) on its high-priority stream while other work keeps the default stream
    busy, and each request's chunks come back in order with the eager decode's audio. Each step's
    chunks are delivered before the next are queued, so no round merges them past the graphs. The
    fence after each step's chunks gives an event that another stream can wait on."""
    # python -m pytest -q tests/test_engine_gpu.py -k stream_audio   (on a GPU machine)
    import threading

    from voxcpm_triton.audio.stream_audio import StreamAudio
    from voxcpm_triton.audio.vae_streams import VAEStreams
    from voxcpm_triton.loading import load_audio_vae

    _, vae = load_audio_vae(checkpoint_dirs["real_shaped"], torch.device("cuda"))
    P, D = 4, vae.latent_dim
    got, ends, done = {}, {}, {k: threading.Event() for k in "abc"}

    def receiver(key):
        def deliver(patches, payload, end=None):
            if patches is not None:
                got.setdefault(key, []).append((len(patches), torch.as_tensor(payload).clone()))
            if patches is None or end is not None:
                ends[key] = payload if patches is None else end
                done[key].set()
        return deliver

    audio = StreamAudio(vae, P, max_streams=4, cuda_graphs=True, graph_patches=(1, 4),
                        on_failure=lambda key, e: None)
    assert audio.cuda_stream is not None and audio.cuda_stream.priority < 0
    assert audio.streams.pieces(3, 3 * P) == [P, P, P] and audio.streams.pieces(3, 4 * P) == [4 * P]
    g = torch.Generator().manual_seed(0)
    lat = {k: torch.randn(9, P, D, generator=g) * 0.5 for k in "abc"}
    busy = torch.randn(4096, 4096, device="cuda")
    try:
        for k in "abc":
            audio.open(k, receiver(k))
        for step, (a, b) in enumerate(((0, 1), (1, 5), (5, 8), (8, 9))):
            for _ in range(20):  # the default stream stays busy while the chunks decode
                busy = torch.tanh(busy @ busy * 1e-3)
            mark = audio.mark()
            for k in "abc":
                audio.chunk(k, lat[k][a:b])
            # the engine's first_audio_priority: an event after these decodes, for its stream to wait on
            deadline = time.monotonic() + TIMEOUT
            while not (out := audio.fence(mark, TIMEOUT))[0]:  # at once while the last round winds up
                assert time.monotonic() < deadline
            fenced = out[1]
            assert isinstance(fenced, torch.cuda.Event)
            side = torch.cuda.Stream()
            side.wait_event(fenced)
            marker = torch.cuda.Event()
            marker.record(side)
            marker.synchronize()
            assert fenced.query()
            deadline = time.monotonic() + TIMEOUT
            while not all(len(got.get(k, [])) > step for k in "abc"):
                assert time.monotonic() < deadline and not ends, ends
                time.sleep(0.001)
        for k in "abc":
            audio.end(k, "end")
        assert all(e.wait(TIMEOUT) for e in done.values())
    finally:
        audio.stop()
    assert ends == dict.fromkeys("abc", "end"), ends  # no request failed
    eager = VAEStreams(vae, P, max_streams=4, cuda_graphs=False)
    for k in "abc":
        eager.open(k)
        want = eager.decode([k], lat[k].reshape(-1, D).T[None])[0]
        assert [n for n, _ in got[k]] == [1, 4, 3, 1]
        out = torch.cat([a for _, a in got[k]])
        assert out.shape == want.shape
        assert (out - want).abs().max().item() <= 1e-3 * max(1.0, want.abs().max().item()), k


def test_a_last_chunk_on_the_gpu_replays_one_padded_graph_and_gives_the_eager_decodes_audio(checkpoint_dirs):
    """With graphs, a request's last chunk of 3 patches decodes padded to the 4-patch graph (one
    replay, not three), and the audio cut back to its 3 patches is the eager decode's."""
    import threading

    from voxcpm_triton.audio.stream_audio import StreamAudio
    from voxcpm_triton.audio.vae_streams import VAEStreams
    from voxcpm_triton.loading import load_audio_vae

    _, vae = load_audio_vae(checkpoint_dirs["real_shaped"], torch.device("cuda"))
    P, D = 4, vae.latent_dim
    audio = StreamAudio(vae, P, max_streams=4, cuda_graphs=True, graph_patches=(1, 4),
                        on_failure=lambda key, e: None)
    assert audio.pad_last and audio.streams.pieces(2, 4 * P) == [4 * P]
    decoded, chunks, done = [], {}, {k: threading.Event() for k in "ab"}
    decode_async = audio.streams.decode_async

    def spy(keys, z):
        decoded.append((sorted(keys), z.shape[-1] // P))
        return decode_async(keys, z)

    def receiver(key):
        def deliver(patches, payload, end=None):
            if patches is not None:
                chunks.setdefault(key, []).append(torch.as_tensor(payload).clone())
            if patches is None or end is not None:
                done[key].set()
        return deliver

    audio.streams.decode_async = spy
    g = torch.Generator().manual_seed(1)
    lat = {k: torch.randn(8, P, D, generator=g) * 0.5 for k in "ab"}
    try:
        for k in "ab":
            audio.open(k, receiver(k))
        for step, (a, b) in enumerate(((0, 1), (1, 5))):
            with audio.cond:
                for k in "ab":
                    audio.chunk(k, lat[k][a:b])
            deadline = time.monotonic() + TIMEOUT
            while not all(len(chunks.get(k, [])) == step + 1 for k in "ab"):
                assert time.monotonic() < deadline
                time.sleep(0.001)
        with audio.cond:
            for k in "ab":
                audio.chunk(k, lat[k][5:])
                audio.end(k, "end")
        assert all(e.wait(TIMEOUT) for e in done.values())
    finally:
        audio.stop()
    assert decoded == [(["a", "b"], 1), (["a", "b"], 4), (["a", "b"], 4)], decoded
    eager = VAEStreams(vae, P, max_streams=4, cuda_graphs=False)
    for k in "ab":
        eager.open(k)
        want = eager.decode([k], lat[k].reshape(-1, D).T[None])[0]
        out = torch.cat(chunks[k])
        assert [len(c) for c in chunks[k]] == [len(want) // 8, len(want) // 2, len(want) * 3 // 8]
        assert (out - want).abs().max().item() <= 1e-3 * max(1.0, want.abs().max().item()), k


def test_first_audio_on_the_gpu_waits_for_the_decode_and_changes_no_latent(checkpoint_dirs):
    """The decoder's first_audio_priority on the GPU: an engine with CUDA graphs and a `StreamAudio`
    as its first_audio. A lone request's first step is fenced (an event came back and the next
    step waited for it: no miss), its first chunk's audio is there, and its latents equal those
    of the same engine setup without first_audio."""
    # python -m pytest -q tests/test_engine_gpu.py -k first_audio   (on a GPU machine)
    import threading

    from voxcpm_triton.audio.stream_audio import StreamAudio

    vox = VoxCPM2.from_pretrained(checkpoint_dirs["real_shaped"], device="cuda", dtype="bfloat16")
    prompt = vox.prepare_prompt("The first audio goes first.")
    results = {}
    for fenced in (False, True):
        audio = StreamAudio(vox.vae, vox.patch_size, max_streams=4, cuda_graphs=True, graph_patches=(1, 4),
                            on_failure=lambda key, e: None)
        eng = Engine(vox, EngineConfig(num_blocks=128, block_size=16, max_num_seqs=2, chunk_schedule=(1, 4),
                                       timestep_buckets=(10, 100)), first_audio=audio if fenced else None)
        chunks, ended = [], threading.Event()

        def deliver(patches, payload, end=None):
            if patches is not None:
                chunks.append(payload)
            if patches is None or end is not None:
                ended.set()

        audio.open("r", deliver)

        def sink(ev):
            if isinstance(ev, LatentChunk):
                results.setdefault(fenced, []).append(ev.patches)
                audio.chunk("r", ev.patches)
            else:
                assert ev.error is None
                audio.end("r", ev)

        try:
            eng.submit(EngineRequest("r", prompt, seed=3, min_len=9, max_len=9), sink=sink)
            assert ended.wait(TIMEOUT)
            stats = eng.stats()
        finally:
            eng.shutdown()
            audio.stop()
        assert (stats["first_audio_fences"], stats["first_audio_fence_misses"]) == ((1, 0) if fenced else (0, 0))
        assert len(chunks) == 3 and all(torch.isfinite(torch.as_tensor(c)).all() for c in chunks)
    assert torch.equal(torch.cat(results[True]), torch.cat(results[False]))


def test_one_adapter_merged_on_the_gpu_gives_its_lora_ops_latents(checkpoint_dirs, tmp_path):
    """LoRA on the GPU with CUDA graphs, the merge captured as a graph too: a request on an adapter
    runs merged (plain graphs) while alone, and through each row's LoRA ops while a base request
    runs beside it. Both requests equal their runs with `lora_merge` off (every step the LoRA
    graphs; fp32 and PyTorch attention, so they compare closely), and the weights are exactly as
    loaded once the engine is idle."""
    # python -m pytest -q tests/test_engine_gpu.py -k merged   (on a GPU machine)
    import threading

    vox = VoxCPM2.from_pretrained(checkpoint_dirs["real_shaped"], device="cuda", dtype="float32", attention="torch",
                                  lora_dir=str(tmp_path), max_loras=2, max_lora_rank=8, reserve_lora_targets="default")
    t = vox.loras.tables
    g = torch.Generator(device="cuda").manual_seed(0)
    for name in t.sites:  # random adapters in both slots (stable: small B)
        t.a[name][1:].normal_(0, t.a[name].size(-1) ** -0.5, generator=g)
        t.b[name][1:].normal_(0, 0.1 * t.b[name].size(-1) ** -0.5, generator=g)
    vox.loras.slots = {"a1": 1, "a2": 2}
    # The two runs round differently (merged weights against LoRA ops: ~1e-6 to 6e-6 in A's latents), and
    # the base LM's scalar quantizer (round(tanh(h) * scale) / scale, scale 9) can turn that into a jump:
    # with the bucket of 1 (a97b60f) A's path came within 2.9e-6 (in h) of a rounding boundary at its step
    # 16, and the LoRA-op run rounded the other way, 0.045 off from patch 17 on (benchmarks/results.md,
    # sixty-seventh session). A grid of 2**-22 (scaling by a power of two is exact, and round(h * 2**22) is
    # an integer below 2**24, exact in fp32) makes a flip smaller than that noise; the merge is still held
    # to the LoRA ops.
    vox.model.fsq_layer.scale = 2 ** 22
    prompt = vox.prepare_prompt("One adapter merged, then a base request beside it.")
    specs = {"A": dict(seed=1, min_len=24, max_len=24, lora="a1"), "B": dict(seed=2, min_len=6, max_len=6)}
    loaded = {k: v.clone() for k, v in vox.model.state_dict().items()}

    def run(merge: bool):
        eng = Engine(vox, EngineConfig(num_blocks=256, block_size=16, max_num_seqs=4, timestep_buckets=(10, 100),
                                       lora_merge=merge))
        r, states = eng.runner, []
        launch = r.launch

        def spy(rows, bucket=None, plain=False):  # (rows' slots, plain, merged adapter) per launch
            state = (frozenset(x[9] for x in rows), plain, eng.merged.slot if merge else None)
            if not states or states[-1] != state:
                states.append(state)
            return launch(rows, bucket, plain)

        r.launch = spy
        try:
            # every key captured, with and without LoRA ops where merging, and the merge as a graph
            assert eng.capture_summary["graphs"] == len(r.graph_keys()) * (2 if merge else 1)
            if merge:
                assert eng.merged.merge != eng.merged.merge_body
            events, started = {rid: [] for rid in specs}, threading.Event()

            def sink_a(ev):
                events["A"].append(ev)
                started.set()

            eng.submit(EngineRequest("A", prompt, **specs["A"]), sink=sink_a)
            assert started.wait(TIMEOUT)  # A runs (merged, with merge on) before B joins
            eng.submit(EngineRequest("B", prompt, **specs["B"]), sink=events["B"].append)
            wait_finished(events)
            steps = eng.stats()["batch_sizes"]
            if merge:
                assert states == [({1}, True, 1), ({0, 1}, False, 0), ({1}, True, 1)], states
            else:
                assert {p for _, p, _ in states} == {False}, states
            assert all(torch.equal(v, loaded[k]) for k, v in vox.model.state_dict().items())
        finally:
            eng.shutdown()
        assert steps.get(2, 0) >= specs["B"]["max_len"] and steps.get(1, 0) >= 2, steps  # alone, together, alone
        out = {}
        for rid, ev in events.items():
            assert ev[-1].error is None, ev[-1]
            out[rid] = torch.cat([e.patches for e in ev if isinstance(e, LatentChunk)])
        return out

    merged, ops = run(True), run(False)
    for rid in specs:
        err = (merged[rid] - ops[rid]).abs().max().item()
        assert merged[rid].shape[0] == specs[rid]["max_len"] and err <= 1e-3, (rid, err)
    # the adapter moves A far past that bound (0.7-1.4 at the first patch on the CPU): a merge that did nothing fails
    base = vox.generate_latents(None, prompt=prompt, seed=specs["A"]["seed"], min_len=24, max_len=24)
    assert (merged["A"] - base.to(merged["A"])).abs().max().item() > 0.1


def test_a_prompt_past_the_split_bound_compiles_nothing_after_start_up(checkpoint_dirs, monkeypatch):
    """bf16 and compiled, as served, with the split along K on: its row bound (`split_k.MAX_TOKENS`) is
    a guard of the compiled layers, and the start-up's throwaway prefill past it compiles their
    unsplit branch. A request whose prompt is that long then makes dynamo compile no graph, and
    finishes. Pack graphs off: their capture (2048 positions) would compile that branch too. At this
    checkpoint's widths only the LMs' down projection (K = 128) splits; dynamo starts empty, so no
    earlier test's compiled code stands in for the warm-up."""
    from torch._dynamo.utils import counters

    from voxcpm_triton.model import minicpm, split_k

    torch._dynamo.reset()
    monkeypatch.setattr(minicpm.LayerMath, "_compiled", {})
    monkeypatch.setattr(split_k, "ENABLED", True)
    vox = VoxCPM2.from_pretrained(checkpoint_dirs["real_shaped"], device="cuda", dtype="bfloat16", compile=True)
    prompt = vox.prepare_prompt(" ".join(["word"] * 560))
    assert split_k.MAX_TOKENS < len(prompt) < vox.cfg.max_length - 8, len(prompt)
    eng = Engine(vox, EngineConfig(num_blocks=256, block_size=16, max_num_seqs=2, prefill_pack_graphs=False))
    graphs = counters["stats"]["unique_graphs"]
    try:
        got, fin = eng.submit(EngineRequest("long", prompt, seed=1, min_len=4, max_len=4)).result(timeout=TIMEOUT)
    finally:
        eng.shutdown()
    assert fin.error is None and got.shape[0] == 4 and torch.isfinite(got).all()
    assert counters["stats"]["unique_graphs"] == graphs


def test_lora_rows_through_the_compiled_cfm_steps_give_the_eager_engines_latents(checkpoint_dirs, tmp_path):
    """Rows on an adapter beside a base row, through the LoRA ops inside the compiled CFM Euler steps
    and layers (torch.compile, CUDA graphs), give the latents of the eager engine (nothing compiled,
    no graphs): fp32 and PyTorch attention, so they compare closely, as above."""
    specs = {"A": dict(seed=1, min_len=8, max_len=8, lora="a1"), "B": dict(seed=2, min_len=8, max_len=8),
             "C": dict(seed=3, min_len=8, max_len=8, lora="a2", cfg_value=1.5)}
    out = {}
    for compiled in (True, False):
        vox = VoxCPM2.from_pretrained(checkpoint_dirs["real_shaped"], device="cuda", dtype="float32",
                                      attention="torch", compile=compiled, lora_dir=str(tmp_path), max_loras=2,
                                      max_lora_rank=8, reserve_lora_targets="default")
        t = vox.loras.tables
        g = torch.Generator(device="cuda").manual_seed(0)
        for name in t.sites:  # the same random adapters in both engines (stable: small B)
            t.a[name][1:].normal_(0, t.a[name].size(-1) ** -0.5, generator=g)
            t.b[name][1:].normal_(0, 0.1 * t.b[name].size(-1) ** -0.5, generator=g)
        vox.loras.slots = {"a1": 1, "a2": 2}
        prompt = vox.prepare_prompt("Adapters inside the compiled steps.")
        eng = Engine(vox, EngineConfig(num_blocks=256, block_size=16, max_num_seqs=4, timestep_buckets=(10, 100),
                                       cuda_graphs=compiled, lora_merge=False))
        try:
            events = {rid: [] for rid in specs}
            for rid, spec in specs.items():
                eng.submit(EngineRequest(rid, prompt, **spec), sink=events[rid].append)
            wait_finished(events)
        finally:
            eng.shutdown()
        for rid, ev in events.items():
            assert ev[-1].error is None, ev[-1]
            out[(compiled, rid)] = torch.cat([e.patches for e in ev if isinstance(e, LatentChunk)])
        del eng, vox
        torch.cuda.empty_cache()
    for rid in specs:
        err = (out[(True, rid)] - out[(False, rid)]).abs().max().item()
        assert out[(True, rid)].shape[0] == specs[rid]["max_len"] and err <= 1e-3, (rid, err)
