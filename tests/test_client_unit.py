"""Unit tests of client/voxcpm_client and perf/*.json; no server needed."""
import glob
import json
import os
import re
import socket
import time
import subprocess
import sys
import threading

import numpy as np
import pytest
import soundfile as sf

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "client"))

import tritonclient.grpc as grpcclient  # noqa: E402
import tritonclient.http as httpclient  # noqa: E402
from tritonclient.grpc import service_pb2  # noqa: E402
from tritonclient.utils import InferenceServerException, deserialize_bytes_tensor  # noqa: E402

import voxcpm_client  # noqa: E402
from voxcpm_client import (  # noqa: E402
    Result, ServerUnavailable, SynthesisError, SynthesisTimeout, input_arrays, load_audio, make_inputs,
)

# The public contract (README, "Contract"): name -> (Triton dtype, shape).
CONTRACT = {
    "TEXT": ("BYTES", [1]),
    "REFERENCE_AUDIO": ("FP32", [-1]),
    "REFERENCE_SAMPLE_RATE": ("INT32", [1]),
    "PROMPT_AUDIO": ("FP32", [-1]),
    "PROMPT_SAMPLE_RATE": ("INT32", [1]),
    "PROMPT_TEXT": ("BYTES", [1]),
    "CFG_VALUE": ("FP32", [1]),
    "INFERENCE_TIMESTEPS": ("INT32", [1]),
    "MIN_LENGTH": ("INT32", [1]),
    "MAX_LENGTH": ("INT32", [1]),
    "SEED": ("INT64", [1]),
    "VOICE": ("BYTES", [1]),
    "VOICE_MODE": ("BYTES", [1]),
    "NORMALIZE": ("BOOL", [1]),
    "LORA": ("BYTES", [1]),
    "RETRY_BADCASE": ("BOOL", [1]),
}
NP = {"BYTES": np.object_, "FP32": np.float32, "INT32": np.int32, "INT64": np.int64, "BOOL": np.bool_}
ZH = "你好，欢迎使用语音合成。"


def all_params():
    return dict(reference_audio=np.linspace(-1, 1, 321).astype(np.float32), reference_sample_rate=16000,
                prompt_audio=np.zeros(77, np.float64), prompt_sample_rate=44100, prompt_text=ZH,
                cfg_value=2.5, inference_timesteps=8, min_length=5, max_length=100, seed=2**40 + 3,
                voice="alice", voice_mode="reference", normalize=True, lora="dialect", retry_badcase=False)


# ---------------------------------------------------------------- inputs

def test_only_text_by_default():
    arrays = input_arrays("hello")
    assert list(arrays) == ["TEXT"]
    assert arrays["TEXT"].dtype == np.object_ and arrays["TEXT"].shape == (1,)
    assert arrays["TEXT"][0] == b"hello"


def test_all_inputs_names_dtypes_shapes():
    arrays = input_arrays("hi", **all_params())
    assert set(arrays) == set(CONTRACT)
    for name, (dtype, shape) in CONTRACT.items():
        a = arrays[name]
        assert a.dtype.type is NP[dtype], name
        assert a.ndim == 1, name
        if shape == [1]:
            assert a.shape == (1,), name
    assert arrays["REFERENCE_AUDIO"].shape == (321,)
    assert arrays["PROMPT_AUDIO"].shape == (77,) and arrays["PROMPT_AUDIO"].dtype == np.float32
    assert arrays["SEED"][0] == 2**40 + 3
    assert arrays["CFG_VALUE"][0] == np.float32(2.5)
    assert arrays["PROMPT_TEXT"][0].decode("utf-8") == ZH
    assert arrays["NORMALIZE"][0] is np.True_
    assert arrays["RETRY_BADCASE"][0] is np.False_


def test_none_params_are_left_out():
    assert list(input_arrays("hi", seed=None, cfg_value=None)) == ["TEXT"]


@pytest.mark.parametrize("module", [grpcclient, httpclient], ids=["grpc", "http"])
def test_make_inputs_match_contract_and_encode_utf8(module):
    text = "Hello " + ZH + " (whispering) ünïcödé"
    inputs = make_inputs(module, text, **all_params())
    by_name = {i.name(): i for i in inputs}
    assert set(by_name) == set(CONTRACT)
    for name, (dtype, shape) in CONTRACT.items():
        assert by_name[name].datatype() == dtype, name
        if shape == [1]:
            assert list(by_name[name].shape()) == [1], name
    assert list(by_name["REFERENCE_AUDIO"].shape()) == [321]
    # BYTES on the wire: 4-byte little-endian length + the UTF-8 bytes.
    for name, want in (("TEXT", text), ("PROMPT_TEXT", ZH)):
        raw = by_name[name]._get_content() if module is grpcclient else by_name[name]._get_binary_data()
        encoded = want.encode("utf-8")
        assert raw == len(encoded).to_bytes(4, "little") + encoded
        assert deserialize_bytes_tensor(raw)[0].decode("utf-8") == want
    raw = by_name["SEED"]._get_content() if module is grpcclient else by_name["SEED"]._get_binary_data()
    assert np.frombuffer(raw, "<i8")[0] == 2**40 + 3


def test_input_validation():
    with pytest.raises(TypeError, match="cfg"):
        input_arrays("hi", cfg=2.0)
    with pytest.raises(ValueError, match="reference_sample_rate"):
        input_arrays("hi", reference_audio=np.zeros(10, np.float32))
    with pytest.raises(ValueError, match="prompt_text"):
        input_arrays("hi", prompt_audio=np.zeros(10, np.float32), prompt_sample_rate=16000)
    with pytest.raises(ValueError, match="prompt_text"):
        input_arrays("hi", prompt_text="x")
    with pytest.raises(ValueError, match="mono"):
        input_arrays("hi", reference_audio=np.zeros((10, 2), np.float32), reference_sample_rate=16000)
    with pytest.raises(ValueError, match="voice_mode needs voice"):
        input_arrays("hi", voice_mode="both")
    with pytest.raises(TypeError, match="normalize must be True or False"):
        input_arrays("hi", normalize="yes")
    with pytest.raises(TypeError, match="retry_badcase must be True or False"):
        input_arrays("hi", retry_badcase=0)


def test_retry_badcase_is_for_tts_only():
    """tts_stream has no RETRY_BADCASE (streamed audio cannot be taken back): the library and the CLI
    say so before anything is sent."""
    from voxcpm_client import synthesize_stream
    from voxcpm_client.cli import parse_args

    for value in (False, True):
        with pytest.raises(TypeError, match="retry_badcase is for tts"):
            synthesize_stream("hi", url="127.0.0.1:1", retry_badcase=value)
    assert parse_args(["hi", "--protocol", "http", "--no-retry-badcase"]).retry_badcase is False
    assert parse_args(["hi", "--model", "tts", "--no-retry-badcase"]).retry_badcase is False  # tts over gRPC
    assert parse_args(["hi", "--protocol", "http"]).retry_badcase is None  # not sent: the server's default (on)
    with pytest.raises(SystemExit):
        parse_args(["hi", "--no-retry-badcase"])  # gRPC: tts_stream


def test_cli_normalize_flag():
    from voxcpm_client.cli import parse_args

    assert parse_args(["hi", "--normalize"]).normalize is True
    assert parse_args(["hi"]).normalize is None  # not sent: the server's default (off)
    assert parse_args(["hi", "--lora", "dialect"]).lora == "dialect" and parse_args(["hi"]).lora is None


def test_cli_voices_add_takes_a_default_adapter():
    from voxcpm_client.cli import parse_voices_args

    assert parse_voices_args(["add", "alice", "a.wav", "--lora", "dialect"]).lora == "dialect"
    assert parse_voices_args(["add", "alice", "a.wav"]).lora is None



# ---------------------------------------------------------------- audio files and Result

@pytest.mark.parametrize("ext", ["wav", "flac"])
def test_load_audio_downmixes_stereo(tmp_path, ext):
    rate = 22050
    t = np.arange(rate // 10) / rate
    left, right = 0.5 * np.sin(2 * np.pi * 440 * t), 0.25 * np.cos(2 * np.pi * 220 * t)
    path = str(tmp_path / f"stereo.{ext}")
    sf.write(path, np.stack([left, right], axis=1), rate, subtype="PCM_16")
    audio, got_rate = load_audio(path)
    assert got_rate == rate
    assert audio.dtype == np.float32 and audio.shape == (len(t),)
    np.testing.assert_allclose(audio, (left + right) / 2, atol=2e-4)


def test_load_audio_mono(tmp_path):
    """From a path (str or Path) or a binary file object, as soundfile reads them."""
    import io
    from pathlib import Path

    path = str(tmp_path / "mono.wav")
    x = np.linspace(-0.5, 0.5, 1000).astype(np.float32)
    sf.write(path, x, 16000, subtype="FLOAT")
    fd = os.open(path, os.O_RDONLY)
    try:
        for source in (path, Path(path), io.BytesIO(Path(path).read_bytes()), fd):
            audio, rate = load_audio(source)
            assert rate == 16000 and audio.shape == (1000,)
            np.testing.assert_array_equal(audio, x)
        os.fstat(fd)  # the caller's descriptor is still open
    finally:
        os.close(fd)
    with pytest.raises(FileNotFoundError, match="No such file"):
        load_audio(str(tmp_path / "none.wav"))


def test_result_math():
    r = Result(audio=np.zeros(96000, np.float32), sample_rate=48000, total_s=0.5, ttfa_s=0.05)
    assert r.audio_s == pytest.approx(2.0)
    assert r.rtf == pytest.approx(0.25)
    empty = Result(audio=np.zeros(0, np.float32), sample_rate=48000, total_s=0.5)
    assert empty.audio_s == 0.0 and empty.rtf == float("inf")


@pytest.mark.parametrize("subtype", ["PCM_16", "FLOAT"])
def test_result_save(tmp_path, subtype):
    x = (0.5 * np.sin(np.arange(4800) / 10)).astype(np.float32)
    path = str(tmp_path / "out.wav")
    Result(audio=x, sample_rate=48000, total_s=1.0).save(path, subtype=subtype)
    info = sf.info(path)
    assert info.samplerate == 48000 and info.channels == 1 and info.subtype == subtype
    back, _ = load_audio(path)
    np.testing.assert_allclose(back, x, atol=1e-4 if subtype == "PCM_16" else 0)


# ---------------------------------------------------------------- streaming / HTTP logic (fake tritonclient)

def infer_result(audio=None, rate=None, final=False):
    """A real tritonclient.grpc InferResult built from a ModelInferResponse."""
    resp = service_pb2.ModelInferResponse(model_name="tts_stream", id="r")
    for name, arr, dtype in (("AUDIO", audio, "FP32"), ("SAMPLE_RATE", rate, "INT32")):
        if arr is not None:
            out = resp.outputs.add(name=name, datatype=dtype)
            out.shape.extend(arr.shape)
            resp.raw_output_contents.append(arr.tobytes())
    if final:
        resp.parameters["triton_final_response"].bool_param = True
    return grpcclient.InferResult(resp)


class FakeGrpcClient:
    """Stands in for tritonclient.grpc.InferenceServerClient; plays `script` back
    through the stream callback (from another thread, as tritonclient does)."""
    script = []
    last = None

    def __init__(self, url, **kw):
        self.url, self.stopped, self.closed, self.sent = url, None, False, None
        FakeGrpcClient.last = self

    def start_stream(self, callback, **kw):
        self.callback = callback

    def async_stream_infer(self, model_name, inputs, **kw):
        self.sent = (model_name, {i.name() for i in inputs}, kw)
        threading.Thread(target=lambda: [self.callback(result=r, error=e) for r, e in self.script]).start()

    def stop_stream(self, cancel_requests=False):
        self.stopped = {"cancel_requests": cancel_requests}

    def close(self):
        self.closed = True


def chunk(i, n=480):
    return np.full(n, i, np.float32)


@pytest.fixture
def fake_grpc(monkeypatch):
    monkeypatch.setattr(grpcclient, "InferenceServerClient", FakeGrpcClient)
    return FakeGrpcClient


def test_stream_collects_chunks_until_final(fake_grpc):
    rate = np.array([48000], np.int32)
    fake_grpc.script = [(infer_result(chunk(1), rate), None), (infer_result(chunk(2), rate), None),
                        (infer_result(chunk(3, 960), rate), None), (infer_result(final=True), None)]
    seen = []
    r = voxcpm_client.synthesize_stream("hi", url="grpc://h:1", on_chunk=seen.append, seed=3)
    c = fake_grpc.last
    assert c.url == "h:1"
    assert c.sent[0] == "tts_stream" and c.sent[1] == {"TEXT", "SEED"}
    assert c.sent[2]["enable_empty_final_response"] is True
    assert c.stopped == {"cancel_requests": False} and c.closed
    assert [len(x) for x in r.chunks] == [480, 480, 960] and len(seen) == 3
    np.testing.assert_array_equal(r.audio, np.concatenate([chunk(1), chunk(2), chunk(3, 960)]))
    assert r.sample_rate == 48000 and r.audio_s == pytest.approx(1920 / 48000)
    assert 0 <= r.ttfa_s <= r.total_s and r.rtf == pytest.approx(r.total_s / r.audio_s)
    assert not r.cancelled


def test_stream_final_response_with_data(fake_grpc):
    fake_grpc.script = [(infer_result(chunk(1), np.array([16000], np.int32), final=True), None)]
    r = voxcpm_client.synthesize_stream("hi", model="tts")
    assert len(r.chunks) == 1 and r.sample_rate == 16000 and fake_grpc.last.stopped == {"cancel_requests": False}


def test_stream_max_chunks_cancels(fake_grpc):
    rate = np.array([48000], np.int32)
    fake_grpc.script = [(infer_result(chunk(i), rate), None) for i in range(10)]  # never final
    r = voxcpm_client.synthesize_stream("hi", max_chunks=2, timeout=5)
    assert len(r.chunks) == 2 and r.cancelled
    assert fake_grpc.last.stopped == {"cancel_requests": True} and fake_grpc.last.closed


def test_stream_server_error(fake_grpc):
    fake_grpc.script = [(None, InferenceServerException(msg="TEXT is empty"))]
    with pytest.raises(SynthesisError, match="^TEXT is empty$"):
        voxcpm_client.synthesize_stream("hi")
    assert fake_grpc.last.stopped == {"cancel_requests": True}


@pytest.mark.parametrize("message", ["server busy: the decoder's queue is full (max_waiting_requests); retry later",
                                     "the server is shutting down", "VoxCPM server unhealthy: decoder died",
                                     "the server is shutting down: voices: no answer",
                                     "vae_decoder: the server is shutting down", "Server is stopping",
                                     "Stub process 'tts_stream_0_1' is not healthy."])
def test_stream_busy_is_server_busy(fake_grpc, message):
    """A stream's error carries no status: "not now" is told by the contract's messages, so that a
    caller can retry it and not a bad request (a review). ServerBusy is both older classes."""
    fake_grpc.script = [(None, InferenceServerException(msg=message))]
    with pytest.raises(voxcpm_client.ServerBusy, match=f"^{re.escape(message)}$") as info:
        voxcpm_client.synthesize_stream("hi")
    assert isinstance(info.value, ServerUnavailable) and isinstance(info.value, SynthesisError)


@pytest.mark.parametrize("message", [
    "LORA: unknown LoRA adapter 'server busy' (loaded: none)",
    "VOICE 'the server is shutting down' is not a valid voice name",
    "unknown request parameter \"Stub process 'x' is not healthy\": this model takes no parameters, only the inputs"])
def test_a_bad_request_that_quotes_busy_words_is_no_server_busy(fake_grpc, message):
    fake_grpc.script = [(None, InferenceServerException(msg=message))]
    with pytest.raises(SynthesisError) as info:
        voxcpm_client.synthesize_stream("hi")
    assert not isinstance(info.value, voxcpm_client.ServerBusy)


def test_stream_unavailable(fake_grpc):
    fake_grpc.script = [(None, InferenceServerException(msg="connection refused", status="StatusCode.UNAVAILABLE"))]
    with pytest.raises(ServerUnavailable, match="^cannot reach Triton at h:9: connection refused"):
        voxcpm_client.synthesize_stream("hi", url="h:9")


def test_stream_timeout(fake_grpc):
    fake_grpc.script = [(infer_result(chunk(1), np.array([48000], np.int32)), None)]  # then silence
    with pytest.raises(SynthesisTimeout):
        voxcpm_client.synthesize_stream("hi", timeout=0.2)
    assert fake_grpc.last.stopped == {"cancel_requests": True}


class FakeHttpResult:
    def __init__(self, outputs):
        self.outputs = outputs

    def as_numpy(self, name):
        return self.outputs.get(name)


def test_http_result_and_error(monkeypatch):
    calls = []

    class FakeHttpClient:
        def __init__(self, url, **kw):
            calls.append(("init", url, kw))

        def infer(self, model_name, inputs, outputs=None, **kw):
            calls.append(("infer", model_name, {i.name() for i in inputs}, [o.name() for o in outputs]))
            if inputs[0]._get_binary_data().endswith(b"bad"):
                raise InferenceServerException(msg="SEED must be an integer", status="400")
            return FakeHttpResult({"AUDIO": np.ones(24000, np.float32), "SAMPLE_RATE": np.array([48000], np.int32)})

        def close(self):
            calls.append(("close",))

    monkeypatch.setattr(httpclient, "InferenceServerClient", FakeHttpClient)
    r = voxcpm_client.synthesize("good", url="http://h:8000", max_length=10)
    assert calls[0][:2] == ("init", "h:8000")
    assert calls[1] == ("infer", "tts", {"TEXT", "MAX_LENGTH"}, ["AUDIO", "SAMPLE_RATE"])
    assert calls[-1] == ("close",)
    assert r.sample_rate == 48000 and r.audio_s == pytest.approx(0.5) and r.ttfa_s is None and r.chunks == []
    with pytest.raises(SynthesisError, match="^SEED must be an integer$"):
        voxcpm_client.synthesize("bad")


# ---------------------------------------------------------------- closed port (real tritonclient, no server)

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("fn", ["synthesize_stream", "synthesize"])
def test_library_server_down(fn):
    url = f"127.0.0.1:{free_port()}"
    with pytest.raises(ServerUnavailable, match=f"^cannot reach Triton at {url}: "):
        getattr(voxcpm_client, fn)("hi", url=url, timeout=20)


def run_cli(*args, env: dict | None = None):
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "client"), **(env or {}))
    return subprocess.run([sys.executable, "-m", "voxcpm_client", *args], capture_output=True, text=True,
                          env=env, timeout=60)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_cli_server_down_exit_2(tmp_path, protocol):
    url = f"127.0.0.1:{free_port()}"
    out = tmp_path / "out.wav"
    p = run_cli("hello", "-o", str(out), "--protocol", protocol, "--url", url, "--timeout", "20")
    assert p.returncode == 2, p.stderr
    assert p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: cannot reach Triton at {url}: "), p.stderr
    assert not out.exists()


@pytest.mark.parametrize("args", [("hello",), ("voices", "list")])
def test_cli_http_at_a_grpc_port_is_one_line_exit_2(tmp_path, args):
    """--protocol http (the default for `tts`) aimed at a gRPC port: the server answers HTTP/2 frames."""
    import threading

    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        url = f"127.0.0.1:{srv.getsockname()[1]}"

        def answer():
            conn, _ = srv.accept()
            with conn:
                conn.recv(65536)
                conn.sendall(b"\x00\x00\x06\x04\x00\x00\x00\x00\x00\x00\x04\x00\x40\x00\x00")  # HTTP/2 SETTINGS

        thread = threading.Thread(target=answer, daemon=True)
        thread.start()
        p = run_cli(*args, "--protocol", "http", "--url", url, "--timeout", "20", *(("-o", str(tmp_path / "o.wav"))
                                                                                     if args == ("hello",) else ()))
        thread.join(30)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: no valid HTTP answer from {url} (HTTPParseError: "), lines
    assert lines[0].endswith("if that is Triton's gRPC port, use its HTTP port (default 8000) or the gRPC protocol")


@pytest.mark.parametrize("body", [b'{"error": {"message": "Not Found", "type": "invalid_request_error"}}',
                                  b'{"detail": "Not Found"}', b"<html>Not Found</html>"],
                         ids=["openai_gateway", "other_json", "html"])
@pytest.mark.parametrize("args", [("hello",), ("voices", "list")])
def test_cli_http_at_another_servers_port_says_it_is_not_triton(tmp_path, args, body):
    """--protocol http aimed at an HTTP server that is not Triton (the OpenAI gateway's port, say): its
    error body is not Triton's {"error": "<text>"}, and tritonclient hands that on as it is (a dict)."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler) as srv:
        thread = threading.Thread(target=srv.serve_forever, daemon=True)
        thread.start()
        url = f"127.0.0.1:{srv.server_address[1]}"
        try:
            p = run_cli(*args, "--protocol", "http", "--url", url, "--timeout", "20",
                        *(("-o", str(tmp_path / "o.wav")) if args == ("hello",) else ()))
        finally:
            srv.shutdown()
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {url} did not answer as Triton does (HTTP 404: "), lines
    assert "Not Found" in lines[0] and lines[0].endswith("use Triton's HTTP port (default 8000) or the gateway's own API")
    if body.startswith(b'{"error"'):  # the gateway's error object as it came, JSON
        assert '{"message": "Not Found", "type": "invalid_request_error"}' in lines[0], lines[0]
    assert not (tmp_path / "o.wav").exists()


@pytest.mark.parametrize("args", [("hello",), ("voices", "list")])
def test_cli_grpc_at_an_http_port_says_so(tmp_path, args):
    """--protocol grpc (the CLI's default) aimed at an HTTP/1.1 port answering its preface: gRPC's
    "Failed parsing HTTP/2" comes with the hint to use the gRPC port, as the opposite mistake gets."""
    import threading

    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        url = f"127.0.0.1:{srv.getsockname()[1]}"

        def answer():
            srv.settimeout(30)
            for _ in range(8):  # gRPC reconnects within its deadline
                try:
                    conn, _ = srv.accept()
                except OSError:
                    return
                with conn:
                    conn.recv(65536)
                    conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")

        thread = threading.Thread(target=answer, daemon=True)
        thread.start()
        p = run_cli(*args, "--url", url, "--timeout", "5", *(("-o", str(tmp_path / "o.wav"))
                                                            if args == ("hello",) else ()))
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: cannot reach Triton at {url}: "), lines
    assert lines[0].endswith("if that is Triton's HTTP port, use its gRPC port (default 8001) or the HTTP protocol")


@pytest.mark.parametrize("protocol, var", [("grpc", "TRITON_GRPC_PORT"), ("http", "TRITON_HTTP_PORT")])
def test_cli_without_url_takes_the_port_serve_sh_was_given(tmp_path, protocol, var):
    """No --url: localhost at the port scripts/serve.sh serves the protocol on, from the same variable."""
    port = free_port()
    p = run_cli("hello", "-o", str(tmp_path / "x.wav"), "--protocol", protocol, "--timeout", "20", env={var: str(port)})
    assert p.returncode == 2 and f"cannot reach Triton at localhost:{port}" in p.stderr, p.stderr
    for argv in (("hello", "-o", str(tmp_path / "x.wav"), "--protocol", protocol),
                 ("voices", "list", "--protocol", protocol), ("loras", "list", "--protocol", protocol)):
        p = run_cli(*argv, env={var: "abc"})
        assert p.returncode == 2 and p.stderr == f"error: {var}='abc' is not a port (1-65535); give --url host:port\n"


def test_cli_bad_arguments_exit_2(tmp_path):
    p = run_cli("hello", "--prompt-audio", str(tmp_path / "p.wav"))
    assert p.returncode == 2 and "--prompt-text" in p.stderr and "Traceback" not in p.stderr
    p = run_cli("hello", "--reference", str(tmp_path / "missing.wav"), "--url", f"127.0.0.1:{free_port()}")
    assert p.returncode == 2 and "Traceback" not in p.stderr and p.stderr.strip() == (
        f"error: cannot read audio: [Errno 2] No such file or directory: '{tmp_path / 'missing.wav'}'"), p.stderr
    # before any request: an output nowhere to write, a seed past INT64 (both were tracebacks: a review)
    p = run_cli("hello", "-o", str(tmp_path / "missing" / "x.wav"), "--url", f"127.0.0.1:{free_port()}")
    assert p.returncode == 2 and p.stderr.startswith("error: cannot write") and "Traceback" not in p.stderr, p.stderr
    p = run_cli("hello", "-o", str(tmp_path / "x.wav"), "--seed", "99999999999999999999", "--url", f"127.0.0.1:{free_port()}")
    assert p.returncode == 2 and p.stderr.startswith("error: seed must fit SEED, an int64 input (") and "Traceback" not in p.stderr
    # an output it cannot write as named, a timeout no client takes: refused before the synthesis runs
    for args, said in [(("-o", str(tmp_path / "x.mp3")), "-o/--output must name a .wav file"),
                       (("-o", ""), "-o/--output must name a .wav file"),
                       *[(("--timeout", t), "argument --timeout: must be more than 0") for t in ("0", "-1", "nan", "inf")]]:
        p = run_cli("hello", *args, "--url", f"127.0.0.1:{free_port()}")
        assert p.returncode == 2 and said in p.stderr and "Traceback" not in p.stderr, (args, p.stderr)
    assert not (tmp_path / "x.mp3").exists()
    # a URL that is not host:port, or asks for TLS (it went out as plain HTTP): refused, not reinterpreted
    for url, said in [("localhost:abc", "is not host:port"), ("localhost:99999", "is not host:port"),
                      ("https://example.com:443", "https:// is not supported"), ("ftp://h:1", "ftp:// is not supported")]:
        for args in (("hello",), ("voices", "list"), ("loras", "list")):
            p = run_cli(*args, "--url", url)
            assert p.returncode == 2 and said in p.stderr and "Traceback" not in p.stderr, (url, p.stderr)
            assert f"voxcpm-tts{' ' + ' '.join(args) if args[0] != 'hello' else ''}: error: " in p.stderr, p.stderr


def test_cli_interrupted_mid_request_exits_130_without_a_traceback(tmp_path):
    """Ctrl-C while the server has not answered: no traceback, exit 130, nothing written."""
    import signal

    with socket.socket() as srv:  # takes the connection and never answers
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "client"))
        out = tmp_path / "o.wav"
        p = subprocess.Popen([sys.executable, "-m", "voxcpm_client", "hello", "--protocol", "http", "--url",
                              f"127.0.0.1:{srv.getsockname()[1]}", "-o", str(out)], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        try:
            conn, _ = srv.accept()  # the request is out
            time.sleep(0.5)
            p.send_signal(signal.SIGINT)
            _, err = p.communicate(timeout=30)
            conn.close()
        finally:
            if p.poll() is None:
                p.kill()
    # (gevent, under tritonclient.http, prints the interrupt's name and a time stamp first)
    assert p.returncode == 130 and err.strip().splitlines()[-1] == "interrupted" and "Traceback" not in err, err
    assert not out.exists()


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_cli_voices_server_down_and_bad_arguments(tmp_path, protocol):
    url = f"127.0.0.1:{free_port()}"
    p = run_cli("voices", "list", "--protocol", protocol, "--url", url, "--timeout", "20")
    assert p.returncode == 2 and p.stderr.startswith(f"error: cannot reach Triton at {url}: "), p.stderr
    p = run_cli("voices", "add", "alice", str(tmp_path / "missing.wav"), "--url", url)
    assert p.returncode == 2 and p.stderr.startswith("error: cannot read audio") and "Traceback" not in p.stderr
    p = run_cli("voices", "rename", "a")
    assert p.returncode == 2 and "invalid choice" in p.stderr
    p = run_cli("loras", "list", "--protocol", protocol, "--url", url, "--timeout", "20")
    assert p.returncode == 2 and p.stderr.startswith(f"error: cannot reach Triton at {url}: "), p.stderr
    for args, said in [(("loras", "load", "a"), "invalid choice: 'load'"),
                       (("loras", "add"), "the following arguments are required: name"),
                       (("loras", "list", "extra"), "unrecognized arguments: extra")]:
        p = run_cli(*args, "--url", url)
        assert p.returncode == 2 and said in p.stderr and "Traceback" not in p.stderr, (args, p.stderr)
    p = run_cli("hello", "--voice-mode", "both")
    assert p.returncode == 2 and "--voice-mode needs --voice" in p.stderr


def test_voices_functions_send_the_registry_inputs(monkeypatch):
    sent = {}

    def fake(protocol, url, model, arrays, output, timeout):
        sent.update(protocol=protocol, model=model, arrays=arrays)
        return np.array([b"a", b"b"], dtype=object)

    monkeypatch.setattr(voxcpm_client.client, "_infer_once", fake)
    assert voxcpm_client.add_voice("a", np.zeros(5), 16000, text="hi", protocol="grpc") == ["a", "b"]
    arrays = sent["arrays"]
    assert sent["model"] == "voices" and sent["protocol"] == "grpc"
    assert set(arrays) == {"ACTION", "NAME", "AUDIO", "SAMPLE_RATE", "TEXT"} and arrays["AUDIO"].dtype == np.float32
    assert arrays["ACTION"][0] == b"add" and arrays["SAMPLE_RATE"].dtype == np.int32
    voxcpm_client.add_voice("a", np.zeros(5), 16000, lora="dialect")  # the voice's default adapter
    assert set(sent["arrays"]) == {"ACTION", "NAME", "AUDIO", "SAMPLE_RATE", "LORA"}
    assert sent["arrays"]["LORA"].dtype == np.object_ and sent["arrays"]["LORA"][0] == b"dialect"
    voxcpm_client.remove_voice("a")
    assert set(sent["arrays"]) == {"ACTION", "NAME"} and sent["arrays"]["ACTION"][0] == b"remove"
    voxcpm_client.list_voices()
    assert set(sent["arrays"]) == {"ACTION"}


def test_loras_functions_send_the_registry_inputs(monkeypatch):
    sent = []

    def fake(protocol, url, model, arrays, output, timeout):
        sent.append((protocol, model, {k: list(v) for k, v in arrays.items()}, output))
        return np.array([b"narrator"], dtype=object)

    monkeypatch.setattr(voxcpm_client.client, "_infer_once", fake)
    assert voxcpm_client.add_lora("narrator", protocol="grpc") == ["narrator"]
    assert voxcpm_client.remove_lora("narrator") == ["narrator"]
    assert voxcpm_client.list_loras() == ["narrator"]
    assert sent == [("grpc", "loras", {"ACTION": [b"add"], "NAME": [b"narrator"]}, "NAMES"),
                    ("http", "loras", {"ACTION": [b"remove"], "NAME": [b"narrator"]}, "NAMES"),
                    ("http", "loras", {"ACTION": [b"list"]}, "NAMES")]
    with pytest.raises(TypeError, match="name"):
        voxcpm_client.add_lora(None)


# ---------------------------------------------------------------- perf_analyzer input files

PERF = os.path.join(REPO, "perf")
PERF_FILES = sorted(glob.glob(os.path.join(PERF, "*.json")))


def test_perf_files_present():
    names = {os.path.basename(p) for p in PERF_FILES}
    for s in ("short", "medium", "long", "zh", "mixed"):
        assert {f"tts_{s}.json", f"tts_{s}_fixed100.json"} <= names


@pytest.mark.parametrize("path", PERF_FILES, ids=os.path.basename)
def test_perf_file_structure(path):
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    assert list(doc) == ["data"] and isinstance(doc["data"], list) and doc["data"]
    fixed = "_fixed" in os.path.basename(path)
    for entry in doc["data"]:
        assert set(entry) == ({"TEXT", "SEED", "MIN_LENGTH", "MAX_LENGTH"} if fixed else {"TEXT", "SEED"})
        for name, tensor in entry.items():
            assert set(tensor) == {"content", "shape"} and tensor["shape"] == CONTRACT[name][1]
            assert len(tensor["content"]) == 1
        text = entry["TEXT"]["content"][0]
        assert isinstance(text, str) and text.strip()
        for name in set(entry) - {"TEXT"}:
            assert isinstance(entry[name]["content"][0], int)
        if fixed:
            n = int(os.path.basename(path).rsplit("_fixed", 1)[1].split(".")[0])
            assert entry["MIN_LENGTH"]["content"] == entry["MAX_LENGTH"]["content"] == [n]
        # the inputs build with the client too (names/dtypes agree with the contract)
        input_arrays(text, seed=entry["SEED"]["content"][0])


def test_perf_text_lengths():
    def words(name):
        with open(os.path.join(PERF, name), encoding="utf-8") as f:
            return [len(e["TEXT"]["content"][0].split()) for e in json.load(f)["data"]]
    assert all(3 <= n <= 8 for n in words("tts_short.json"))
    assert all(15 <= n <= 25 for n in words("tts_medium.json"))
    assert all(50 <= n <= 70 for n in words("tts_long.json"))
    with open(os.path.join(PERF, "tts_zh.json"), encoding="utf-8") as f:
        zh = [e["TEXT"]["content"][0] for e in json.load(f)["data"]]
    assert all(any("\u4e00" <= ch <= "\u9fff" for ch in t) for t in zh)


def test_perf_files_match_generator(tmp_path):
    subprocess.run([sys.executable, os.path.join(PERF, "make_inputs.py"), "--out", str(tmp_path)],
                   check=True, capture_output=True)
    for path in glob.glob(str(tmp_path / "*.json")):
        with open(path, encoding="utf-8") as a, open(os.path.join(PERF, os.path.basename(path)), encoding="utf-8") as b:
            assert a.read() == b.read(), os.path.basename(path)


def test_the_library_refuses_what_it_would_otherwise_send_converted():
    """None or a number as text was spoken as "None" / "123", a voice named None stored as "None",
    integer samples sent unscaled, a sample rate past int32 wrapped round (2**32 + 16000 was 16000)."""
    from voxcpm_client import add_voice, input_arrays, remove_voice

    url = f"127.0.0.1:{free_port()}"  # nothing listens: every case is refused before any request
    with pytest.raises(TypeError, match="text must be a string, got NoneType"):
        input_arrays(None)
    with pytest.raises(TypeError, match="text must be a string, got int"):
        input_arrays(123)
    with pytest.raises(TypeError, match="voice must be a string"):
        input_arrays("hi", voice=5)
    with pytest.raises(TypeError, match="reference_audio must be float samples"):
        input_arrays("hi", reference_audio=np.zeros(16000, np.int16), reference_sample_rate=16000)
    audio = np.zeros(16000, np.float32)
    for name, samples, rate, error, said in [
            (None, audio, 16000, TypeError, "name must be a string, got NoneType"),
            ("v", np.zeros(16000, np.int16), 16000, TypeError, "audio must be float samples"),
            ("v", audio, 2**32 + 16000, ValueError, "sample_rate must be a positive number of Hz"),
            ("v", audio, 16000.5, TypeError, "sample_rate must be an integer"),
            ("v", audio, True, TypeError, "sample_rate must be an integer")]:
        with pytest.raises(error, match=re.escape(said)):
            add_voice(name, samples, rate, url=url)
    with pytest.raises(TypeError, match="name must be a string"):
        remove_voice(None, url=url)
    assert input_arrays("hi", voice=b"v")["VOICE"][0] == b"v"  # bytes, already encoded, go as they are
