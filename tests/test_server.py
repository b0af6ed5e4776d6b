"""The whole product through a real tritonserver on loopback (tiny checkpoint, CPU)."""

import os
import queue
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from tests.conftest import require_module  # noqa: E402

tritonclient = require_module("tritonclient", "tritonclient[all] in requirements.txt")
import tritonclient.grpc as grpcclient  # noqa: E402
import tritonclient.http as httpclient  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from tests.conftest import sine_wave  # noqa: E402
from tests.server import (  # noqa: E402,F401
    TritonServer, _children, _cmdline, remove_shm_regions, triton_env, triton_server_factory)
from voxcpm_triton.testing.checkpoint_writer import TINY_CONFIG, write_checkpoint  # noqa: E402

TOL = 1e-4
HOP = TINY_CONFIG["patch_size"] * 1920  # samples per patch at 48 kHz


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_checkpoint(str(tmp_path_factory.mktemp("served_ckpt")), TINY_CONFIG, seed=3, progress=None)


@pytest.fixture(scope="module")
def server(triton_server_factory, ckpt):  # noqa: F811
    return triton_server_factory("model_repository", env={"VOXCPM_CHECKPOINT": ckpt})


@pytest.fixture(scope="module")
def offline(ckpt):
    from voxcpm_triton import VoxCPM2

    return VoxCPM2.from_pretrained(ckpt, device="cpu", dtype="float32")


def _inputs(mod, text, **params):
    """Contract inputs for tritonclient's http or grpc module."""
    specs = {"TEXT": ("BYTES", np.array([text.encode() if isinstance(text, str) else text], dtype=object))}
    kinds = {"CFG_VALUE": ("FP32", np.float32), "INFERENCE_TIMESTEPS": ("INT32", np.int32),
             "MIN_LENGTH": ("INT32", np.int32), "MAX_LENGTH": ("INT32", np.int32), "SEED": ("INT64", np.int64),
             "REFERENCE_SAMPLE_RATE": ("INT32", np.int32), "PROMPT_SAMPLE_RATE": ("INT32", np.int32)}
    for name, value in params.items():
        if isinstance(value, tuple):  # a raw (datatype, array) pair, for malformed-input tests
            specs[name] = value
        elif name in kinds:
            dt, np_t = kinds[name]
            specs[name] = (dt, np.array([value], dtype=np_t))
        elif name == "PROMPT_TEXT":
            specs[name] = ("BYTES", np.array([value.encode()], dtype=object))
        else:  # audio
            specs[name] = ("FP32", np.asarray(value, dtype=np.float32))
    out = []
    for name, (dt, arr) in specs.items():
        t = mod.InferInput(name, list(arr.shape), dt)
        t.set_data_from_numpy(arr)
        out.append(t)
    return out


def tts_http(server, text, **params):
    c = httpclient.InferenceServerClient(server.http_url, network_timeout=300)
    try:
        r = c.infer("tts", _inputs(httpclient, text, **params))
    finally:
        c.close()
    return r.as_numpy("AUDIO"), int(r.as_numpy("SAMPLE_RATE")[0])


def tts_stream(server, text, stop_after=None, **params):
    """Chunks from a gRPC stream on tts_stream; stop_after=N cancels after N chunks."""
    return stream_infer(server, "tts_stream", _inputs(grpcclient, text, **params), stop_after)


def grpc_input(name: str, datatype: str, arr: np.ndarray):
    """A gRPC request input holding `arr`."""
    t = grpcclient.InferInput(name, list(arr.shape), datatype)
    t.set_data_from_numpy(arr)
    return t


def stream_infer(server, model, inputs, stop_after=None, output="AUDIO", parameters=None):
    q: queue.Queue = queue.Queue()
    c = grpcclient.InferenceServerClient(server.grpc_url)
    c.start_stream(callback=lambda result, error: q.put((result, error)))
    c.async_stream_infer(model, inputs, enable_empty_final_response=True, parameters=parameters)
    chunks = []
    try:
        while True:
            result, error = q.get(timeout=300)
            if error is not None:
                raise error
            data = result.as_numpy(output)  # a final response may carry the last chunk (the decoder's)
            if data is not None:
                chunks.append(data)
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
            if stop_after is not None and len(chunks) >= stop_after:
                break
    finally:
        c.stop_stream(cancel_requests=stop_after is not None)
        c.close()
    return chunks


def metric_samples(server) -> list[tuple[str, dict, float]]:
    """Every labelled sample on the server's metrics endpoint: (name, labels, value)."""
    text = urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()
    return [(name, dict(re.findall(r'(\w+)="([^"]*)"', labels)), float(v))
            for name, labels, v in re.findall(r'^(\w+)\{([^}]*)\} ([0-9.eE+-]+)$', text, re.M)]


def metrics(server) -> dict:
    """name -> value of the voxcpm_ metrics (one series each here: a single instance per model)."""
    return {name: v for name, _, v in metric_samples(server) if name.startswith("voxcpm_")}


def test_http_infer_returns_audio_of_the_expected_length(server):
    audio, rate = tts_http(server, "Hello from the tiny model.", SEED=5, MIN_LENGTH=7, MAX_LENGTH=7)
    assert rate == 48000
    assert audio.dtype == np.float32 and audio.shape == (7 * HOP,)
    assert np.isfinite(audio).all() and np.abs(audio).max() > 0


def test_stream_chunks_concatenate_to_the_whole_utterance_and_match_offline(server, offline):
    params = dict(SEED=11, MIN_LENGTH=12, MAX_LENGTH=12, CFG_VALUE=1.8, INFERENCE_TIMESTEPS=6)
    chunks = tts_stream(server, "Streaming should match the whole thing.", **params)
    whole, _ = tts_http(server, "Streaming should match the whole thing.", **params)
    assert len(chunks) >= 2 and chunks[0].shape == (HOP,)  # first chunk: one patch
    streamed = np.concatenate(chunks)
    assert streamed.shape == whole.shape
    assert np.abs(streamed - whole).max() <= TOL
    want = offline.generate("Streaming should match the whole thing.", seed=11, min_len=12, max_len=12,
                            cfg_value=1.8, inference_timesteps=6)
    assert np.abs(whole - want).max() <= TOL


def test_playback_margin_sends_a_streams_patches_early_but_not_ttss(triton_server_factory, ckpt, tmp_path):  # noqa: F811
    """A margin no client can reach: tts_stream gets every patch as its own chunk (the decoder's
    early chunks counted), the same audio; tts, answered once at the end, sends PLAYBACK false and
    gets the schedule's chunks (no early chunk counted)."""
    from tests.server import edited_repository

    repo = edited_repository(tmp_path / "repo", parameters={"decoder": {"playback_margin_ms": "1000000"}})
    srv = triton_server_factory(repo, env={"VOXCPM_CHECKPOINT": ckpt})
    params = dict(SEED=11, MIN_LENGTH=12, MAX_LENGTH=12)
    early = lambda: metrics(srv).get("voxcpm_early_chunks_total", 0)  # noqa: E731
    whole, _ = tts_http(srv, "Early chunks, same audio.", **params)
    time.sleep(0.6)  # metrics are published a few times a second
    assert early() == 0
    chunks = tts_stream(srv, "Early chunks, same audio.", **params)
    assert [c.shape for c in chunks] == [(HOP,)] * 12
    assert np.abs(np.concatenate(chunks) - whole).max() <= TOL
    deadline = time.monotonic() + 10
    while early() != 10:  # 12 chunks: the first and the last go by the schedule
        assert time.monotonic() < deadline, early()
        time.sleep(0.2)


def test_http_generate_stream_sends_audio_events(server):
    """Triton's HTTP generate_stream (server-sent events) on the decoupled model, for clients without gRPC."""
    import json

    body = {"TEXT": "Streaming over plain HTTP.", "SEED": 4, "MIN_LENGTH": 6, "MAX_LENGTH": 6}
    req = urllib.request.Request(f"http://{server.http_url}/v2/models/tts_stream/generate_stream",
                                 data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        events = [json.loads(line[5:]) for line in (x.decode().strip() for x in r) if line.startswith("data:")]
    chunks = [np.asarray(e["AUDIO"], np.float32) for e in events]
    # One patch first; the rest by the schedule (4, then the last 1), or sooner where a loaded CPU
    # made the client run low (the playback margin): whole patches either way.
    sizes = [c.size for c in chunks]
    assert sizes[0] == HOP and sum(sizes) == 6 * HOP and all(n % HOP == 0 for n in sizes), sizes
    assert all(e["SAMPLE_RATE"] == 48000 for e in events)
    whole, _ = tts_http(server, "Streaming over plain HTTP.", SEED=4, MIN_LENGTH=6, MAX_LENGTH=6)
    assert np.abs(np.concatenate(chunks) - whole).max() <= TOL
    bad = urllib.request.Request(f"http://{server.http_url}/v2/models/tts_stream/generate_stream",
                                 data=json.dumps({"TEXT": " "}).encode())
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(bad, timeout=60)
    assert info.value.code == 400 and b"TEXT is empty" in info.value.read()


def test_a_key_that_names_no_input_is_refused_by_name(server):
    """Over generate / generate_stream Triton makes a key that names no input a request parameter,
    which the models never read: a misspelt MAX_LENGTH gave a default-length utterance without a
    word (a review). The public models refuse parameters they do not take, naming them, on every
    path; Triton's own (a gRPC stream's empty-final-response flag) still pass."""
    import json

    for model, body, named in [
        ("tts_stream", {"TEXT": "Hi.", "MAX_LENGHT": 1, "SEEED": 5}, b"'MAX_LENGHT', 'SEEED'"),
        ("tts", {"TEXT": "Hi.", "seed": 1}, b"'seed'"),
        ("voices", {"ACTION": "list", "NAMES": "x"}, b"'NAMES'"),
        ("loras", {"ACTION": "list", "Name": "x"}, b"'Name'"),
    ]:
        path = "generate_stream" if model == "tts_stream" else "generate"
        req = urllib.request.Request(f"http://{server.http_url}/v2/models/{model}/{path}", data=json.dumps(body).encode())
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(req, timeout=60)
        message = info.value.read()
        assert info.value.code == 400 and b"unknown request parameter" in message and named in message, message
    # tritonclient's own parameters, over gRPC
    inputs = _inputs(grpcclient, "Hi.", SEED=1, MIN_LENGTH=2, MAX_LENGTH=2)
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        with pytest.raises(Exception) as info:
            c.infer("tts", inputs, parameters={"max_length": 1})
        assert "unknown request parameter 'max_length'" in str(info.value)
    assert np.concatenate(stream_infer(server, "tts_stream", inputs)).size == 2 * HOP


def test_streams_that_fail_at_once_leave_no_future_in_the_stub(server):
    """A stream that fails before it awaits anything (an unknown VOICE) ends its execute at once:
    were that before the stub registered the execute, the stub would log an error and keep the
    finished future for ever (triton-inference-server/server#8537). Several clients at once, with
    other streams running, as under load. (A race: without the fix this run logged the error dozens
    of times on the 2-core CI machine, but a run can miss it.)"""
    start = len(server.log)
    stop = time.monotonic() + 4
    errors, done, failed = [], [], []

    def unknown_voice():
        while time.monotonic() < stop:
            try:
                tts_stream(server, "Nobody speaks.", VOICE=("BYTES", np.array([b"nobody"], dtype=object)))
            except InferenceServerException as e:
                errors.append("unknown voice 'nobody'" in e.message())

    def real():
        while time.monotonic() < stop:
            try:
                done.append(len(tts_stream(server, "Somebody does.", SEED=1, MIN_LENGTH=4, MAX_LENGTH=4)))
            except Exception as e:  # noqa: BLE001 - reported below
                failed.append(e)

    threads = [threading.Thread(target=f) for f in (unknown_voice,) * 4 + (real,) * 2]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads) and not failed, failed
    assert errors and all(errors) and done
    assert "Cannot remove future from background" not in server.log[start:]


def test_concurrent_streams_each_equal_their_solo_result(server):
    texts = ["First voice.", "Second one, a bit longer than the first.", "三号。", "Fourth!",
             "Fifth stream here.", "Six.", "Seventh sentence of the set.", "Eight is enough."]
    jobs = [dict(text=t, SEED=100 + i, MIN_LENGTH=3 + i, MAX_LENGTH=3 + 2 * i) for i, t in enumerate(texts)]
    solo = [np.concatenate(tts_stream(server, j["text"], **{k: v for k, v in j.items() if k != "text"}))
            for j in jobs]
    def run(i):
        j = jobs[i]
        results[i] = np.concatenate(tts_stream(server, j["text"], **{k: v for k, v in j.items() if k != "text"}))

    # Two waves: a new group of streams arriving after the first has finished once crashed
    # the Python backend stub (concurrent stub calls from tts_stream's threads).
    for wave in range(2):
        results = [None] * len(jobs)
        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        for got, want in zip(results, solo):
            assert got is not None and got.shape == want.shape, f"wave {wave}"
            assert np.abs(got - want).max() <= TOL, f"wave {wave}"
    # An async execute that returns before the stub registers it logs this error (python_backend's
    # race, triton-inference-server/server#8537): tts_stream's execute lasts as long as its streams.
    assert "Cannot remove future from background" not in server.log
    # Every decoder call was read as far as the decoder counted, none by a thread waiting in
    # Triton's response iterator (serving/bls/: that can deadlock the process).
    reads = {labels["read"]: v for name, labels, v in metric_samples(server)
             if name == "voxcpm_decoder_calls_read_total" and labels["model"] == "tts_stream"}
    assert reads["counted"] >= 3 * len(jobs) and reads["waiting"] == 0, reads


def test_reference_and_continuation_requests(server, offline):
    ref = sine_wave(0.6, 24000, 200.0, 5)
    prm = sine_wave(0.4, 16000, 310.0, 6)
    cases = {
        "reference": dict(REFERENCE_AUDIO=ref, REFERENCE_SAMPLE_RATE=24000),
        "continuation": dict(PROMPT_AUDIO=prm, PROMPT_SAMPLE_RATE=16000, PROMPT_TEXT="Earlier."),
        "combined": dict(REFERENCE_AUDIO=ref, REFERENCE_SAMPLE_RATE=24000, PROMPT_AUDIO=prm,
                         PROMPT_SAMPLE_RATE=16000, PROMPT_TEXT="Earlier."),
    }
    for name, audio_in in cases.items():
        got, _ = tts_http(server, "Cloned words.", SEED=9, MIN_LENGTH=6, MAX_LENGTH=6, **audio_in)
        kw = {}
        if "REFERENCE_AUDIO" in audio_in:
            kw.update(reference_audio=ref, reference_sample_rate=24000)
        if "PROMPT_AUDIO" in audio_in:
            kw.update(prompt_audio=prm, prompt_sample_rate=16000, prompt_text="Earlier.")
        want = offline.generate("Cloned words.", seed=9, min_len=6, max_len=6, **kw)
        assert got.shape == want.shape == (6 * HOP,), name
        assert np.abs(got - want).max() <= TOL, name
        streamed = np.concatenate(tts_stream(server, "Cloned words.", SEED=9, MIN_LENGTH=6, MAX_LENGTH=6, **audio_in))
        assert np.abs(streamed - got).max() <= TOL, name


def idle(m: dict) -> bool:
    """No request running, every KV block free, no VAE stream state held (vae_decoder's, and the
    decoder's own with decode_audio)."""
    return (m["voxcpm_engine_running_requests"] == 0 and m["voxcpm_kv_blocks_free"] == m["voxcpm_kv_blocks_total"]
            and m["voxcpm_vae_streams"] == 0 and m.get("voxcpm_decoder_audio_streams", 0) == 0)


def wait_idle(server, timeout=60) -> dict:
    """Metrics are published a few times a second: poll until the server is idle."""
    deadline = time.monotonic() + timeout
    while not idle(m := metrics(server)):
        assert time.monotonic() < deadline, f"state not released: {m}"
        time.sleep(0.2)
    return m


def test_client_leaving_mid_stream_releases_kv_blocks_and_vae_state(server):
    wait_idle(server)
    chunks = tts_stream(server, "A long utterance that the client abandons.", stop_after=3,
                        SEED=1, MIN_LENGTH=2000, MAX_LENGTH=2000)
    assert len(chunks) == 3
    steps_before = metrics(server)["voxcpm_engine_decode_steps_total"]
    m = wait_idle(server)
    assert m["voxcpm_engine_decode_steps_total"] - steps_before < 1500, "decoding went on after the client left"


def test_client_leaving_right_after_sending_stops_its_request(server):
    """A client gone before its request reached the decoder (during the tokenizer call, or while
    the decoder call is queued) still stops it: the orchestrator looks before it calls the decoder
    and cancels a call it has started. (Without that cancel the whole 1,500 steps run.)"""
    for delay in (0.0, 0.02, 0.2):
        wait_idle(server)
        steps_before = metrics(server)["voxcpm_engine_decode_steps_total"]
        c = grpcclient.InferenceServerClient(server.grpc_url)
        c.start_stream(callback=lambda result, error: None)
        c.async_stream_infer("tts_stream", _inputs(grpcclient, "An utterance nobody waits for.", SEED=4,
                                                   MIN_LENGTH=1500, MAX_LENGTH=1500))
        time.sleep(delay)
        c.stop_stream(cancel_requests=True)
        c.close()
        time.sleep(2)  # time for the request to reach the decoder, were it going to run
        m = wait_idle(server)
        steps = m["voxcpm_engine_decode_steps_total"] - steps_before
        assert steps < 750, f"decoding went on: {steps:.0f} of 1,500 steps after the client left at {delay} s"


def first_audio_phases(server) -> dict:
    """One tts_stream request's first-audio phases (prepare, decoder, vae: seconds), checked to add
    up to its time to first audio."""
    names = ("voxcpm_time_to_first_audio_seconds_sum", "voxcpm_time_to_first_audio_seconds_count",
             "voxcpm_time_to_first_audio_phase_seconds_sum")

    def read():  # per metric: {frozenset of its labels: value}, tts_stream's series
        out = {n: {} for n in names}
        for name, labels, v in metric_samples(server):
            if name in out and labels.get("model") == "tts_stream":
                out[name][frozenset(labels.items())] = v
        return out

    before = read()
    tts_stream(server, "Where does first audio go?", SEED=3, MIN_LENGTH=3, MAX_LENGTH=3)
    after = read()
    delta = {n: {k: after[n][k] - before[n].get(k, 0.0) for k in after[n]} for n in names}
    assert list(delta[names[1]].values()) == [1.0]
    phases = {dict(k)["phase"]: v for k, v in delta[names[2]].items()}
    assert set(phases) == {"prepare", "decoder", "vae"} and phases["prepare"] > 0 and phases["decoder"] > 0, phases
    total = list(delta[names[0]].values())[0]
    assert abs(sum(phases.values()) - total) <= 1e-3 * total, (phases, total)
    return phases


def test_first_audio_phases_add_up_to_the_time_to_first_audio(server):
    """The orchestrator's first-audio metrics: the phases (prepare, decoder, vae) of each request
    sum to its time to first audio. The decoder makes the audio (decode_audio, the default): no vae
    phase (tests/test_vae_decoder_pipeline.py has the other pipeline's)."""
    assert first_audio_phases(server)["vae"] == 0.0


BAD = [
    ("empty TEXT", dict(text=""), "TEXT is empty"),
    ("blank TEXT", dict(text="   "), "TEXT is empty"),
    ("invisible TEXT", dict(text="\u200b\ufeff\u200d "), "TEXT is empty"),
    ("TEXT too long", dict(text="a" * 5000), "limit is 4096"),
    ("non-UTF-8 TEXT", dict(text=b"\xff\xfe bad"), "not valid UTF-8"),
    ("CFG_VALUE wrong dtype", dict(CFG_VALUE=("FP64", np.array([2.0]))), "CFG_VALUE"),
    ("SEED wrong shape", dict(SEED=("INT64", np.array([1, 2], np.int64))), "SEED"),
    ("NaN reference", dict(REFERENCE_AUDIO=np.array([0.1, np.nan, 0.2] * 100), REFERENCE_SAMPLE_RATE=16000),
     "NaN or Inf"),
    ("empty reference", dict(REFERENCE_AUDIO=np.zeros(0), REFERENCE_SAMPLE_RATE=16000), "REFERENCE_AUDIO is empty"),
    ("reference without rate", dict(REFERENCE_AUDIO=np.zeros(1600)), "needs REFERENCE_SAMPLE_RATE"),
    ("absurd rate", dict(REFERENCE_AUDIO=np.zeros(1600), REFERENCE_SAMPLE_RATE=7), "REFERENCE_SAMPLE_RATE 7"),
    ("huge rate", dict(PROMPT_AUDIO=np.zeros(1600), PROMPT_SAMPLE_RATE=10**8, PROMPT_TEXT="x"), "PROMPT_SAMPLE_RATE"),
    ("prompt audio without text", dict(PROMPT_AUDIO=np.zeros(1600), PROMPT_SAMPLE_RATE=16000), "PROMPT_TEXT"),
    ("prompt text without audio", dict(PROMPT_TEXT="hello"), "PROMPT_AUDIO"),
    ("blank PROMPT_TEXT", dict(PROMPT_AUDIO=np.zeros(1600), PROMPT_SAMPLE_RATE=16000, PROMPT_TEXT=" \n"),
     "PROMPT_TEXT is empty"),
    ("CFG out of range", dict(CFG_VALUE=100.0), "CFG_VALUE"),
    ("CFG NaN", dict(CFG_VALUE=float("nan")), "CFG_VALUE"),
    ("timesteps zero", dict(INFERENCE_TIMESTEPS=0), "INFERENCE_TIMESTEPS"),
    ("timesteps huge", dict(INFERENCE_TIMESTEPS=10000), "INFERENCE_TIMESTEPS"),
    ("negative MIN_LENGTH", dict(MIN_LENGTH=-1), "MIN_LENGTH"),
    ("zero MAX_LENGTH", dict(MAX_LENGTH=0), "MAX_LENGTH"),
    ("MIN over MAX", dict(MIN_LENGTH=9, MAX_LENGTH=3), "MIN_LENGTH (9) is larger than MAX_LENGTH (3)"),
    ("MIN over the default MAX", dict(MIN_LENGTH=2000),
     "MIN_LENGTH (2000) is larger than the default MAX_LENGTH for this text"),
    ("prompt past the model's length", dict(text="9" * 4000, NORMALIZE=("BOOL", np.array([True]))),
     "NORMALIZE wrote TEXT (4000 bytes) out as"),
    ("prompt past the model's positions", dict(text="Hi.", PROMPT_AUDIO=np.zeros(16000), PROMPT_SAMPLE_RATE=16000,
                                               PROMPT_TEXT="\N{GRINNING FACE}" * 1024),
     "tokens, PROMPT_TEXT's or the voice's transcript's"),
    ("MAX beyond context", dict(MAX_LENGTH=1_000_000), "MAX_LENGTH"),
    ("MAX at INT32 max", dict(MAX_LENGTH=2**31 - 1),
     "MAX_LENGTH 2147483647 is more than the 4095 positions the model's context of 4096 leaves after the shortest prompt"),
    ("MIN at INT32 max alone", dict(MIN_LENGTH=2**31 - 1),
     "MIN_LENGTH 2147483647 is more than the 4095 positions the model's context of 4096 leaves after the shortest prompt"),
    ("MAX under the default MIN", dict(MAX_LENGTH=1), "MAX_LENGTH (1) is less than the default MIN_LENGTH (2)"),
    ("NORMALIZE wrong dtype", dict(NORMALIZE=("INT32", np.array([1], np.int32))), "NORMALIZE"),
    ("NORMALIZE two values", dict(NORMALIZE=("BOOL", np.array([True, False]))), "NORMALIZE"),
    ("nothing left after NORMALIZE", dict(text="😀 😀", NORMALIZE=("BOOL", np.array([True]))),
     "nothing is left to speak"),
    ("NORMALIZE fails on the text", dict(text="x² and 3²", NORMALIZE=("BOOL", np.array([True]))),
     "NORMALIZE: text normalisation failed: wetext's English grammar cannot parse this text"),
    ("reference whose encoding overflows", dict(REFERENCE_AUDIO=np.full(16000, 3e38), REFERENCE_SAMPLE_RATE=16000),
     "REFERENCE_AUDIO: its encoding overflows"),
    ("prompt whose encoding overflows", dict(PROMPT_AUDIO=np.full(16000, -3e38), PROMPT_SAMPLE_RATE=16000,
                                             PROMPT_TEXT="x"), "PROMPT_AUDIO: its encoding overflows"),
]


INVALID_ARG = {"http": "400", "grpc": "StatusCode.INVALID_ARGUMENT"}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bad_input_gets_a_clear_error_and_the_server_stays_healthy(server, protocol):
    mod = httpclient if protocol == "http" else grpcclient
    url = server.http_url if protocol == "http" else server.grpc_url
    c = mod.InferenceServerClient(url)
    for name, params, expect in BAD:
        params = dict(params)
        text = params.pop("text", "Valid text.")
        with pytest.raises(InferenceServerException) as info:
            c.infer("tts", _inputs(mod, text, **params))
        assert expect in info.value.message(), f"{name}: {info.value.message()}"
        # the client's mistake, whichever model found it
        assert info.value.status() == INVALID_ARG[protocol], f"{name}: {info.value.status()} {info.value.message()}"
    # Missing TEXT altogether: Triton's own check names it.
    with pytest.raises(InferenceServerException, match="TEXT"):
        c.infer("tts", _inputs(mod, "x", SEED=1)[1:])
    # The streaming model answers bad input on the stream, and stays up too.
    if protocol == "grpc":
        with pytest.raises(InferenceServerException, match="TEXT is empty"):
            tts_stream(server, "")
    assert c.is_server_live() and c.is_server_ready()
    c.close()
    audio, _ = tts_http(server, "Still working.", SEED=1, MIN_LENGTH=2, MAX_LENGTH=2)
    assert audio.shape == (2 * HOP,)


def test_normalize_equals_sending_the_reference_normalised_text(server):
    """NORMALIZE normalises TEXT (text_normalizer) as the reference's generate(normalize=True) does:
    the audio is that of the reference-normalised text sent as it is."""
    from tests.reference import text_normalizer

    text = "I paid $5 for 3 apples on 2024-01-05."
    normalized = text_normalizer().normalize(text)
    assert normalized == "I paid five dollars for three apples on the fifth of january twenty twenty four."
    params = dict(SEED=4, MIN_LENGTH=3, MAX_LENGTH=3, INFERENCE_TIMESTEPS=2)
    on = ("BOOL", np.array([True]))
    want, _ = tts_http(server, normalized, **params)
    got, _ = tts_http(server, text, NORMALIZE=on, **params)
    assert got.shape == want.shape and np.abs(got - want).max() <= TOL
    plain, _ = tts_http(server, text, NORMALIZE=("BOOL", np.array([False])), **params)
    assert np.abs(plain - want).max() > TOL  # what the model read did change
    streamed = np.concatenate(tts_stream(server, text, NORMALIZE=on, **params))
    assert streamed.shape == want.shape and np.abs(streamed - want).max() <= TOL


def test_normalize_floods_leave_tts_instances_to_plain_requests(server):
    """A `tts` request holds its instance while it waits (not decoupled): a flood of NORMALIZE requests
    waiting for text_normalizer (one at a time, 16 in its queue) held all 8 and a plain request sent
    after them waited seconds behind them. At most half the instances wait; past that, `server busy`
    at once, and the plain request is answered before the first of the flood."""
    import threading

    from tritonclient.utils import InferenceServerException

    slow = "1 " * 1500  # over a second of normalisation each on this machine
    results: dict = {}

    def run(name, text, **kw):
        try:
            out = tts_http(server, text, SEED=1, MIN_LENGTH=2, MAX_LENGTH=2, **kw)[0]
        except InferenceServerException as e:
            out = e
        results[name] = (out, time.monotonic())

    threads = [threading.Thread(target=run, args=(i, slow), kwargs={"NORMALIZE": ("BOOL", np.array([True]))})
               for i in range(10)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    run("plain", "I paid $5 for 3 apples.")
    for t in threads:
        t.join(300)
    assert isinstance(results["plain"][0], np.ndarray), results["plain"]
    busy = [out for out, _ in (results[i] for i in range(10)) if isinstance(out, InferenceServerException)
            and "half of tts's instances" in str(out)]
    assert len(busy) >= 5 and all(e.status() == "503" for e in busy), results  # UNAVAILABLE: retry later
    normalised = [at for out, at in (results[i] for i in range(10)) if isinstance(out, np.ndarray)]
    assert normalised and results["plain"][1] < min(normalised), results


def test_internal_models_validate_calls_with_the_internal_key(server):
    """Requests stamped with the server's internal key (as the orchestrator's are) are still
    validated: bad input gets an error naming it."""

    raw = grpc_input
    key = {"voxcpm_internal_key": server.internal_key}
    ids = lambda a: raw("TOKEN_IDS", "INT64", np.array(a, np.int64))  # noqa: E731
    n = raw("TARGET_TOKENS", "INT32", np.array([1], np.int32))
    for inputs, expect in [([ids([10**7]), n], "TOKEN_IDS"), ([ids([-3]), n], "TOKEN_IDS"), ([n], "TOKEN_IDS"),
                           ([ids([5, 6]), n, raw("REF_LATENTS", "FP32", np.full((2, 4, 16), np.nan, np.float32))],
                            "REF_LATENTS")]:
        with pytest.raises(InferenceServerException, match=expect):
            stream_infer(server, "decoder", inputs, output="LATENTS", parameters=key)
    latents = stream_infer(server, "decoder", [ids([5, 6, 7]), n, raw("MAX_LENGTH", "INT32", np.array([3], np.int32)),
                                               raw("MIN_LENGTH", "INT32", np.array([3], np.int32))], output="LATENTS",
                           parameters=key)
    assert np.concatenate(latents).shape == (3, 4, 16)
    wait_idle(server)


def test_perf_analyzer_against_tts_over_http(server, tmp_path):
    env = triton_env()
    data = tmp_path / "input.json"
    data.write_text('{"data": [{"TEXT": {"content": ["Perf test sentence."], "shape": [1]}, '
                    '"MIN_LENGTH": {"content": [4], "shape": [1]}, "MAX_LENGTH": {"content": [4], "shape": [1]}}]}')
    out = subprocess.run(
        [env["PERF_ANALYZER_BIN"], "-m", "tts", "-u", server.http_url, "-i", "http", "--input-data", str(data),
         "--concurrency-range", "2", "--request-count", "16"],  # a fixed count: no search for stable windows
        env=env, capture_output=True, text=True, timeout=240)
    log = out.stdout + out.stderr
    assert out.returncode == 0, log
    m = re.search(r"Throughput: ([0-9.]+) infer/sec", log)
    assert m and float(m.group(1)) > 0, log
    assert "error" not in log.lower() or "Errors: 0" in log, log


def test_every_model_process_exits_cleanly(ckpt, tmp_path):
    """SIGTERM after serving: every model unloads and no model process crashes on its way out.
    The processes with metrics (tts, tts_stream, decoder, vae_decoder) used to leave their
    MetricFamily objects to python_backend's stub teardown, which destroys them after its shared
    memory: every one of them segfaulted at exit. (A stream still in flight keeps its models
    loaded until it ends or the exit timeout cuts it: Triton 2.51 calls no finalize before.)"""
    srv = TritonServer("model_repository", env={"VOXCPM_CHECKPOINT": ckpt}, exit_timeout=120,
                       log_path=tmp_path / "server.log")
    with srv:
        assert len(tts_stream(srv, "Words before the end.", SEED=1, MIN_LENGTH=3, MAX_LENGTH=3)) > 0
        assert tts_http(srv, "More words.", SEED=2, MIN_LENGTH=3, MAX_LENGTH=3)[0].size > 0
        assert sum(v for name, _, v in metric_samples(srv)  # the metrics were in use
                   if name == "voxcpm_time_to_first_audio_seconds_count") >= 2
        srv.stop(timeout=180)  # a loaded machine may take a while to unload its 21 model processes
    log = srv.log
    assert srv.returncode == 0 and srv.leftover_processes == [], srv.log_tail()
    for model in ("tts", "tts_stream", "decoder", "vae_decoder", "vae_encoder", "tokenizer", "text_normalizer", "voices",
                  "loras"):
        assert f"successfully unloaded '{model}'" in log, model
    assert "Fatal Python error" not in log, log[log.index("Fatal Python error"):][:3000]


def test_a_plain_tritonserver_removes_the_run_directories_servers_that_exited_left(ckpt, tmp_path):
    """Run without scripts/supervise.py (no VOXCPM_RUN_DIR), a server's models share <tmp>/voxcpm-<its pid>-<its
    start time>, which nothing removes when it exits. The next server's models remove it as they start
    (saying so in its log), and keep those of servers still running."""
    import glob
    import shutil

    from tests.server import REPO

    repo, tmp = tmp_path / "repo", tmp_path / "tmp"
    shutil.copytree(REPO / "model_repository" / "tokenizer", repo / "tokenizer",
                    ignore=shutil.ignore_patterns("__pycache__"))
    tmp.mkdir()
    env = {"VOXCPM_CHECKPOINT": ckpt, "VOXCPM_RUN_DIR": "", "TMPDIR": str(tmp)}

    def served(srv: TritonServer) -> str:
        dirs = glob.glob(str(tmp / f"voxcpm-{srv.proc.pid}-*"))
        assert len(dirs) == 1 and srv.is_ready("tokenizer"), (dirs, srv.log_tail())
        assert os.path.exists(os.path.join(dirs[0], "held"))  # its model process holds it
        return dirs[0]

    first = TritonServer(repo, env=env, log_path=tmp_path / "first.log")
    with first:
        left = served(first)
        with TritonServer(repo, env=env, log_path=tmp_path / "beside.log") as beside:
            assert served(beside) != left and os.path.isdir(left)  # a running server's stays
    assert first.returncode == 0 and not first.leftover_processes and os.path.isdir(left)
    with TritonServer(repo, env=env, log_path=tmp_path / "second.log") as second:
        now = served(second)
        assert not os.path.exists(left), second.log_tail()
        assert f"removed {left}, the run directory of a server that has exited" in second.log
    assert second.returncode == 0 and not second.leftover_processes
    assert sorted(glob.glob(str(tmp / "voxcpm-*"))) == [now]
    # A server killed with its model processes (SIGKILL to them all) leaves its shared-memory regions
    # too: the next server removes them with its directory.
    with TritonServer(repo, env=env, log_path=tmp_path / "killed.log") as killed:
        left = served(killed)
        regions = {a for p in _children(killed.proc.pid) for a in _cmdline(p).split()
                   if a.startswith("triton_python_backend_shm_region_")}
        assert regions and all(os.path.exists(f"/dev/shm/{r}") for r in regions), regions
        os.killpg(killed.proc.pid, signal.SIGKILL)
        killed.proc.wait(30)
    assert all(os.path.exists(f"/dev/shm/{r}") for r in regions)
    try:
        with TritonServer(repo, env=env, log_path=tmp_path / "third.log") as third:
            served(third)
            assert not os.path.exists(left) and not [r for r in regions if os.path.exists(f"/dev/shm/{r}")]
    finally:
        remove_shm_regions(regions)


def test_model_processes_freeze_start_up_objects_and_the_decoder_counts_its_collections(server):
    """gc_pauses: each streaming model process (decoder, the orchestrators, vae_decoder) times a full
    garbage collection at the end of its start-up, then freezes what start-up left (the log says
    both); the decoder's collections while serving are on /metrics, by generation."""
    for process in ("decoder instance decoder_0_0", "tts_stream_0_0", "tts_0_0", "vae_decoder instance vae_decoder_0_0"):
        m = re.search(rf"{process}: a full garbage collection takes (\d+) ms \(\d+ objects tracked after it\); "
                      r"with them frozen, ([\d.]+) ms", server.log)
        assert m, (process, server.log_tail())
        if process.startswith("decoder"):  # torch and the engine: a heap worth freezing (~0.2 s a walk here)
            assert float(m[2]) * 10 < float(m[1]), m[0]
    tts_http(server, "Collect me.", SEED=3, MIN_LENGTH=3, MAX_LENGTH=3)
    deadline = time.monotonic() + 10
    while True:
        samples = {(name, labels["generation"]): v for name, labels, v in metric_samples(server)
                   if name in ("voxcpm_gc_collections_total", "voxcpm_gc_pause_seconds_total")
                   and labels.get("model") == "decoder"}
        assert sorted(samples) == [(n, g) for n in ("voxcpm_gc_collections_total", "voxcpm_gc_pause_seconds_total")
                                   for g in "012"], samples
        if samples[("voxcpm_gc_collections_total", "0")] > 0:
            break
        assert time.monotonic() < deadline, samples
        time.sleep(0.2)
    assert samples[("voxcpm_gc_pause_seconds_total", "0")] > 0
    assert metrics(server)["voxcpm_gc_pause_seconds_max"] > 0
