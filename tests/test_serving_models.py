"""The Triton model classes driven directly, with a minimal stand-in for triton_python_backend_utils.

What a real server cannot show deterministically: how one execute() call with
several streams' requests is batched, and how stream state is kept and dropped.
(The real server runs the same classes in tests/test_server.py.)
"""

import json
import sys
import types

import numpy as np
import pytest
import torch

from voxcpm_triton.loading import load_audio_vae


class FakeTensor:
    def __init__(self, name, array):
        self._name, self._array = name, np.asarray(array)

    def name(self):
        return self._name

    def as_numpy(self):
        return self._array


class FakeResponse:
    def __init__(self, output_tensors=None, error=None):
        self.outputs = {t.name(): t.as_numpy() for t in (output_tensors or [])}
        self.error = error


class FakeError(Exception):
    INVALID_ARG, INTERNAL, UNAVAILABLE, UNSUPPORTED = "INVALID_ARG", "INTERNAL", "UNAVAILABLE", "UNSUPPORTED"

    def __init__(self, msg, code=None):
        super().__init__(msg)
        self.code = code


class FakeMetric:
    def __init__(self):
        self.value = 0.0

    def set(self, v):
        self.value = v

    def increment(self, v):
        self.value += v


class FakeFamily:
    GAUGE, COUNTER = "GAUGE", "COUNTER"

    def __init__(self, name, description, kind):
        self.name = name

    def Metric(self, labels):  # noqa: N802 - pb_utils' spelling
        return FakeMetric()


KEY = "test-internal-key"


class FakeRequest:
    def __init__(self, key=KEY, **inputs):
        self.inputs = {k: FakeTensor(k, v) for k, v in inputs.items()}
        self._parameters = json.dumps({"voxcpm_internal_key": key} if key else {})

    def parameters(self):
        return self._parameters


@pytest.fixture()
def fake_pb(monkeypatch, tmp_path):
    from voxcpm_triton.serving import triton_io

    monkeypatch.setenv("VOXCPM_RUN_DIR", str(tmp_path))
    monkeypatch.setenv("VOXCPM_INTERNAL_KEY", KEY)
    triton_io._internal_key.cache_clear()
    mod = types.ModuleType("triton_python_backend_utils")
    mod.Tensor = FakeTensor
    mod.InferenceResponse = FakeResponse
    mod.TritonError = FakeError
    mod.MetricFamily = FakeFamily
    mod.get_input_tensor_by_name = lambda req, name: req.inputs.get(name)
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", mod)
    return mod


def _args(ckpt, **params):
    cfg = {"parameters": {"checkpoint": {"string_value": ckpt}, "device": {"string_value": "cpu"},
                          **{k: {"string_value": v} for k, v in params.items()}}}
    return {"model_config": json.dumps(cfg), "model_name": "vae_decoder"}


def _chunk(corrid, lat, start=False, end=False, context=None, key=KEY):
    inputs = dict(CORRID=np.array([[corrid]], np.uint64), START=np.array([[int(start)]], np.int32),
                  END=np.array([[int(end)]], np.int32), LATENTS=lat[None].astype(np.float32))
    if context is not None:
        inputs["CONTEXT"] = context[None].astype(np.float32)
    return FakeRequest(key=key, **inputs)


def test_vae_decoder_batches_streams_and_keeps_their_state(fake_pb, checkpoint_dirs, monkeypatch):
    from voxcpm_triton.serving.vae_models import VAEDecoderModel

    ckpt = checkpoint_dirs["real_shaped"]
    model = VAEDecoderModel()
    model.initialize(_args(ckpt))
    _, vae = load_audio_vae(ckpt, "cpu")
    P, D = model.cfg.patch_size, model.cfg.feat_dim
    rng = np.random.default_rng(0)
    streams = {c: rng.standard_normal((7, P, D)).astype(np.float32) for c in (11, 22, 33)}
    ctx = rng.standard_normal((3, P, D)).astype(np.float32)

    batch_sizes = []
    real = model.vae.decode_chunk
    monkeypatch.setattr(model.vae, "decode_chunk", lambda z, *a: batch_sizes.append(z.shape[0]) or real(z, *a))

    # Three streams advance together: chunks of 1, 2 then 4 patches, one execute() per round;
    # stream 33 is a continuation (primed with context patches on START).
    got = {c: [] for c in streams}
    for lo, hi in ((0, 1), (1, 3), (3, 7)):
        reqs = [_chunk(c, s[lo:hi], start=lo == 0, context=ctx if (c == 33 and lo == 0) else None)
                for c, s in streams.items()]
        for c, resp in zip(streams, model.execute(reqs)):
            assert resp.error is None
            got[c].append(resp.outputs["AUDIO"][0])
    # One priming pass for the continuation stream, then one batch of all three per round.
    assert batch_sizes == [1, 3, 3, 3], "equal-length chunks of three streams must decode as one batch"
    assert len(model.streams) == 3 and model.m_streams.pair[1].value == 3

    def whole(lat, context=None):
        frames = lambda x: torch.from_numpy(x).reshape(-1, D).T[None]  # noqa: E731
        z = frames(lat) if context is None else torch.cat([frames(context), frames(lat)], -1)
        audio = vae.decode(z)[0, 0].numpy()
        return audio[(0 if context is None else context.shape[0] * P * vae.decode_chunk_size):]

    for c, lat in streams.items():
        want = whole(lat, ctx if c == 33 else None)
        assert np.abs(np.concatenate(got[c]) - want).max() <= 1e-5

    # END with an empty chunk drops the state, and is harmless for a stream that is not open (its
    # START failed); a chunk of a stream that is not open is an error, not a silent fresh start.
    resps = model.execute([_chunk(c, np.zeros((0, P, D)), end=True) for c in streams] +
                          [_chunk(44, np.zeros((0, P, D)), end=True), _chunk(55, streams[11][:1])])
    assert all(r.error is None and r.outputs["AUDIO"].size == 0 for r in resps[:4])
    assert "sequence 55 has no open VAE stream" in str(resps[4].error)
    assert len(model.streams) == 0 and model.m_streams.pair[1].value == 0
    # Requests without the server's internal key are refused before anything is opened.
    for key in (None, "guess"):
        (r,) = model.execute([_chunk(66, streams[11][:1], start=True, key=key)])
        assert "is internal to the VoxCPM pipeline" in str(r.error) and r.error.code == "UNSUPPORTED"
    assert len(model.streams) == 0

    bad = model.execute([_chunk(5, np.full((1, P, D), np.nan)), _chunk(6, np.zeros((1, P + 1, D))),
                         _chunk(7, np.zeros((257, P, D)), start=True),
                         _chunk(8, np.zeros((1, P, D)), start=True, context=np.zeros((2, P, D + 1))),
                         _chunk(9, np.zeros((1, P, D)), start=True, context=np.full((2, P, D), np.inf))])
    assert "NaN" in str(bad[0].error) and "LATENTS" in str(bad[1].error)
    assert "LATENTS has 257 patches" in str(bad[2].error) and "max_chunk_patches" in str(bad[2].error)
    assert "CONTEXT must be" in str(bad[3].error) and "CONTEXT contains NaN or Inf" in str(bad[4].error)
    # the orchestrator's own inputs, not a client's: not tagged as the client's mistake across the BLS hop
    # (NaN latents come from a model that overflowed)
    assert not any(str(r.error).startswith("[invalid input]") for r in bad), [str(r.error) for r in bad]
    assert len(model.streams) == 0, "a refused START must not open a stream"
    model.finalize()


def test_vae_decoder_drops_abandoned_streams(fake_pb, checkpoint_dirs):
    from voxcpm_triton.serving.vae_models import VAEDecoderModel

    import time

    model = VAEDecoderModel()
    model.initialize(_args(checkpoint_dirs["real_shaped"], stream_idle_timeout_s="1"))
    P, D = model.cfg.patch_size, model.cfg.feat_dim
    # A decode slower than the timeout (a loaded machine): the stream is idle from the end of
    # its chunk, not from its arrival, so it is not dropped as it comes back.
    real = model.streams.decode_async
    model.streams.decode_async = lambda *a: time.sleep(1.2) or real(*a)
    (r,) = model.execute([_chunk(1, np.zeros((1, P, D)), start=True)])
    assert r.error is None
    with model.lock:
        model._drop_idle(time.monotonic())
        assert 1 in model.streams, "a stream must not be dropped for the time its own decode took"
    model.streams.decode_async = real

    deadline = time.monotonic() + 10
    while len(model.streams) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(model.streams) == 0, "a stream that never sent END must be dropped after the idle timeout"
    model.finalize()


def test_vae_decoder_idle_timeout_is_checked_against_the_sequence_batcher(fake_pb, checkpoint_dirs):
    from voxcpm_triton.serving.vae_models import VAEDecoderModel

    args = _args(checkpoint_dirs["real_shaped"], stream_idle_timeout_s="300")
    cfg = json.loads(args["model_config"])
    cfg["sequence_batching"] = {"max_sequence_idle_microseconds": "120000000"}
    args["model_config"] = json.dumps(cfg)
    with pytest.raises(ValueError, match="'stream_idle_timeout_s' of model 'vae_decoder' \\(300\\) must not exceed "
                                         "the sequence batcher's"):
        VAEDecoderModel().initialize(args)
    for bad in ("0", "-1", "nan", "soon"):
        with pytest.raises(ValueError, match="'stream_idle_timeout_s' of model 'vae_decoder' must be a positive number"):
            VAEDecoderModel().initialize(_args(checkpoint_dirs["real_shaped"], stream_idle_timeout_s=bad))


def test_decoder_checks_its_engine_settings_before_loading_anything(fake_pb, monkeypatch, tmp_path):
    """A bad batch or CFM bucket list is said before the checkpoint loads and the audio thread starts
    (on a GPU: its VAE graphs captured first)."""
    from voxcpm_triton.serving import decoder_model
    from voxcpm_triton.serving.bls import callee

    monkeypatch.setattr(callee, "check_callee_config", lambda *a: None)  # not a decoupled config here
    monkeypatch.setattr(decoder_model.runtime, "model_process", lambda: None)
    args = _args(str(tmp_path / "none"), timestep_buckets="4,8,50")
    args["model_name"] = "decoder"
    with pytest.raises(ValueError, match="timestep_buckets must end at"):
        decoder_model.DecoderModel().initialize(args)


def test_tts_stream_finalize_ends_every_open_stream_once(fake_pb):
    """The stub stops the event loop before finalize: streams still open then get an error final
    response from finalize itself, and a stream ended that way is not ended again."""
    import threading

    from voxcpm_triton.serving.tts_models import TTSStreamModel

    fake_pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1

    class Sender:
        def __init__(self):
            self.sent = []

        def send(self, response=None, flags=0):
            self.sent.append((response, flags))

    m = TTSStreamModel()
    m.closing, m.loop, m.streams_lock = False, None, threading.Lock()
    m.beacon = types.SimpleNamespace(stop=lambda: None)  # (initialize makes a real one)
    a, b = Sender(), Sender()
    m.streams = {"task-a": a, "task-b": b}
    m.finalize()
    for s in (a, b):
        ((response, flags),) = s.sent
        assert flags == 1 and "shutting down" in str(response.error) and response.error.code == "UNAVAILABLE"
    assert m.streams == {} and m.closing
    m._end("task-a", None)  # the coroutine finishing late sends nothing more
    assert len(a.sent) == 1


def test_metrics_are_let_go_of_at_finalize_each_before_its_family(fake_pb):
    """python_backend destroys what a model still holds after its shared memory is gone (every
    process with metrics crashed at exit): `release_all` frees them first, each metric before its
    family, and later updates are dropped."""
    from voxcpm_triton.serving import metrics

    freed = []

    class Tracked(FakeMetric):
        def __init__(self, name):
            super().__init__()
            self.name = name

        def __del__(self):
            freed.append(f"metric {self.name}")

    class Family(FakeFamily):
        def Metric(self, labels):  # noqa: N802 - pb_utils' spelling
            return Tracked(self.name)

        def __del__(self):
            freed.append(f"family {self.name}")

    fake_pb.MetricFamily = Family
    a, b = metrics.metric("a", "", {}), metrics.metric("b", "", {}, "COUNTER")
    a.set(2.0)
    b.increment(1.0)
    assert freed == []
    metrics.release_all()
    assert freed == ["metric b", "family b", "metric a", "family a"]
    a.set(3.0)  # after finalize: nothing to record it on, and no error
    b.increment(1.0)
    assert a.pair is None and b.pair is None and metrics._live == []


def test_releasing_metrics_does_not_wait_for_ever_on_a_stuck_stub_call(fake_pb, monkeypatch):
    """A thread stuck in a stub call holds IPC_LOCK (a send the stopping server no longer takes):
    finalize gives up on the metrics after RELEASE_WAIT_S instead of never ending."""
    import threading
    import time

    from voxcpm_triton.serving import metrics
    from voxcpm_triton.serving.triton_io import IPC_LOCK

    monkeypatch.setattr(metrics, "RELEASE_WAIT_S", 0.3)
    m = metrics.metric("c", "", {})
    held, done = threading.Event(), threading.Event()

    def stuck():
        with IPC_LOCK:
            held.set()
            done.wait(10)

    t = threading.Thread(target=stuck)
    t.start()
    try:
        assert held.wait(5)
        t0 = time.monotonic()
        metrics.release_all()
        assert 0.25 < time.monotonic() - t0 < 3 and m.pair is not None  # left, not waited for
    finally:
        done.set()
        t.join()
    metrics.release_all()
    assert m.pair is None


def test_engine_metrics_publish_changes_only_and_the_collectors_pauses(fake_pb):
    """The decoder's metrics: counters grow by what their stats grew, gauges follow their stats, the
    process's garbage collections by generation and its longest pause among them; an update sends
    only what changed (each is a round trip to the server)."""
    from voxcpm_triton.serving import metrics

    calls = []

    class Counted(FakeMetric):
        def set(self, v):
            calls.append("set")
            super().set(v)

        def increment(self, v):
            calls.append("increment")
            super().increment(v)

    class Family(FakeFamily):
        def Metric(self, labels):  # noqa: N802 - pb_utils' spelling
            m = Counted()
            m.labels = labels
            return m

    fake_pb.MetricFamily = Family
    stats = dict(running=2, waiting=0, free_blocks=10, total_blocks=12, cached_blocks=1, steps_per_s=5.0,
                 batch_sizes={2: 3}, steps=3, finished=0, prefix_cache_hits=0, prefix_cache_hit_blocks=0,
                 early_chunks=0, lora_merges=0, first_audio_fences=0, first_audio_fence_misses=0,
                 late_launches=0)
    engine = types.SimpleNamespace(stats=lambda: dict(stats), status=lambda: None)
    gc = types.SimpleNamespace(count=[4, 1, 0], seconds=[0.002, 0.001, 0.0], longest_s=0.001)
    m = metrics.EngineMetrics(engine, {"model": "decoder"}, gc=gc, period_s=3600)
    try:
        m.update()
        stats.update(steps=5, batch_sizes={2: 5})
        gc.count, gc.seconds, gc.longest_s = [9, 1, 1], [0.004, 0.001, 0.4], 0.4
        m.update()
        by = {(n, m_.labels.get("generation")): m_.value for n, m_ in
              ((k, v.pair[1]) for k, v in {**m.gauges, **m.counters}.items())}
        assert by[("steps", None)] == 5 and by[("rows", None)] == 10 and by[("running", None)] == 2
        assert [by[(f"gc_collections_{g}", str(g))] for g in range(3)] == [9, 1, 1]
        assert by[("gc_seconds_2", "2")] == 0.4 and by[("gc_longest", None)] == 0.4
        calls.clear()
        m.update()  # nothing changed: nothing sent
        assert calls == []
    finally:
        m.close()
        metrics.release_all()


class _Sender:
    """A response sender's stand-in: what was sent, as (outputs, error message, flags)."""

    def __init__(self, cancelled=False, fail=False):
        self.sent, self.cancelled, self.fail = [], cancelled, fail

    def is_cancelled(self):
        return self.cancelled

    def send(self, response=None, flags=0):
        if self.fail and response is not None and response.outputs:
            raise RuntimeError("no memory for the output")
        self.sent.append((sorted(response.outputs) if response is not None else [],
                          None if response is None or response.error is None else str(response.error), flags))


@pytest.mark.parametrize("case", ["ends_well", "error", "cancelled", "cancelled_error", "send_fails", "chunk",
                                  "end_alone", "audio_failed"])
def test_decoder_audio_sink_sends_a_last_chunk_with_the_final_flag_only_when_its_request_ended_well(fake_pb, case):
    """The decoder's audio sink (`decode_audio`): a last chunk with a request that ended well goes with
    the final flag, one response; an error, a client that left or a failed send still end the request
    with the flag (and the error) in a response of its own; a chunk alone or an end alone as before."""
    from voxcpm_triton.engine import Finished
    from voxcpm_triton.serving.decoder_sinks import audio_sink

    FINAL = fake_pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
    ok, failed = Finished("r", "stop", 3), Finished("r", "error", 3, "the engine failed")
    sender = _Sender(cancelled=case.startswith("cancelled"), fail=case == "send_fails")
    deliver = audio_sink(sender)
    chunk = (torch.zeros(1, 4, 2), np.zeros(8, np.float32))
    data = ["AUDIO", "LATENTS"]
    if case == "chunk":
        deliver(*chunk)
    elif case == "end_alone":
        deliver(None, ok)
    elif case == "audio_failed":
        deliver(None, RuntimeError("no slot"))
    else:
        deliver(*chunk, failed if case.endswith("error") else ok)
    want = {"ends_well": [(data, None, FINAL)],
            "error": [(data, None, 0), ([], "the engine failed", FINAL)],
            "cancelled": [([], None, FINAL)],
            "cancelled_error": [([], "the engine failed", FINAL)],
            "send_fails": [([], "sending the last audio chunk failed: no memory for the output", FINAL)],
            "chunk": [(data, None, 0)],
            "end_alone": [([], None, FINAL)],
            "audio_failed": [([], "decoding audio failed: no slot", FINAL)]}[case]
    assert sender.sent == want


def test_text_normalizer_without_its_packages_serves_and_refuses_normalize(fake_pb, monkeypatch):
    """Where wetext/inflect/regex are not installed (a bare GPU box), text_normalizer still loads, so
    the server serves, and a NORMALIZE request is refused naming the packages; with them, it answers."""
    from voxcpm_triton.coordination import runtime
    from voxcpm_triton.serving import normalizer_model

    monkeypatch.setattr(runtime, "model_process", lambda: None)
    args = {"model_config": json.dumps({"parameters": {}}), "model_name": "text_normalizer"}
    request = FakeRequest(TEXT=np.array([[b"I paid $5."]], dtype=object))

    def missing():
        raise RuntimeError("text normalisation needs the wetext, inflect and regex packages (requirements.txt): "
                           "No module named 'wetext'")

    installed = normalizer_model.normalizer
    for real in (False, True):
        monkeypatch.setattr(normalizer_model, "normalizer", installed if real else missing)
        model = normalizer_model.TextNormalizerModel()
        model.initialize(args)
        try:
            (response,) = model.execute([request])
        finally:
            model.finalize()
        if real:
            assert response.error is None and response.outputs["NORMALIZED_TEXT"].shape == (1, 1)
            assert response.outputs["NORMALIZED_TEXT"][0, 0].decode() == "I paid five dollars."
        else:
            assert response.error is not None and response.error.code == FakeError.INVALID_ARG
            assert "NORMALIZE is not available on this server" in str(response.error) and "wetext" in str(response.error)


def test_the_kept_lora_set_is_the_one_loaded_when_changes_overlap(fake_pb, monkeypatch):
    """An add whose keeping of the loaded set (run_state.save_loras) is overtaken by a remove's: each
    kept the set as its own change left it, the last writer winning, so a restart would load the
    adapter the remove had dropped. The set kept is now read when it is written, one at a time."""
    import threading
    import time

    from voxcpm_triton.coordination import run_state
    from voxcpm_triton.serving import decoder_model

    fake_pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
    loaded, added = {"a"}, threading.Event()

    class Engine:
        loras = object()

        def lora_names(self):
            return sorted(loaded)

        def add_lora(self, name):
            loaded.add(name)
            added.set()
            return sorted(loaded)

        def remove_lora(self, name):
            loaded.discard(name)
            return sorted(loaded)

    kept, first = [], threading.Event()

    def save(names):
        if not first.is_set():  # the add's: slow enough for the remove to come in between
            first.set()
            time.sleep(0.5)
        kept.append(list(names))

    monkeypatch.setattr(run_state, "save_loras", save)
    sent = []

    class Sender:
        def send(self, response, flags=0):
            sent.append(response)

    model = decoder_model.DecoderModel.__new__(decoder_model.DecoderModel)
    model.engine, model.peers, model.lora_dir = Engine(), None, None
    model._loras_saving = threading.Lock()
    model._lora_action("add", "b", Sender())  # in a thread of its own
    assert added.wait(10)
    model._lora_action("remove", "b", Sender())
    deadline = time.monotonic() + 10
    while len(sent) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(sent) == 2 and all(r.error is None and "LORAS" in r.outputs for r in sent), sent
    assert kept[-1] == ["a"] == Engine().lora_names(), kept
