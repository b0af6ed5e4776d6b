"""The decoder's `decode_audio` (the default): the decoder makes each chunk's audio in its own
process and the orchestrators skip vae_decoder. Served (real tritonserver, tiny checkpoint, CPU),
the audio is the offline API's with the schedule's chunks and vae_decoder is never called (the
parity and release checks of tests/test_server.py run on this pipeline, a client leaving included;
tests/test_vae_decoder_pipeline.py runs them on the other). And
`audio.stream_audio` itself, with a real VAE, keeps each request's chunks in order, equal to one
decode of the whole, and fails one request, not the others, when its decode fails."""

import json
import threading
import time
import urllib.request

import numpy as np
import pytest
import torch

from tests.conftest import require_module

require_module("tritonclient", "tritonclient[all] in requirements.txt")

from tests.server import edited_repository, triton_server_factory  # noqa: E402,F401
from tests.test_server import HOP, TOL, ckpt, grpc_input, metrics, offline, tts_stream  # noqa: E402,F401


@pytest.fixture(scope="module", params=["true", "false"], ids=["audio_channel", "responses"])
def server(request, triton_server_factory, ckpt, tmp_path_factory):  # noqa: F811
    repo = edited_repository(tmp_path_factory.mktemp("decode_audio") / "repo",
                              # chunks by the schedule only: a loaded machine sends none early
                              parameters={"decoder": {"decode_audio": "true", "playback_margin_ms": "0",
                                                      "audio_channel": request.param}})
    srv = triton_server_factory(repo, env={"VOXCPM_CHECKPOINT": ckpt})
    srv.audio_channel = request.param == "true"
    return srv


def executions(server, model: str) -> int:
    with urllib.request.urlopen(f"http://{server.http_url}/v2/models/{model}/stats", timeout=10) as r:
        stats = json.load(r)["model_stats"]
    return sum(int(s["execution_count"]) for s in stats)


def test_audio_comes_from_the_decoder_and_vae_decoder_is_never_called(server, offline):
    params = dict(SEED=21, MIN_LENGTH=9, MAX_LENGTH=9, INFERENCE_TIMESTEPS=4)
    chunks = tts_stream(server, "The decoder speaks for itself.", **params)
    # The chunk schedule as without decode_audio: 1, 4, then what is left.
    assert [c.shape for c in chunks] == [(HOP,), (4 * HOP,), (4 * HOP,)]
    want = offline.generate("The decoder speaks for itself.", seed=21, min_len=9, max_len=9, inference_timesteps=4)
    assert np.abs(np.concatenate(chunks) - want).max() <= TOL
    assert executions(server, "vae_decoder") == 0
    assert executions(server, "decoder") > 0
    # first_audio_priority (default): the step that filled the lone stream's first chunk was read
    # before the next launch. (On the CPU the fence waits for the decode itself, which a loaded
    # machine may take past the 20 ms bound: a miss.)
    fenced = lambda m: m.get("voxcpm_engine_first_audio_fences_total", 0) + m.get(  # noqa: E731
        "voxcpm_engine_first_audio_fence_misses_total", 0)
    deadline = time.monotonic() + 10
    while fenced(metrics(server)) < 1:
        assert time.monotonic() < deadline, metrics(server)
        time.sleep(0.1)
    assert metrics(server)["voxcpm_decoder_audio_rushes_total"] >= 0  # audio_rush (default): counted
    # the audio thread's sends, published with the engine's counters: this request's 3 chunks at least
    while (m := metrics(server))["voxcpm_decoder_audio_sends_total"] < 3:
        assert time.monotonic() < deadline + 10, m
        time.sleep(0.1)
    assert m["voxcpm_decoder_audio_send_seconds_total"] > 0 and m["voxcpm_decoder_audio_ends_alone_total"] >= 0, m
    # audio_channel (default): the chunks and the end went over tts_stream's channel, not as responses
    if server.audio_channel:
        while (m := metrics(server))["voxcpm_decoder_audio_channel_frames_total"] < 4:
            assert time.monotonic() < deadline + 20, m
            time.sleep(0.1)
    else:
        assert m.get("voxcpm_decoder_audio_channel_frames_total", 0) == 0, m


def _decoder_responses(server, steps: int) -> list:
    """A request straight to the decoder (stamped with the internal key, as the orchestrator's are):
    each response as (final, patches of LATENTS or None, samples of AUDIO or None)."""
    import queue

    import tritonclient.grpc as grpcclient

    n = np.array([steps], np.int32)
    inputs = [grpc_input("TOKEN_IDS", "INT64", np.array([5, 6, 7], np.int64)), grpc_input("TARGET_TOKENS", "INT32", n),
              grpc_input("MIN_LENGTH", "INT32", n), grpc_input("MAX_LENGTH", "INT32", n)]
    q: queue.Queue = queue.Queue()
    c = grpcclient.InferenceServerClient(server.grpc_url)
    c.start_stream(callback=lambda result, error: q.put((result, error)))
    got = []
    try:
        c.async_stream_infer("decoder", inputs, enable_empty_final_response=True,
                             parameters={"voxcpm_internal_key": server.internal_key})
        while not got or not got[-1][0]:
            result, error = q.get(timeout=300)
            if error is not None:
                raise error
            lat, audio = result.as_numpy("LATENTS"), result.as_numpy("AUDIO")
            got.append((result.get_response().parameters["triton_final_response"].bool_param,
                        None if lat is None else lat.shape[0], None if audio is None else audio.size))
    finally:
        c.stop_stream()
        c.close()
    return got


def test_the_decoders_last_chunk_carries_the_final_flag(server):
    """A request's last chunk and its end go out as one response (the final flag on the last
    LATENTS and AUDIO): one send fewer a request. Every response before it carries a chunk. (The
    audio thread takes the last chunk and the end in one round unless it takes the chunk in the
    moment between the engine thread's two hand-offs: of three requests, one at least.)"""
    merged = 0
    for _ in range(3):
        got = _decoder_responses(server, 9)
        assert [final for final, *_ in got[:-1]] == [False] * (len(got) - 1) and got[-1][0], got
        assert all(lat is not None for _, lat, _ in got[:-1]), got
        chunks = [(lat, samples) for _, lat, samples in got if lat is not None]
        assert [lat for lat, _ in chunks] == [1, 4, 4], got  # the chunk schedule: 1, 4, then what is left
        assert all(samples == lat * HOP for lat, samples in chunks), got
        merged += got[-1][1] is not None
    assert merged >= 1


# ---------------------------------------------------------------------- audio.stream_audio itself
@pytest.fixture(scope="module")
def vae(ckpt):
    from voxcpm_triton.loading import load_audio_vae

    cfg, vae = load_audio_vae(ckpt, torch.device("cpu"))
    return cfg, vae


class _Receiver:
    """A request's deliveries: chunks (patches, audio), then its end, with its last chunk or alone."""

    def __init__(self):
        self.chunks, self.end, self.done = [], None, threading.Event()
        self.with_last_chunk = False  # its end came with its last chunk
        self.after_end = []  # deliveries after the end (an assert here would be swallowed by the thread)

    def __call__(self, patches, payload, end=None):
        if self.done.is_set():
            self.after_end.append((patches, payload))
            return
        if patches is not None:
            self.chunks.append((patches.clone(), np.array(payload)))
            if end is None:
                return
            self.with_last_chunk = True
        self.end = payload if patches is None else end
        self.done.set()


class _Logged(_Receiver):
    """A request's deliveries, each also logged in `order` as (key, patches, or "end"); `hold(key)`, if
    given, runs in each chunk's delivery after that (a slow send, holding the audio thread)."""

    def __init__(self, key, order: list, hold=None):
        super().__init__()
        self.key, self.order, self.hold = key, order, hold

    def __call__(self, patches, payload, end=None):
        self.order.append((self.key, "end" if patches is None else len(patches)))
        if end is not None:
            self.order.append((self.key, "end"))
        if self.hold is not None and patches is not None:
            self.hold(self.key)
        super().__call__(patches, payload, end)


def _latents(seed: int, n: int, P: int, D: int) -> torch.Tensor:
    return torch.randn(n, P, D, generator=torch.Generator().manual_seed(seed)) * 0.5


def _held_round(audio, P: int, D: int, order: list, keys: tuple, later: tuple = ()):
    """Open a `_Logged` receiver for each of keys and later, queue a 1-patch chunk for each of keys in
    one round, and return once the audio thread is held in the first one's delivery: (receivers, the
    event that lets it go on)."""
    entered, release = threading.Event(), threading.Event()

    def hold(key):
        if key == keys[0]:
            entered.set()
            assert release.wait(60)

    recv = {k: _Logged(k, order, hold) for k in (*keys, *later)}
    for k, r in recv.items():
        audio.open(k, r)
    with audio.cond:
        for i, k in enumerate(keys):
            audio.chunk(k, _latents(1 + i, 1, P, D))
    assert entered.wait(60)
    return recv, release


def _wait_until(cond, what=None):
    """Poll `cond` until it holds (60 s at most; `what` is shown if it never does)."""
    deadline = time.monotonic() + 60
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def _end_all(audio, recv: dict, keys):
    """End each of keys, wait for its end's delivery, then check that nothing came after any end and
    that no request or stream slot is left."""
    for k in keys:
        audio.end(k, "end")
        assert recv[k].done.wait(60)
    assert not any(r.after_end for r in recv.values()) and len(audio) == 0 and len(audio.streams) == 0


def _whole(vae, lat: torch.Tensor, context=None) -> np.ndarray:
    """The reference: the whole latent sequence decoded at once (the context's audio dropped)."""
    D = lat.shape[-1]
    z = lat.reshape(-1, D).T[None]
    n_ctx = 0
    if context is not None:
        n_ctx = context.shape[0] * context.shape[1]
        z = torch.cat([context.reshape(-1, D).T[None], z], dim=-1)
    with torch.no_grad():
        audio = vae.decode(z)[0, 0].numpy()
    return audio[n_ctx * vae.decode_chunk_size:]


def test_stream_audio_keeps_each_requests_chunks_in_order_and_equal_to_one_decode(vae):
    """Chunks queued faster than they are decoded merge, up to the longest graph's length (4
    patches here) per request and round, and come back split chunk by chunk, in order, equal to one
    decode of the whole (continuation context included), the request's end with its last chunk
    (taken in the same round: one delivery, one send to the client fewer)."""
    from voxcpm_triton.audio.stream_audio import StreamAudio

    cfg, vae = vae
    P, D = cfg.patch_size, cfg.feat_dim
    failures, decoded = [], []
    audio = StreamAudio(vae, P, max_streams=4, cuda_graphs=False, graph_patches=(1, 4),
                        on_failure=lambda key, e: failures.append(key))
    decode_async = audio.streams.decode_async

    def spy(keys, z):  # each decode: (requests, patches each)
        decoded.append((len(keys), z.shape[-1] // P))
        return decode_async(keys, z)

    audio.streams.decode_async = spy
    try:
        lats = [_latents(i, 9, P, D) for i in range(3)]
        context = _latents(7, 3, P, D)
        recv = [_Receiver() for _ in lats]
        for i, r in enumerate(recv):
            audio.open(("r", i), r, context if i == 2 else None)
        # Interleaved as the engine thread sends them: chunks of 1, 1, 1, 2, 4 patches, then the
        # ends, all queued before the thread can take any (it takes them under this lock).
        with audio.cond:
            for a, b in ((0, 1), (1, 2), (2, 3), (3, 5), (5, 9)):
                for i, lat in enumerate(lats):
                    audio.chunk(("r", i), lat[a:b])
            for i, r in enumerate(recv):
                audio.end(("r", i), f"end {i}")
        for i, r in enumerate(recv):
            assert r.done.wait(60)
            assert r.end == f"end {i}" and r.with_last_chunk
            assert [len(p) for p, _ in r.chunks] == [1, 1, 1, 2, 4]
            assert all(a.shape == (len(p) * P * vae.decode_chunk_size,) for p, a in r.chunks)
            got = np.concatenate([a for _, a in r.chunks])
            want = _whole(vae, lats[i], context if i == 2 else None)
            assert np.abs(got - want).max() <= 1e-4, i
            assert torch.equal(torch.cat([p for p, _ in r.chunks]), lats[i])
            assert not r.after_end
        # Three rounds, each one batch of the three requests: 1 + 1 + 1 merged, then 2, then 4.
        assert decoded == [(3, 3), (3, 2), (3, 4)], decoded
        assert len(audio) == 0 and not failures and len(audio.streams) == 0
    finally:
        audio.stop()
    assert not audio.thread.is_alive()


def test_stream_audio_sends_an_end_with_the_last_of_several_chunks_of_its_round(vae):
    """Chunks of 1, 1 and 1 patch and the end, taken in one round: the chunks in order, the end with
    the third, nothing after it; an end queued after its last chunk was delivered goes alone."""
    from voxcpm_triton.audio.stream_audio import StreamAudio

    cfg, vae = vae
    P, D = cfg.patch_size, cfg.feat_dim
    audio = StreamAudio(vae, P, max_streams=2, cuda_graphs=False, graph_patches=(1, 4),
                        on_failure=lambda key, e: None)
    try:
        order = []
        merged, alone = _Logged("merged", order), _Logged("alone", order)
        audio.open("merged", merged)
        audio.open("alone", alone)
        lat = _latents(3, 3, P, D)
        with audio.cond:  # one round takes them all
            for i in range(3):
                audio.chunk("merged", lat[i:i + 1])
            audio.end("merged", "end")
        assert merged.done.wait(60) and merged.with_last_chunk and merged.end == "end"
        assert torch.equal(torch.cat([p for p, _ in merged.chunks]), lat) and not merged.after_end
        audio.chunk("alone", lat[:1])
        _wait_until(lambda: alone.chunks, "the chunk")
        audio.end("alone", "end")
        assert alone.done.wait(60) and not alone.with_last_chunk and alone.end == "end"
        assert order == [("merged", 1)] * 3 + [("merged", "end"), ("alone", 1), ("alone", "end")], order
        # the books /metrics reads (kept after each delivery returns): 3 + 1 chunks and 1 end alone, in some time
        _wait_until(lambda: (audio.sends, audio.ends_alone) == (5, 1), (audio.sends, audio.ends_alone))
        assert audio.send_seconds > 0
        assert len(audio) == 0 and len(audio.streams) == 0
        with pytest.raises(ValueError, match="None"):
            audio.end("alone", None)
    finally:
        audio.stop()


def test_stream_audio_pads_a_last_chunk_to_a_graph_length_and_gives_the_same_audio(vae):
    """With graphs (pad_last), a request's last chunk decodes padded to the next graph length, in one
    batch with other chunks of that length; its audio, cut back, equals one decode of the whole.
    A chunk that does not end its request, or a last chunk longer than any graph, is not padded."""
    from voxcpm_triton.audio.stream_audio import StreamAudio

    cfg, vae = vae
    P, D = cfg.patch_size, cfg.feat_dim
    audio = StreamAudio(vae, P, max_streams=4, cuda_graphs=False, graph_patches=(1, 4),
                        on_failure=lambda key, e: None)
    assert audio.pad_last is False  # no graphs on the CPU: padding would only cost frames
    audio.pad_last = True
    decoded = []
    decode_async = audio.streams.decode_async

    def spy(keys, z):
        decoded.append((sorted(keys), z.shape[-1] // P))
        return decode_async(keys, z)

    audio.streams.decode_async = spy
    try:
        lats = {k: _latents(i, n, P, D) for i, (k, n) in enumerate((("mid", 7), ("last3", 4), ("last2", 3),
                                                                     ("long", 6)))}
        recv = {k: _Receiver() for k in lats}
        for k, r in recv.items():
            audio.open(k, r)
        with audio.cond:  # first chunks: 1 patch each, one batch
            for k, lat in lats.items():
                audio.chunk(k, lat[:1])
        while len(decoded) < 1:
            time.sleep(0.01)
        with audio.cond:  # then: "mid" 3 (not its last), "last3" 3 and "last2" 2 with their ends
            audio.chunk("mid", lats["mid"][1:4])
            for k in ("last3", "last2"):
                audio.chunk(k, lats[k][1:])
                audio.end(k, f"end {k}")
        for k in ("last3", "last2"):
            assert recv[k].done.wait(60) and recv[k].end == f"end {k}"
        with audio.cond:  # each last chunk with its end, in one round
            audio.chunk("long", lats["long"][1:])  # 5 patches, past the longest graph (4): as it is
            audio.end("long", "end long")
            audio.chunk("mid", lats["mid"][4:])
            audio.end("mid", "end mid")
        for k, r in recv.items():
            assert r.done.wait(60) and not r.after_end
            got = np.concatenate([a for _, a in r.chunks])
            assert got.shape == (len(lats[k]) * P * vae.decode_chunk_size,), k
            assert np.abs(got - _whole(vae, lats[k])).max() <= 1e-4, k
            assert torch.equal(torch.cat([p for p, _ in r.chunks]), lats[k])
        assert decoded[0] == (sorted(lats), 1)
        assert decoded[1:3] == [(["mid"], 3), (["last2", "last3"], 4)], decoded
        assert sorted(decoded[3:]) == [(["long"], 5), (["mid"], 4)], decoded  # mid's last 3, padded
        assert len(audio) == 0 and len(audio.streams) == 0
    finally:
        audio.stop()


def test_stream_audio_sends_an_ending_requests_end_right_after_its_own_audio(vae):
    """In a round, a request that ends goes before the others of its batch, and its end right after
    its audio, not after the round's other batches: its client sends its next request on it."""
    from voxcpm_triton.audio.stream_audio import StreamAudio

    cfg, vae = vae
    P, D = cfg.patch_size, cfg.feat_dim
    audio = StreamAudio(vae, P, max_streams=4, cuda_graphs=False, graph_patches=(1, 4),
                        on_failure=lambda key, e: None)
    order = []

    try:
        recv = {k: _Logged(k, order) for k in ("a_mid", "b_last", "c_mid", "d_last")}
        for k, r in recv.items():
            audio.open(k, r)
        with audio.cond:  # one round: a batch of 1 patch (c_mid, then d_last), one of 2 (a_mid, b_last)
            audio.chunk("a_mid", _latents(1, 2, P, D))
            audio.chunk("b_last", _latents(2, 2, P, D))
            audio.end("b_last", "end")
            audio.chunk("c_mid", _latents(3, 1, P, D))
            audio.chunk("d_last", _latents(4, 1, P, D))
            audio.end("d_last", "end")
        for k in ("b_last", "d_last"):
            assert recv[k].done.wait(60)
        while len(order) < 6:
            time.sleep(0.01)
        assert order == [("d_last", 1), ("d_last", "end"), ("c_mid", 1),
                         ("b_last", 2), ("b_last", "end"), ("a_mid", 2)], order
        for k in ("a_mid", "c_mid"):
            audio.end(k, "end")
            assert recv[k].done.wait(60)
        assert order[6:] == [("a_mid", "end"), ("c_mid", "end")], order
        assert not any(r.after_end for r in recv.values())
    finally:
        audio.stop()


def test_stream_audio_an_end_after_its_thread_took_its_last_work_is_delivered(vae):
    """At shutdown, an end that comes after the audio thread has taken its last work, while that
    thread has not ended yet (the engine still ending requests after its own stop timed out), is
    delivered where it is queued, not left in a queue nobody reads."""
    from voxcpm_triton.audio.stream_audio import StreamAudio

    cfg, vae = vae
    linger = threading.Event()

    class Lingering(StreamAudio):
        def _run(self):
            super()._run()
            linger.wait(60)  # its last work taken, the thread still alive

    audio = Lingering(vae, cfg.patch_size, max_streams=2, cuda_graphs=False, graph_patches=(1,),
                      on_failure=lambda key, e: None)
    try:
        got = []
        audio.open("late", lambda patches, payload, end=None: got.append((patches, payload, end)))
        audio.stop(timeout=0.5)
        _wait_until(lambda: audio.exited, "the audio thread did not take its last work")
        assert audio.thread.is_alive()
        audio.end("late", "end")
        assert got == [(None, "end", None)] and len(audio) == 0
    finally:
        linger.set()
        audio.thread.join(10)


def test_stream_audio_an_end_after_its_thread_died_is_delivered(vae):
    """The audio thread killed by an error outside any round (a CUDA error entering its stream, say):
    an end that comes later still reaches its request, where it is queued."""
    from voxcpm_triton.audio.stream_audio import StreamAudio

    cfg, vae = vae

    class Dying(StreamAudio):
        def _rounds(self):
            raise RuntimeError("the audio thread's own failure")

    audio = Dying(vae, cfg.patch_size, max_streams=2, cuda_graphs=False, graph_patches=(1,),
                  on_failure=lambda key, e: None)
    audio.thread.join(10)
    assert not audio.thread.is_alive() and audio.exited
    got = []
    audio.open("late", lambda patches, payload, end=None: got.append((patches, payload, end)))
    audio.end("late", "end")
    assert got == [(None, "end", None)] and len(audio) == 0


def test_stream_audio_an_end_that_drops_pending_chunks_delivers_none_of_them(vae):
    """A cancelled request's chunks still queued (the audio thread busy with a round) are neither
    decoded nor delivered: only its end goes. Another request's queued chunks go as before."""
    from voxcpm_triton.audio.stream_audio import StreamAudio

    cfg, vae = vae
    P, D = cfg.patch_size, cfg.feat_dim
    audio = StreamAudio(vae, P, max_streams=4, cuda_graphs=False, graph_patches=(1, 4),
                        on_failure=lambda key, e: None, rush=False)
    order = []
    try:
        recv, release = _held_round(audio, P, D, order, ("held",), later=("gone", "kept"))
        for k in ("gone", "kept"):
            audio.chunk(k, _latents(7, 2, P, D))
            audio.chunk(k, _latents(8, 1, P, D))
        audio.end("gone", "cancelled", drop_pending=True)
        release.set()
        assert recv["gone"].done.wait(60)
        _wait_until(lambda: len(recv["kept"].chunks) == 2, "the other request's chunks were not delivered")
        assert recv["gone"].chunks == [] and recv["gone"].end == "cancelled"
        assert ("gone", "end") in order and not [o for o in order if o[0] == "gone" and o[1] != "end"]
        # the dropped chunks were counted as queued: a fence still passes once the rest is launched
        assert audio.fence(0, 10)[0] and audio.chunks_launched == audio.chunks_queued
        _end_all(audio, recv, ("held", "kept"))
    finally:
        audio.stop()


def test_stream_audio_rushes_a_waiting_clients_chunk_between_a_rounds_deliveries(vae):
    """Chunks queued while a round delivers: once it delivers its last batch (its decodes all done),
    a chunk for a client that has heard nothing yet, or that is about to run out of audio, is decoded
    and delivered before the round's next delivery, an ending request's too, and so is an end that
    came alone; a chunk for a client with plenty of audio still to play waits for the next round, and
    so does a request whose own delivery in this round is still to come."""
    from voxcpm_triton.audio import stream_audio
    from voxcpm_triton.audio.stream_audio import StreamAudio

    cfg, vae = vae
    P, D = cfg.patch_size, cfg.feat_dim
    audio = StreamAudio(vae, P, max_streams=8, cuda_graphs=False, graph_patches=(1, 4),
                        on_failure=lambda key, e: None)
    order, entered, release = [], threading.Event(), threading.Event()

    def hold(key):  # s1's is a slow send: the round is held there
        if key == "s1":
            entered.set()
            assert release.wait(60)

    try:
        keys = ("ahead", "ender", "short", "s1", "s2", "old_a", "old_b", "young")
        recv = {k: _Logged(k, order, hold) for k in keys}
        for k, r in recv.items():
            audio.open(k, r)
        with audio.cond:  # round 0
            audio.chunk("ahead", _latents(1, 1, P, D))
            audio.chunk("ender", _latents(2, 1, P, D))
            audio.chunk("short", _latents(10, 1, P, D))
        deadline = time.monotonic() + 60
        while not (recv["ahead"].chunks and recv["ender"].chunks and recv["short"].chunks):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        ender = audio.requests["ender"]  # the books the rush reads: audio sent, from the first chunk on
        assert ender.sent_s == pytest.approx(recv["ender"].chunks[0][1].size / vae.out_sample_rate)
        assert 0 <= ender.sent_s - ender.buffered_s(time.monotonic()) < 60
        audio.requests["ahead"].sent_s += 60.0  # its client has a minute of audio still to play
        short = audio.requests["short"]  # and this one's 10 ms (less as time goes by)
        short.sent_s = time.monotonic() - short.first_at + 0.01
        with audio.cond:  # round 1: a batch of two 1-patch chunks, then the last, of two 2-patch ones
            for i, (k, n) in enumerate((("s1", 1), ("s2", 1), ("old_a", 2), ("old_b", 2))):
                audio.chunk(k, _latents(3 + i, n, P, D))
            audio.end("old_a", "end")  # it ends: delivered first in its batch, but after the rush
        assert entered.wait(60)  # the thread is in s1's delivery
        assert short.buffered_s(time.monotonic()) < stream_audio.RUSH_MARGIN_S
        audio.chunk("young", _latents(7, 1, P, D))  # its first chunk: rushed
        audio.chunk("ahead", _latents(8, 1, P, D))  # 60 s to spare: the next round
        audio.end("ender", "end")  # an end alone: rushed
        audio.chunk("old_b", _latents(9, 1, P, D))  # old_b's chunk of round 1 is not delivered yet: next round
        audio.chunk("short", _latents(11, 1, P, D))  # about to run out: rushed
        rushed = audio.rushed
        release.set()
        deadline = time.monotonic() + 60
        while len(order) < 13:
            assert time.monotonic() < deadline, order
            time.sleep(0.01)
        assert sorted(order[:3]) == [("ahead", 1), ("ender", 1), ("short", 1)], order
        # (a round's ends that came alone go as soon as its decodes are launched, a rush's too)
        assert order[3:11] == [("s1", 1), ("s2", 1), ("ender", "end"), ("young", 1), ("short", 1),
                               ("old_a", 2), ("old_a", "end"), ("old_b", 2)], order
        assert sorted(order[11:13]) == [("ahead", 1), ("old_b", 1)], order
        assert rushed == 0 and audio.rushed == 1
        assert recv["ender"].end == "end" and recv["ender"].done.is_set()
        _end_all(audio, recv, ("ahead", "short", "s1", "s2", "old_b", "young"))
    finally:
        release.set()
        audio.stop()


def test_stream_audio_a_rush_that_takes_everything_queued_tells_the_fence(vae):
    """A fence for chunks that a rush has launched passes (the engine's first-audio priority need not
    wait for the round in progress), where before the rush it would give up at once (busy round)."""
    from voxcpm_triton.audio.stream_audio import StreamAudio

    cfg, vae = vae
    P, D = cfg.patch_size, cfg.feat_dim
    audio = StreamAudio(vae, P, max_streams=4, cuda_graphs=False, graph_patches=(1,),
                        on_failure=lambda key, e: None)
    held = {k: (threading.Event(), threading.Event()) for k in ("a", "b")}  # (entered, release)

    def hold(key):
        if key in held:
            held[key][0].set()
            assert held[key][1].wait(60)

    try:
        recv = {k: _Logged(k, [], hold) for k in ("a", "b", "young")}
        for k, r in recv.items():
            audio.open(k, r)
        with audio.cond:
            audio.chunk("a", _latents(1, 1, P, D))
            audio.chunk("b", _latents(2, 1, P, D))
        assert held["a"][0].wait(60)  # the round delivers a; b is still to come
        mark = audio.mark()
        audio.chunk("young", _latents(3, 1, P, D))
        assert audio.fence(mark, 30) == (False, None)  # busy with older chunks: at once
        held["a"][1].set()
        assert held["b"][0].wait(60)  # the rush ran before b's delivery
        assert recv["young"].chunks and audio.rushed == 1
        assert audio.fence(mark, 30) == (True, None)  # launched (the CPU has no event)
        held["b"][1].set()
        for k, r in recv.items():
            audio.end(k, "end")
            assert r.done.wait(60)
    finally:
        for _, release in held.values():
            release.set()
        audio.stop()


def test_stream_audio_a_rushed_decode_that_fails_fails_its_requests_and_the_round_goes_on(vae):
    """A rushed request whose decode fails gets the error as its end (and its generation is told to
    stop), and the round it was rushed into delivers the rest; a rushed request with no stream slot
    free is put back, and rushed again once one is (here the failed request's)."""
    from voxcpm_triton.audio.stream_audio import StreamAudio

    cfg, vae = vae
    P, D = cfg.patch_size, cfg.feat_dim
    failures, order = [], []
    audio = StreamAudio(vae, P, max_streams=4, cuda_graphs=False, graph_patches=(1,),
                        on_failure=lambda key, e: failures.append(key))
    decode_async = audio.streams.decode_async

    def faulty(keys, z):
        if "bad" in keys:
            raise RuntimeError("injected VAE fault")
        return decode_async(keys, z)

    audio.streams.decode_async = faulty
    release = threading.Event()
    try:  # one round of a, b and c (a's delivery held): three of the four stream slots
        recv, release = _held_round(audio, P, D, order, ("a", "b", "c"), ("bad", "late"))
        with audio.cond:  # rushed together: bad takes the last slot and fails, late finds none
            audio.chunk("bad", _latents(4, 1, P, D))
            audio.chunk("late", _latents(5, 1, P, D))
        release.set()
        assert recv["bad"].done.wait(60) and "injected VAE fault" in str(recv["bad"].end)
        assert recv["bad"].chunks == [] and failures == ["bad"]
        deadline = time.monotonic() + 60
        while not recv["late"].chunks:
            assert time.monotonic() < deadline, order
            time.sleep(0.01)
        assert order == [("a", 1), ("bad", "end"), ("b", 1), ("late", 1), ("c", 1)], order
        assert audio.rushed == 2
        audio.end("bad", "end")  # the engine's, after its cancel: dropped, and clears it
        for k in ("a", "b", "c", "late"):
            audio.end(k, "end")
            assert recv[k].done.wait(60) and len(recv[k].chunks) == 1, k
        assert not any(r.after_end for r in recv.values()) and len(audio) == 0 and len(audio.streams) == 0
    finally:
        release.set()
        audio.stop()


def test_stream_audio_does_not_count_a_rush_that_only_put_requests_back(vae):
    """A rush whose requests all find no stream slot free (put back for a later round) decoded nothing:
    the rush counter (voxcpm_decoder_audio_rushes_total) does not count it."""
    from voxcpm_triton.audio.stream_audio import StreamAudio

    cfg, vae = vae
    P, D = cfg.patch_size, cfg.feat_dim
    audio = StreamAudio(vae, P, max_streams=2, cuda_graphs=False, graph_patches=(1,),
                        on_failure=lambda key, e: None)
    order, release = [], threading.Event()
    try:  # one round of a and b (a's delivery held): both stream slots
        recv, release = _held_round(audio, P, D, order, ("a", "b"), ("young",))
        audio.chunk("young", _latents(3, 1, P, D))  # its first chunk: rushed before b's delivery, no slot
        release.set()
        _wait_until(lambda: len(order) >= 2, order)
        assert order == [("a", 1), ("b", 1)] and not recv["young"].chunks and audio.rushed == 0, order
        audio.end("a", "end")  # frees a slot: young is decoded in a round of its own
        assert recv["a"].done.wait(60)
        _wait_until(lambda: recv["young"].chunks, order)
        assert audio.rushed == 0
        _end_all(audio, recv, ("b", "young"))
    finally:
        release.set()
        audio.stop()


def test_stream_audio_a_broken_rush_fails_its_requests_and_the_round_goes_on(vae):
    """A fault in a rush outside any one decode (a bug) ends the rushed requests with the error, tells
    the fence their chunks are not to be waited for, and the round it broke into delivers the rest."""
    from voxcpm_triton.audio.stream_audio import StreamAudio

    cfg, vae = vae
    P, D = cfg.patch_size, cfg.feat_dim
    failures, order = [], []
    audio = StreamAudio(vae, P, max_streams=4, cuda_graphs=False, graph_patches=(1,),
                        on_failure=lambda key, e: failures.append(key))
    real = audio._round

    def round_(work, launched):
        if audio._rushing:
            raise RuntimeError("injected bug")
        return real(work, launched)

    audio._round = round_
    release = threading.Event()
    try:
        recv, release = _held_round(audio, P, D, order, ("a", "b"), ("young",))
        mark = audio.mark()
        audio.chunk("young", _latents(3, 1, P, D))
        release.set()
        assert recv["young"].done.wait(60) and "injected bug" in str(recv["young"].end)
        assert failures == ["young"] and recv["young"].chunks == []
        assert recv["b"].done.wait(0) is False
        deadline = time.monotonic() + 60
        while not recv["b"].chunks:
            assert time.monotonic() < deadline, order
            time.sleep(0.01)
        assert order == [("a", 1), ("young", "end"), ("b", 1)], order
        assert audio.fence(mark, 30) == (True, None)  # not waited for
        audio.end("young", "end")  # the engine's, after its cancel: dropped, and clears it
        for k in ("a", "b"):
            audio.end(k, "end")
            assert recv[k].done.wait(60) and len(recv[k].chunks) == 1, k
        assert len(audio) == 0 and len(audio.streams) == 0
    finally:
        release.set()
        audio.stop()


def test_stream_audio_sends_an_end_that_came_alone_before_the_rounds_audio(vae):
    """A round's end with no chunk of its own (its audio went out in earlier rounds) is sent as soon as
    the round's decodes are launched, not after the round's audio."""
    from voxcpm_triton.audio.stream_audio import StreamAudio

    cfg, vae = vae
    P, D = cfg.patch_size, cfg.feat_dim
    audio = StreamAudio(vae, P, max_streams=4, cuda_graphs=False, graph_patches=(1,),
                        on_failure=lambda key, e: None, rush=False)
    order = []

    try:
        recv = {k: _Logged(k, order) for k in ("x", "y")}
        for k, r in recv.items():
            audio.open(k, r)
        audio.chunk("x", _latents(1, 1, P, D))
        deadline = time.monotonic() + 60
        while not recv["x"].chunks:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with audio.cond:  # one round: x's end alone, y's chunk
            audio.end("x", "end")
            audio.chunk("y", _latents(2, 1, P, D))
        assert recv["x"].done.wait(60)
        while len(order) < 3:
            assert time.monotonic() < deadline, order
            time.sleep(0.01)
        assert order == [("x", 1), ("x", "end"), ("y", 1)], order
        audio.end("y", "end")
        assert recv["y"].done.wait(60)
    finally:
        audio.stop()


def test_stream_audio_counts_an_ends_delivery_in_the_rushs_estimate_of_a_send(vae):
    """The rush's estimate of a delivery's time (how long a round's remaining deliveries take) counts
    ends too: a batch of ends alone (a wave of requests ending together) takes as long as its sends."""
    from voxcpm_triton.audio.stream_audio import StreamAudio

    cfg, vae = vae
    P, D = cfg.patch_size, cfg.feat_dim
    audio = StreamAudio(vae, P, max_streams=2, cuda_graphs=False, graph_patches=(1,),
                        on_failure=lambda key, e: None)

    class SlowEnd(_Receiver):
        def __call__(self, patches, payload, end=None):
            if patches is None:
                time.sleep(0.3)
            super().__call__(patches, payload, end)

    try:
        recv = SlowEnd()
        audio.open("k", recv)
        audio.chunk("k", _latents(1, 1, P, D))
        _wait_until(lambda: recv.chunks, "the chunk")  # so that its end goes alone
        audio.end("k", "end")
        assert recv.done.wait(60) and not recv.with_last_chunk
        # 0.1 of 0.3 s at least, in the moving average (updated once the end's delivery returns)
        _wait_until(lambda: audio.send_s > 0.025, "send_s")
    finally:
        audio.stop()


def test_stream_audio_without_rush_leaves_a_waiting_clients_chunk_to_the_next_round(vae):
    """`rush=False` (decoder parameter audio_rush): a first chunk queued while a round delivers its
    last batch waits for that round's end."""
    from voxcpm_triton.audio.stream_audio import StreamAudio

    cfg, vae = vae
    P, D = cfg.patch_size, cfg.feat_dim
    audio = StreamAudio(vae, P, max_streams=4, cuda_graphs=False, graph_patches=(1,),
                        on_failure=lambda key, e: None, rush=False)
    order, release = [], threading.Event()
    try:
        _, release = _held_round(audio, P, D, order, ("a", "b"), ("young",))
        audio.chunk("young", _latents(3, 1, P, D))
        release.set()
        deadline = time.monotonic() + 60
        while len(order) < 3:
            assert time.monotonic() < deadline, order
            time.sleep(0.01)
        assert order == [("a", 1), ("b", 1), ("young", 1)] and audio.rushed == 0
    finally:
        release.set()
        audio.stop()


def test_stream_audio_fails_the_request_whose_decode_fails_and_serves_the_others(vae):
    from voxcpm_triton.audio.stream_audio import StreamAudio

    cfg, vae = vae
    P, D = cfg.patch_size, cfg.feat_dim
    failures = []
    audio = StreamAudio(vae, P, max_streams=2, cuda_graphs=False, graph_patches=(1,),
                        on_failure=lambda key, e: failures.append(key))
    decode_async = audio.streams.decode_async

    def faulty(keys, z):  # a decode that fails for one request's batch
        if "bad" in keys:
            raise RuntimeError("injected VAE fault")
        return decode_async(keys, z)

    audio.streams.decode_async = faulty
    try:
        recv = {k: _Receiver() for k in ("ok", "bad", "filler", "late")}
        for k, r in recv.items():
            audio.open(k, r)
        audio.chunk("ok", _latents(1, 2, P, D))
        audio.chunk("bad", _latents(2, 3, P, D))  # another length: a batch of its own
        assert recv["bad"].done.wait(60)
        assert "injected VAE fault" in str(recv["bad"].end) and recv["bad"].chunks == []
        audio.chunk("filler", _latents(3, 1, P, D))  # takes the slot "bad" gave back: both are in use
        deadline = time.monotonic() + 60
        while not (recv["ok"].chunks and recv["filler"].chunks):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        audio.chunk("late", _latents(4, 1, P, D))  # no slot left for it: it waits for one
        time.sleep(0.5)
        assert not recv["late"].chunks and not recv["late"].done.is_set()
        assert failures == ["bad"]  # told before its error was delivered, so that its generation stops
        # What the engine still sends a failed request is dropped; its end clears it.
        audio.chunk("bad", _latents(5, 1, P, D))
        audio.end("bad", "end")
        audio.end("filler", "end")  # frees a slot: "late" decodes
        assert recv["late"].done.wait(0.01) is False
        deadline = time.monotonic() + 60
        while not recv["late"].chunks:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        audio.end("late", "end late")
        audio.chunk("ok", _latents(6, 1, P, D))
        audio.end("ok", "end ok")
        ok = recv["ok"]
        assert ok.done.wait(60) and ok.end == "end ok" and [len(p) for p, _ in ok.chunks] == [2, 1]
        assert recv["filler"].done.wait(60) and recv["filler"].end == "end"
        assert recv["late"].done.wait(60) and recv["late"].end == "end late" and len(recv["late"].chunks) == 1
        deadline = time.monotonic() + 10
        while len(audio) or len(audio.streams):
            assert time.monotonic() < deadline, audio.requests
            time.sleep(0.05)
        audio.open("x", _Receiver())
        with pytest.raises(ValueError, match="already open"):
            audio.open("x", _Receiver())
        audio.forget("x")
        assert len(audio) == 0
    finally:
        audio.stop()


def test_stream_audio_fails_a_broken_rounds_requests_and_serves_on(vae):
    """A fault outside any one decode (a bug in a round) ends that round's requests with the error;
    the thread lives on and serves the next."""
    from voxcpm_triton.audio.stream_audio import StreamAudio

    cfg, vae = vae
    P, D = cfg.patch_size, cfg.feat_dim
    failures = []
    audio = StreamAudio(vae, P, max_streams=2, cuda_graphs=False, graph_patches=(1,),
                        on_failure=lambda key, e: failures.append(key))
    real, broken_once = audio._round, []

    def round_(work, launched):
        if not broken_once:
            broken_once.append(True)
            raise RuntimeError("injected bug")
        return real(work, launched)

    audio._round = round_
    try:
        first, second = _Receiver(), _Receiver()
        audio.open("first", first)
        audio.chunk("first", _latents(1, 1, P, D))
        assert first.done.wait(60) and "injected bug" in str(first.end) and failures == ["first"]
        t0 = time.monotonic()
        assert audio.fence(0, 30) == (True, None)  # the broken round's chunk is not waited for
        assert time.monotonic() - t0 < 5
        audio.end("first", "end")  # the engine's end, after its cancel: dropped
        audio.open("second", second)
        audio.chunk("second", _latents(2, 1, P, D))
        audio.end("second", "end 2")
        assert second.done.wait(60) and second.end == "end 2" and len(second.chunks) == 1
        assert audio.thread.is_alive() and len(audio) == 0
    finally:
        audio.stop()


def test_stream_audio_fence_waits_until_what_is_queued_has_been_launched(vae):
    """`fence` (the engine's first_audio_priority) returns once a round has launched the decode of
    every chunk queued before the call, without waiting for its delivery. It does not wait behind a
    round busy with chunks older than its mark (it returns at once), does wait for a round that took
    part of its chunks and then for the rest, waits at most its timeout, and stopping releases it."""
    from voxcpm_triton.audio.stream_audio import StreamAudio

    cfg, vae = vae
    P, D = cfg.patch_size, cfg.feat_dim
    audio = StreamAudio(vae, P, max_streams=8, cuda_graphs=False, graph_patches=(1,),
                        on_failure=lambda key, e: None)
    decode_async, decoded = audio.streams.decode_async, []
    release, launch = threading.Event(), threading.Event()
    launch.set()

    def spy(keys, z):
        assert launch.wait(60)
        decoded.append(tuple(keys))
        return decode_async(keys, z)

    audio.streams.decode_async = spy

    class Blocking(_Receiver):  # holds the audio thread in its first delivery
        def __call__(self, patches, payload, end=None):
            release.wait(60)
            super().__call__(patches, payload, end)

    def timed_fence(mark, timeout):
        t0 = time.monotonic()
        out = audio.fence(mark, timeout)
        return out, time.monotonic() - t0

    try:
        assert timed_fence(audio.mark(), 30)[0] == (True, None)  # nothing queued: done (CPU: no event)
        recv = {k: (Blocking() if k == "held" else _Receiver()) for k in ("held", "first", "a", "b", "slow")}
        for key, r in recv.items():
            audio.open(key, r)
        mark = audio.mark()
        audio.chunk("held", _latents(1, 1, P, D))
        assert timed_fence(mark, 30)[0] == (True, None)
        assert decoded == [("held",)]  # launched (on the CPU: decoded), its delivery still to come
        mark = audio.mark()
        audio.chunk("first", _latents(2, 1, P, D))  # queued while the thread delivers "held"'s chunk
        (launched, _), waited = timed_fence(mark, 30)
        assert not launched and waited < 5 and decoded == [("held",)]  # busy with older work: no 30 s wait
        release.set()
        _wait_until(lambda: recv["first"].chunks)
        assert decoded == [("held",), ("first",)]
        # A wave queued one chunk at a time: a round that took part of it is waited for, and the rest.
        _wait_until(lambda: audio.round_upto is None)
        launch.clear()
        mark = audio.mark()
        audio.chunk("a", _latents(3, 1, P, D))
        _wait_until(lambda: audio.round_upto is not None)  # the thread took "a" alone, and waits to launch it
        audio.chunk("b", _latents(4, 1, P, D))
        got = []
        waiter = threading.Thread(target=lambda: got.append(timed_fence(mark, 30)))
        waiter.start()
        time.sleep(0.3)
        assert waiter.is_alive() and not got  # not given up: that round holds this wave's chunks
        launch.set()
        waiter.join(30)
        assert got and got[0][0] == (True, None)
        assert decoded[2:] == [("a",), ("b",)]
        # A round that took the chunk but is slow to launch it: the fence gives up after its timeout.
        _wait_until(lambda: audio.round_upto is None)
        launch.clear()
        mark = audio.mark()
        audio.chunk("slow", _latents(5, 1, P, D))
        (launched, _), waited = timed_fence(mark, 0.3)
        assert not launched and 0.3 <= waited < 5 and ("slow",) not in decoded
        launch.set()
        for key, r in recv.items():
            audio.end(key, "end")
            assert r.done.wait(60) and len(r.chunks) == 1, key
        # A fence waiting when the thread stops is let go at once, not when the round launches.
        launch.clear()
        audio.open("last", _Receiver())
        mark = audio.mark()
        audio.chunk("last", _latents(6, 1, P, D))
        got = []
        waiter = threading.Thread(target=lambda: got.append(timed_fence(mark, 60)))
        waiter.start()
        time.sleep(0.1)
        threading.Timer(10, launch.set).start()
        stopper = threading.Thread(target=audio.stop)
        stopper.start()
        waiter.join(5)
        assert not waiter.is_alive() and got[0][1] < 5
        launch.set()
        stopper.join(30)
    finally:
        release.set()
        launch.set()
        audio.stop()


def test_stream_audio_drops_the_pending_chunks_of_a_request_cancelled_after_its_end(vae):
    """A request the engine has ended, its end queued behind chunks not yet decoded, then cancelled
    (CANCEL_ID: a review saw 12 such streams decoded for nobody for 40 s on a CPU): its pending
    chunks go undecoded, its end still goes; the other requests' chunks are untouched."""
    from voxcpm_triton.audio.stream_audio import StreamAudio

    cfg, vae = vae
    P, D = cfg.patch_size, cfg.feat_dim
    audio = StreamAudio(vae, P, max_streams=4, cuda_graphs=False, graph_patches=(1, 4),
                        on_failure=lambda key, e: None, rush=False)
    order = []
    try:
        recv, release = _held_round(audio, P, D, order, ("held",), later=(("gone", 0), ("kept", 1)))
        for k in (("gone", 0), ("kept", 1)):
            audio.chunk(k, _latents(7, 2, P, D))
            audio.chunk(k, _latents(8, 1, P, D))
        audio.end(("gone", 0), "stop")  # the engine's own end: its chunks were still wanted then
        assert audio.drop_pending(lambda key: key[0] == "gone") == 2
        assert audio.drop_pending(lambda key: key[0] == "gone") == 0  # nothing left to drop
        release.set()
        assert recv[("gone", 0)].done.wait(60)
        _wait_until(lambda: len(recv[("kept", 1)].chunks) == 2, "the other request's chunks were not delivered")
        assert recv[("gone", 0)].chunks == [] and recv[("gone", 0)].end == "stop"
        _end_all(audio, recv, ("held", ("kept", 1)))
    finally:
        audio.stop()


def test_a_cancel_after_the_engines_end_drops_the_requests_audio_not_yet_decoded():
    """CANCEL_ID for a request the engine no longer holds reaches its audio instead: the decoder
    instance held it while chunks of it wait to be decoded (with several instances the marker is
    then taken), and not once they are all out."""
    from types import SimpleNamespace

    from voxcpm_triton.serving.decoder_model import DecoderModel

    pending = {("r1", 0): 3, ("r2", 1): 2}

    def drop_pending(which):
        n = sum(v for k, v in pending.items() if which(k))
        pending.update({k: 0 for k in pending if which(k)})
        return n

    held = SimpleNamespace(engine=SimpleNamespace(cancel=lambda rid: rid == "running"),
                           audio=SimpleNamespace(drop_pending=drop_pending))
    assert DecoderModel._cancel(held, "running")
    assert DecoderModel._cancel(held, "r1") and pending == {("r1", 0): 0, ("r2", 1): 2}
    assert not DecoderModel._cancel(held, "r1") and not DecoderModel._cancel(held, "other")
    held.audio = None  # decode_audio off: nothing of it here
    assert not DecoderModel._cancel(held, "r2")


def test_the_engine_sink_asks_whether_the_client_left_from_the_second_chunk_on():
    """The engine thread's sink queues a request's first chunk at once (asking the parent process
    whether the client left is an IPC round trip on the way to first audio; the audio thread asks
    before it sends); from the second chunk on a client that left stops the request."""
    from types import SimpleNamespace

    from voxcpm_triton.engine import Finished
    from voxcpm_triton.serving.decoder_sinks import ClientGone, to_audio

    class Sender:
        def __init__(self):
            self.left, self.asked = True, 0

        def is_cancelled(self):
            self.asked += 1
            return self.left

    audio = SimpleNamespace(chunks=[], ends=[])
    audio.chunk = lambda key, patches: audio.chunks.append((key, patches))
    audio.end = lambda key, end, drop_pending=False: audio.ends.append((key, end, drop_pending))
    sender = Sender()
    deliver = to_audio(sender, audio, "k")
    chunk = SimpleNamespace(patches=torch.zeros(1, 2, 3))
    deliver(chunk)
    assert sender.asked == 0 and [k for k, _ in audio.chunks] == ["k"]
    with pytest.raises(ClientGone):
        deliver(chunk)
    assert sender.asked == 1 and len(audio.chunks) == 1
    failed = Finished("k", "error", 2, "output delivery failed")  # the engine's end for a client gone
    deliver(failed)
    assert audio.ends == [("k", failed, True)]  # its chunks not yet decoded are dropped
    sender.left = False  # a client still there: every later chunk is asked about and queued
    other = to_audio(sender, audio, "j")
    for _ in range(3):
        other(chunk)
    assert sender.asked == 3 and [k for k, _ in audio.chunks] == ["k", "j", "j", "j"]
    # Its end: a cancel (CANCEL_ID) drops what is not decoded yet; the shutdown's cancel, with its
    # error, and any other end keep it (their clients still listen)
    for end, drop in ((Finished("j", "cancelled", 4), True), (Finished("j", "cancelled", 4, "shutting down"), False),
                      (Finished("j", "stop", 4), False), (Finished("j", "error", 4, "decode failed"), False)):
        other(end)
        assert audio.ends[-1] == ("j", end, drop)


def test_the_channel_sink_hands_chunks_and_the_end_to_the_callers_channel():
    """With the caller's audio channel the audio thread's sink only queues: each chunk, then the
    request's end (None when it ended well, the engine's error, or its audio's failure)."""
    from types import SimpleNamespace

    from voxcpm_triton.engine import Finished
    from voxcpm_triton.serving.decoder_sinks import audio_sink

    calls = []
    sender = SimpleNamespace(channel=object(), chunk=lambda n, audio: calls.append(("chunk", n, audio.size)),
                             end=lambda error: calls.append(("end", error)))
    deliver = audio_sink(sender)
    patches, audio = torch.zeros(4, 2, 3), np.zeros(4 * HOP, np.float32)
    deliver(patches, audio)
    deliver(patches, audio, Finished("k", "stop", 8))  # the last chunk with its end
    deliver(None, Finished("k", "error", 8, "the engine failed"))  # an end alone, with an error
    deliver(None, RuntimeError("no GPU"))  # the audio's own failure
    assert calls == [("chunk", 4, 4 * HOP), ("chunk", 4, 4 * HOP), ("end", None), ("end", "the engine failed"),
                     ("end", "decoding audio failed: no GPU")]


def test_the_engine_sink_stops_a_request_whose_callers_channel_broke_and_never_asks_the_server():
    """A channel call: a caller gone breaks the channel; the call itself is never cancelled (the
    orchestrator sends CANCEL_ID), so whether it was is not asked (an IPC round trip a chunk)."""
    from types import SimpleNamespace

    from voxcpm_triton.engine import Finished
    from voxcpm_triton.serving.bls import audio_channel
    from voxcpm_triton.serving.decoder_sinks import ClientGone, to_audio

    audio = SimpleNamespace(chunks=[])
    audio.chunk = lambda key, patches: audio.chunks.append(key)
    asked = []
    sender = SimpleNamespace(channel=SimpleNamespace(broken=False), is_cancelled=lambda: asked.append(1) or False)
    deliver = to_audio(sender, audio, "k")
    chunk = SimpleNamespace(patches=torch.zeros(1, 2, 3))
    deliver(chunk)
    deliver(chunk)
    sender.channel.broken = True
    with pytest.raises(ClientGone, match=audio_channel.LOST):
        deliver(chunk)
    assert audio.chunks == ["k", "k"] and asked == []
    audio.end = lambda key, end, drop_pending=False: audio.ends.append((key, drop_pending))
    audio.ends = []
    deliver(Finished("k", "error", 3, "output delivery failed"))
    assert audio.ends == [("k", True)]  # a broken channel's request: its chunks not decoded yet are dropped
    first = to_audio(sender, audio, "j")
    with pytest.raises(ClientGone, match=audio_channel.LOST):  # broken before its first chunk: none decoded
        first(chunk)
    assert audio.chunks == ["k", "k"]


def test_a_channel_call_is_answered_and_opened_before_its_request_reaches_the_engine(monkeypatch):
    """The empty first response, then the channel's Opened frame, before the engine can make audio:
    the final response (after the end frame) can never come before the first."""
    from types import SimpleNamespace

    from voxcpm_triton.engine import EngineRequest
    from voxcpm_triton.serving import decoder_model, decoder_sinks
    from voxcpm_triton.serving.decoder_model import DecoderModel

    order = []
    monkeypatch.setattr(decoder_sinks, "to_audio", lambda sender, audio, key: None)
    monkeypatch.setattr(decoder_model, "pb", lambda: SimpleNamespace(
        InferenceResponse=lambda output_tensors: ("response", tuple(output_tensors))))
    sender = SimpleNamespace(channel=object(), send=lambda response: order.append(response),
                             open=lambda: order.append("opened"))
    model = SimpleNamespace(audio=SimpleNamespace(open=lambda key, sink, context: order.append("audio")),
                            engine=SimpleNamespace(submit=lambda req, sink: order.append("engine")),
                            keys=iter(range(3)))
    DecoderModel._submit(model, EngineRequest(request_id="r", prompt=[1, 2]), sender, None)
    assert order == [("response", ()), "opened", "audio", "engine"]
