"""The OpenAI speech API gateway (gateway/voxcpm_gateway) in front of a real tritonserver on loopback
(tiny checkpoint, CPU), driven by the official `openai` SDK: every response_format decoded back and
compared with the `tts` model's audio, streaming (raw chunks and server-sent events), voices,
instructions, errors and limits, a busy server, a client hanging up mid-stream, an unreachable
Triton, metrics.

The gateway runs as its own process (`python -m voxcpm_gateway`) with only gateway/ on its path,
as scripts/serve.sh runs it.
"""

import base64
import io
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import require_module, sine_wave

openai = require_module("openai", "openai in requirements-test.txt")
av = require_module("av", "av in requirements.txt")
sf = require_module("soundfile", "soundfile in requirements.txt")
require_module("tritonclient", "tritonclient[all] in requirements.txt")

from tests.server import REPO, _children, free_port, edited_repository, triton_server_factory  # noqa: E402,F401
from tests.test_server import _inputs, grpcclient, stream_infer, tts_http, wait_idle  # noqa: E402
from tests.test_server import metrics as triton_metrics  # noqa: E402
from voxcpm_triton.testing.checkpoint_writer import TINY_CONFIG, write_checkpoint  # noqa: E402

KEY = "sk-test-" + secrets.token_hex(8)
MODEL = "voxcpm2"
TEXT = "The gateway speaks for Triton."
TRANSCRIPT = "What the stored audio says, in UTF-8: Grüße."  # non-ASCII, as UTF-8 form text
PATCH = TINY_CONFIG["patch_size"] * 1920  # samples per decode step at 48 kHz
NO_RETRY = ("BOOL", np.array([False]))  # `tts` would retry bad cases; `tts_stream` never does
GEN = {"seed": 7, "min_length": 6, "max_length": 6}
LONG = {"seed": 3, "min_length": 24, "max_length": 24}  # chunks of 1, 4, 16, 3 patches
UPLOAD_LIMIT_MB = 1


def quantize16(audio):
    """The documented rule: clip to [-1, 1], round(x * 32767)."""
    return np.rint(np.clip(audio, -1.0, 1.0) * 32767.0).astype(np.int16)


class Audio:
    """What Triton makes of one request: `streamed` by tts_stream (what the gateway is sent) and
    `whole` by tts (the public whole-utterance model), equal within 1e-4."""

    def __init__(self, server, text, seed=7, length=6, whole=True, **inputs):
        gen = dict(SEED=seed, MIN_LENGTH=length, MAX_LENGTH=length, **inputs)
        # Twice: the first run of a prompt fills the decoder's prefix cache and every later one
        # (the gateway's) starts from it, which sums a few floats in another order (~1e-6).
        cold, self.streamed = (np.concatenate(stream_infer(server, "tts_stream", _inputs(grpcclient, text, **gen)))
                               for _ in range(2))
        np.testing.assert_allclose(self.streamed, cold, atol=1e-4, rtol=0)
        assert self.streamed.shape == (length * PATCH,) and np.abs(self.streamed).max() > 0
        self.whole = None
        if whole:
            self.whole, rate = tts_http(server, text, RETRY_BADCASE=NO_RETRY, **gen)
            assert rate == 48000
            np.testing.assert_allclose(self.streamed, self.whole, atol=1e-4, rtol=0)

    def check_pcm16(self, got: np.ndarray):
        """The gateway's 16-bit samples are tts_stream's audio under the rule (the same request, the
        same cache state), and tts's within its 1e-4 of tts_stream (4 steps of 1/32767). Under the
        rule, not always bit for bit: a loaded machine's slower steps can make the decoder send a
        chunk early (playback_margin_ms), and VAE calls of other lengths round a few samples the
        other way (seen in CI: 2 of 46,080 one step apart). A wrong rule would miss half of them."""
        assert got.shape == self.streamed.shape
        diff = np.abs(got.astype(np.int32) - quantize16(self.streamed))
        assert diff.max() <= 1 and np.count_nonzero(diff) <= got.size // 1000, (diff.max(), np.count_nonzero(diff))
        if self.whole is not None:
            assert np.abs(got.astype(np.int32) - quantize16(self.whole)).max() <= 4


class Gateway:
    """`python -m voxcpm_gateway` on a free loopback port; stop() ends it and checks it is gone."""

    def __init__(self, triton_url: str, tmp: Path, env: dict | None = None, wait_healthy: bool = True,
                 args: list[str] = ()):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp / f"gateway-{self.port}.log"
        cmd = [sys.executable, "-m", "voxcpm_gateway", "--triton-url", triton_url, "--host", "127.0.0.1",
               "--port", str(self.port), "--model-name", MODEL, "--model-name", "tts-1",
               "--max-upload-mb", str(UPLOAD_LIMIT_MB), "--log-level", "warning", *args]
        # only gateway/ on its path: it must not need python_backend (no model code, no torch)
        full_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        full_env.update(PYTHONPATH=str(REPO / "gateway"), VOXCPM_OPENAI_API_KEY=KEY, **(env or {}))
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, env=full_env, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        try:
            while True:
                assert self.proc.poll() is None, f"the gateway exited: {self.log_path.read_text()}"
                status = self.status("/health")
                if status == 200 or (status == 503 and not wait_healthy):
                    break
                assert time.monotonic() < deadline, f"gateway not healthy: {status}\n{self.log_path.read_text()}"
                time.sleep(0.2)
        except BaseException:  # nobody gets this object to stop it: the process goes here
            self.proc.kill()
            self.proc.wait(30)
            raise

    def status(self, path: str) -> int | None:
        try:
            with urllib.request.urlopen(self.url + path, timeout=10) as r:  # past HEALTH_TIMEOUT_S
                return r.status
        except urllib.error.HTTPError as e:
            return e.code
        except OSError:
            return None

    def get(self, path: str, key: str | None = KEY):
        req = urllib.request.Request(self.url + path, headers={"Authorization": f"Bearer {key}"} if key else {})
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.read()

    def metrics(self) -> str:
        return self.get("/metrics", key=None).decode()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(30)
        # uvicorn drains, then ends by the signal it was sent
        assert self.proc.returncode in (0, -signal.SIGTERM), self.log_path.read_text()
        assert not Path(f"/proc/{self.proc.pid}").exists(), "the gateway process is still there"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_checkpoint(str(tmp_path_factory.mktemp("gateway_ckpt")), TINY_CONFIG, seed=3, progress=None)


MAX_VOICES = 3  # the tests below store two voices at most at a time


@pytest.fixture(scope="module")
def server(triton_server_factory, ckpt, tmp_path_factory):  # noqa: F811
    # One tts_stream instance taking one stream: a second concurrent stream is "server busy".
    # Chunks by the schedule only (no playback margin): the tests compare two requests' 16-bit
    # samples exactly, and the VAE's streaming decode of other chunk boundaries differs by ~1e-6.
    repo = edited_repository(tmp_path_factory.mktemp("gateway_repo") / "repo",
                              parameters={"tts_stream": {"max_concurrent_streams": "1"},
                                          "decoder": {"playback_margin_ms": "0"},
                                          "voices": {"max_voices": str(MAX_VOICES)}}, instances={"tts_stream": 1})
    return triton_server_factory(repo, env={"VOXCPM_CHECKPOINT": ckpt})


@pytest.fixture(scope="module")
def gateway(server, tmp_path_factory):
    gw = Gateway(server.grpc_url, tmp_path_factory.mktemp("gateway"))
    yield gw
    gw.stop()


@pytest.fixture(scope="module")
def client(gateway):
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def reference(server):
    """Triton's audio for TEXT with GEN's seed and length."""
    return Audio(server, TEXT)


@pytest.fixture(scope="module")
def other_seed(server):
    return Audio(server, TEXT, seed=8, whole=False).streamed


def speech(client, fmt="pcm", text=TEXT, gen=GEN, **kw):
    return client.audio.speech.create(model=MODEL, input=text, voice=kw.pop("voice", "default"),
                                      response_format=fmt, extra_body={**gen, **kw.pop("extra", {})}, **kw)


def pcm16(data: bytes) -> np.ndarray:
    return np.frombuffer(data, "<i2")


def decode_av(data: bytes):
    with av.open(io.BytesIO(data)) as c:
        rate = c.streams.audio[0].rate
        audio = np.concatenate([f.to_ndarray().reshape(-1) for f in c.decode(audio=0)])
    return audio.astype(np.float32), rate


def best_alignment(decoded: np.ndarray, ref: np.ndarray, max_lag: int = 3000):
    """(lag, correlation) of `ref` within `decoded`: lossy encoders add a delay at the start."""
    n = len(ref) - max_lag
    lag = max(range(max_lag), key=lambda k: float(np.dot(decoded[k:k + n], ref[:n])))
    part = decoded[lag:lag + len(ref)]
    return lag, float(np.corrcoef(part, ref[:len(part)])[0, 1])


def error_body(exc: "openai.APIStatusError") -> dict:
    body = exc.response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


# --- the encoders, without a server ---------------------------------------------------------------------


def test_bad_settings_are_refused_by_name(monkeypatch, capsys):
    sys.path.insert(0, str(REPO / "gateway"))
    from voxcpm_gateway.config import parse_args

    monkeypatch.delenv("OPENAI_API_PORT", raising=False)
    assert parse_args(["--log-level", "WARNING"]).log_level == "warning"
    assert parse_args(["--max-upload-mb", "1e-9"]).max_upload_bytes == 1  # a tiny limit is a byte, not none
    for argv, env, message in (
            (["--log-level", "loud"], {}, "argument --log-level: invalid choice: 'loud'"),
            ([], {"VOXCPM_OPENAI_LOG_LEVEL": "loud"}, "VOXCPM_OPENAI_LOG_LEVEL must be one of critical, error"),
            ([], {"OPENAI_API_PORT": "0"}, "--port must be 1..65535, got 0 (OPENAI_API_PORT=0 tells scripts/serve.sh"),
            # nan passed `<= 0`: a stall timeout of nan failed every connection, a request timeout every request
            ([], {"VOXCPM_OPENAI_STALL_TIMEOUT": "nan"}, "argument --stall-timeout: must be a number above 0 up to 10000000, got 'nan' "
                                                         "(the flag, or VOXCPM_OPENAI_STALL_TIMEOUT)"),
            (["--request-timeout", "NaN"], {}, "argument --request-timeout: must be a number above 0 up to 10000000, got 'NaN'"),
            (["--max-upload-mb", "inf"], {}, "argument --max-upload-mb: must be a number above 0 up to 10000000, got 'inf'"),
            # finite, but past what a byte count or a timer holds (an OverflowError traceback at start)
            ([], {"VOXCPM_OPENAI_MAX_UPLOAD_MB": "1e303"}, "argument --max-upload-mb: must be a number above 0 up to "
                                                          "10000000, got '1e303' (the flag, or VOXCPM_OPENAI_MAX_UPLOAD_MB)"),
            (["--shutdown-timeout", "0"], {}, "argument --shutdown-timeout: must be a number above 0 up to 10000000, got '0'"),
            ([], {"VOXCPM_OPENAI_MAX_PENDING_UPLOADS": "2.5"}, "argument --max-pending-uploads: must be a whole number "
                                                               "above 0 up to 10000000, got '2.5'"),
            (["--max-connections-per-client", "-1"], {}, "argument --max-connections-per-client: must be a whole "
                                                         "number from 0 up to 10000000, got '-1'")):
        with monkeypatch.context() as m:
            for k, v in env.items():
                m.setenv(k, v)
            with pytest.raises(SystemExit) as info:
                parse_args(argv)
        assert info.value.code == 2 and message in capsys.readouterr().err, (argv, env)


def test_the_flags_defaults_are_the_settings_defaults(monkeypatch):
    """One place holds each default (Settings); the command line and the environment start from it."""
    sys.path.insert(0, str(REPO / "gateway"))
    from voxcpm_gateway.config import API_KEY_ENV, Settings, parse_args

    for name in [k for k in os.environ if k.startswith(("VOXCPM_OPENAI_", "OPENAI_API_"))] + [
            "VOXCPM_TRITON_GRPC_URL", API_KEY_ENV]:
        monkeypatch.delenv(name, raising=False)
    assert parse_args([]) == Settings()


def speech_band(a: np.ndarray, rate: int = 48000, top_hz: float = 8000.0) -> np.ndarray:
    """`a` without what lies above `top_hz`."""
    spectrum = np.fft.rfft(a)
    spectrum[np.fft.rfftfreq(len(a), 1 / rate) > top_hz] = 0
    return np.fft.irfft(spectrum, len(a))


def test_pcm_wav_flac_carry_the_quantized_samples():
    """pcm, wav and flac hold exactly clip(x, -1, 1) * 32767 rounded, whatever the chunking; the
    lossy formats keep the waveform (a known delay, high correlation in speech's band: how white
    noise's top octaves come through changes with the encoder's build; PyAV 18.1.1's libmp3lame
    took the full band's correlation from 0.90 to 0.76, and 0.98 to 0.95 below 8 kHz)."""
    sys.path.insert(0, str(REPO / "gateway"))
    from voxcpm_gateway.audio_encoding import FORMATS

    rng = np.random.default_rng(0)
    x = (0.3 * rng.standard_normal(48000)).astype(np.float32)
    x[:8] = [1.5, -1.5, 1.0, -1.0, 0.5 / 32767, 1.5 / 32767, -0.5 / 32767, 2.5 / 32767]  # clipping, ties
    want = quantize16(x)
    assert list(want[:8]) == [32767, -32767, 32767, -32767, 0, 2, 0, 2]
    chunks = [x[:7680], x[7680:38400], x[38400:]]  # 1, 4 and the rest, as tts_stream sends them
    for fmt in FORMATS:
        enc = FORMATS[fmt].make(48000)
        parts = [enc.encode(c) for c in chunks] + [enc.finish()]
        data = b"".join(parts)
        if fmt == "pcm":
            np.testing.assert_array_equal(pcm16(data), want)
        elif fmt in ("wav", "flac"):
            got, rate = sf.read(io.BytesIO(data), dtype="int16")
            assert rate == 48000
            np.testing.assert_array_equal(got, want)
        else:
            got, rate = decode_av(data)
            assert rate == 48000 and len(x) <= len(got) <= len(x) + 3500
            lag, _ = best_alignment(got, x)
            kept = np.corrcoef(speech_band(got[lag:lag + len(x)]), speech_band(x))[0, 1]
            assert kept > 0.85, (fmt, kept)
        if fmt != "flac":  # flac is written whole at the end (its header holds the length)
            assert parts[0], f"{fmt}: nothing to send after the first chunk"


def test_opus_resamples_another_rate_to_48k():
    """Opus is a 48 kHz codec: audio at another rate (a 22.05 kHz model) is resampled, not relabelled."""
    sys.path.insert(0, str(REPO / "gateway"))
    from voxcpm_gateway.audio_encoding import FORMATS

    t = np.arange(22050) / 22050
    x = (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    enc = FORMATS["opus"].make(22050)
    assert enc.out_rate == 48000
    got, rate = decode_av(enc.encode(x) + enc.finish())
    assert rate == 48000 and abs(len(got) - 48000) < 2000  # one second
    spectrum = np.abs(np.fft.rfft(got[4000:44000]))
    assert abs(np.argmax(spectrum) * 48000 / 40000 - 440) < 3  # the same tone, not shifted in pitch


# --- the API as OpenAI clients see it ---------------------------------------------------------------


def test_models_lists_the_served_names(client):
    assert [m.id for m in client.models.list().data] == [MODEL, "tts-1"]
    assert client.models.retrieve("tts-1").id == "tts-1"
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("gpt-4o-mini-tts")
    assert error_body(info.value)["param"] == "model"


@pytest.mark.parametrize("fmt", ["pcm", "wav", "flac", "mp3", "opus", "aac"])
def test_every_format_decodes_to_the_tts_audio(client, reference, other_seed, fmt):
    r = speech(client, fmt)
    assert r.response.status_code == 200
    assert r.response.headers["x-sample-rate"] == "48000"
    data = r.content
    if fmt == "pcm":
        assert r.response.headers["content-type"] == "audio/pcm"
        reference.check_pcm16(pcm16(data))
    elif fmt in ("wav", "flac"):
        got, rate = sf.read(io.BytesIO(data), dtype="int16")
        assert rate == 48000 and sf.info(io.BytesIO(data)).format == fmt.upper()
        reference.check_pcm16(got)
    else:
        got, rate = decode_av(data)
        assert rate == 48000
        want = reference.whole
        # the encoder's delay and last-frame padding, at most a few frames
        assert len(want) <= len(got) <= len(want) + 3500, len(got)
        lag, corr = best_alignment(got, want)
        assert corr > 0.6, (lag, corr)
        assert abs(best_alignment(got, other_seed)[1]) < 0.3  # another seed's audio does not match


def test_model_aliases_and_the_default_model(client, gateway, reference):
    alias = client.audio.speech.create(model="tts-1", input=TEXT, voice="default", response_format="pcm",
                                       extra_body=GEN)
    reference.check_pcm16(pcm16(alias.content))
    # plain HTTP, as curl sends it: no model (the served one), no voice (zero-shot)
    req = urllib.request.Request(gateway.url + "/v1/audio/speech", method="POST",
                                 data=json.dumps({"input": TEXT, "response_format": "pcm", **GEN}).encode(),
                                 headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        reference.check_pcm16(pcm16(r.read()))


@pytest.mark.parametrize("stream_format,fmt", [("audio", "mp3"), ("sse", "wav")])
def test_streamed_chunks_arrive_before_the_end_and_make_the_whole(client, stream_format, fmt):
    t0 = time.perf_counter()
    arrivals, parts = [], []
    with client.audio.speech.with_streaming_response.create(
            model=MODEL, input=TEXT, voice="default", response_format=fmt, stream_format=stream_format,
            extra_body=LONG) as r:
        assert r.status_code == 200
        if stream_format == "audio":
            assert r.headers["content-type"] == "audio/mpeg"
            for b in r.iter_bytes():
                arrivals.append(time.perf_counter() - t0)
                parts.append(b)
        else:
            assert r.headers["content-type"].startswith("text/event-stream")
            events = []
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(json.loads(line[6:]))
                    arrivals.append(time.perf_counter() - t0)
            assert [e["type"] for e in events[:-1]] == ["speech.audio.delta"] * (len(events) - 1)
            assert events[-1] == {"type": "speech.audio.done"}
            parts = [base64.b64decode(e["audio"]) for e in events[:-1]]
            arrivals = arrivals[:-1]
    whole = speech(client, fmt, gen=LONG).content
    assert b"".join(parts) == whole
    # the first audio left while the server was still making the rest (24 patches in 4 chunks): a
    # response sent whole would arrive within milliseconds
    assert len(parts) >= 3, len(parts)
    assert arrivals[-1] - arrivals[0] > 0.1, arrivals
    if fmt == "wav":
        assert sf.info(io.BytesIO(whole)).frames == 24 * PATCH


def test_instructions_are_the_description_prefix(client, server, reference):
    desc = "A calm, deep voice, speaking slowly"
    want = Audio(server, f"({desc}){TEXT}")
    got = pcm16(speech(client, instructions=desc).content)
    want.check_pcm16(got)
    assert np.abs(got.astype(np.int32) - quantize16(reference.whole)).max() > 100  # the description mattered
    with pytest.raises(openai.BadRequestError) as info:
        speech(client, instructions="calm (really)")
    assert error_body(info.value)["param"] == "instructions"
    with pytest.raises(openai.BadRequestError) as info:  # Triton would name TEXT, the input's field
        speech(client, instructions="calm\x00voice")
    assert error_body(info.value)["param"] == "instructions" and "NUL" in error_body(info.value)["message"]


def test_voices_upload_list_use_delete(client, gateway, server, tmp_path):
    audio = sine_wave(0.7, 16000, freq=190, seed=4)
    wav = tmp_path / "ref.wav"
    sf.write(str(wav), audio, 16000, subtype="FLOAT")
    v = client.audio.voices.create(name="alice", audio_sample=wav.open("rb"), consent="recorded-consent",
                                   extra_body={"ref_text": TRANSCRIPT})
    assert (v.id, v.name, v.object, v.type) == ("alice", "alice", "audio.voice", "audio_sample")
    listed = json.loads(gateway.get("/v1/audio/voices"))
    assert [d["id"] for d in listed["data"]] == ["alice"] and listed["voices"] == ["default", "alice"]

    zero_shot = pcm16(speech(client).content)
    for mode in ("reference", "both"):  # (continuation: tests/test_voices.py)
        voice = {"id": "alice"} if mode == "both" else "alice"  # OpenAI's custom-voice object too
        want = Audio(server, TEXT, whole=False, VOICE=("BYTES", np.array([b"alice"], dtype=object)),
                     VOICE_MODE=("BYTES", np.array([mode.encode()], dtype=object)))
        got = pcm16(speech(client, voice=voice, extra={"voice_mode": mode}).content)
        want.check_pcm16(got)
        assert np.abs(got.astype(np.int32) - zero_shot).max() > 100, mode

    # any common format: AAC in MP4 (m4a) goes through FFmpeg; stereo is averaged to mono
    m4a = io.BytesIO()
    with av.open(m4a, "w", format="mp4") as c:
        s = c.add_stream("aac", rate=16000, layout="stereo")
        frame = av.AudioFrame.from_ndarray(np.stack([audio, audio]), format="fltp", layout="stereo")
        frame.sample_rate = 16000
        for p in [*s.encode(frame), *s.encode(None)]:
            c.mux(p)
    client.audio.voices.create(name="bob", audio_sample=("bob.m4a", m4a.getvalue(), "audio/mp4"), consent="c")
    got = pcm16(speech(client, voice="bob").content)
    inline = Audio(server, TEXT, whole=False, REFERENCE_AUDIO=_mono(m4a.getvalue()), REFERENCE_SAMPLE_RATE=16000)
    assert np.abs(got.astype(np.int32) - quantize16(inline.streamed)).max() <= 4  # stored == inline within 1e-4

    assert client.audio.voices.delete("alice").deleted is True
    client.audio.voices.delete("bob")
    assert json.loads(gateway.get("/v1/audio/voices"))["voices"] == ["default"]
    from tests.test_voices import voices as triton_voices  # Triton's voices model does not reserve "default"

    triton_voices(server, "add", "default", audio.astype(np.float32), 16000)
    try:  # the gateway, where "default" means zero-shot, neither lists it twice nor as a stored voice
        listed = json.loads(gateway.get("/v1/audio/voices"))
        assert listed["voices"] == ["default"] and listed["data"] == [], listed
        with pytest.raises(openai.BadRequestError) as info:  # nor removes what it does not show
            client.audio.voices.delete("default")
        assert error_body(info.value)["param"] == "name" and "reserved" in error_body(info.value)["message"]
        assert "default" in triton_voices(server, "list")
    finally:
        triton_voices(server, "remove", "default")
    with pytest.raises(openai.NotFoundError) as info:
        speech(client, voice="alice")
    assert error_body(info.value) == {"message": "unknown voice 'alice'", "type": "invalid_request_error",
                                      "param": "voice", "code": "voice_not_found"}
    with pytest.raises(openai.NotFoundError):
        client.audio.voices.delete("alice")
    with pytest.raises(openai.BadRequestError) as info:
        client.audio.voices.create(name="../evil", audio_sample=wav.open("rb"), consent="c")
    assert error_body(info.value)["param"] == "name" and "not a valid voice name" in str(info.value)
    # `lora`, the voice's default adapter, must be one the server has loaded (this one has none)
    with pytest.raises(openai.BadRequestError) as info:
        client.audio.voices.create(name="carol", audio_sample=wav.open("rb"), consent="c",
                                   extra_body={"lora": "dialect"})
    err = error_body(info.value)
    assert err["param"] == "lora" and "unknown LoRA adapter 'dialect' (loaded: none)" in err["message"], err
    assert json.loads(gateway.get("/v1/audio/voices"))["voices"] == ["default"]


def _matroska(layout: str, channels: int, rate: int = 16000, seconds: float = 0.3) -> bytes:
    """Interleaved float samples in Matroska (read through PyAV: libsndfile does not know it)."""
    buf = io.BytesIO()
    with av.open(buf, "w", format="matroska") as c:
        s = c.add_stream("pcm_f32le", rate=rate, layout=layout)
        x = sine_wave(seconds, rate, freq=190, seed=5)
        frame = av.AudioFrame.from_ndarray(np.repeat(x, channels)[None, :], format="flt", layout=layout)
        frame.sample_rate = rate
        for p in [*s.encode(frame), *s.encode(None)]:
            c.mux(p)
    return buf.getvalue()


def _wav(channels: int, rate: int = 16000, seconds: float = 0.3) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, np.zeros((int(rate * seconds), channels), np.float32), rate, format="WAV", subtype="FLOAT")
    return buf.getvalue()


def _multipart(gateway, parts: list) -> tuple[int, dict]:
    """POST /v1/audio/voices with these multipart parts: (field, text), (field, raw bytes of a text field
    [, its part's Content-Type]) or (field, (filename, bytes))."""
    boundary = "voxcpm" + secrets.token_hex(8)
    body = b""
    for field, value, *content_type in parts:
        if isinstance(value, (str, bytes)):
            head, data = f'name="{field}"', value.encode() if isinstance(value, str) else value
            if content_type:
                head += f"\r\nContent-Type: {content_type[0]}"
        else:
            head, data = f'name="{field}"; filename="{value[0]}"\r\nContent-Type: application/octet-stream', value[1]
        body += f"--{boundary}\r\nContent-Disposition: form-data; {head}\r\n\r\n".encode() + data + b"\r\n"
    body += f"--{boundary}--\r\n".encode()
    req = urllib.request.Request(gateway.url + "/v1/audio/voices", data=body, method="POST", headers={
        "Authorization": f"Bearer {KEY}", "Content-Type": f"multipart/form-data; boundary={boundary}"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_uploads_of_many_channels_or_odd_rates_are_refused_by_name_and_surround_is_averaged(client, gateway, server):
    """A 7.1 upload is taken (averaged to mono; PyAV's planar read of 8 channels used to crash the
    gateway); more channels than 8, or a rate the voices model does not take, are a 400 naming
    audio_sample before anything is decoded; a text field sent as a file part, or twice, is a 400
    naming it, and so is a text field that is not UTF-8 and names no charset of its own (one that
    does is read in it). The gateway lives on."""
    v = client.audio.voices.create(name="surround", audio_sample=("s.mka", _matroska("7.1", 8), "audio/x-matroska"),
                                   consent="c")
    assert v.id == "surround"
    client.audio.voices.delete("surround")
    cases = [
        (("many.mka", _matroska("22.2", 24), "audio/x-matroska"), "has 24 channels; at most 8"),
        (("many.wav", _wav(9), "audio/wav"), "has 9 channels; at most 8"),
        (("fast.wav", _wav(1, rate=500_000, seconds=0.01), "audio/wav"), "sample rate 500000 Hz is outside"),
    ]
    for upload, message in cases:
        with pytest.raises(openai.BadRequestError) as info:
            client.audio.voices.create(name="odd", audio_sample=upload, consent="c")
        err = error_body(info.value)
        assert err["param"] == "audio_sample" and message in err["message"], err
    sample = ("a.wav", _wav(1))
    for parts, param, message in [
        ([("name", ("name.txt", b"eve")), ("audio_sample", sample)], "name", "must be a text field"),
        ([("name", "eve"), ("ref_text", ("t.txt", b"hi")), ("audio_sample", sample)], "ref_text",
         "must be a text field"),
        ([("name", "eve"), ("name", "eve2"), ("audio_sample", sample)], "name", "more than once"),
        ([("name", "eve"), ("audio_sample", sample), ("audio_sample", sample)], "audio_sample", "more than once"),
        ([("name", "eve"), ("audio_sample", "RIFF....WAVE")], "audio_sample", "came as a text field"),
        ([("name", "eve"), ("audio_sample", _wav(1))], "audio_sample", "came as a text field"),  # binary, too
        # Starlette would decode it as latin-1, and the voice would keep a garbled transcript
        ([("name", "eve"), ("ref_text", "你好，世界".encode("gbk")), ("audio_sample", sample)], "ref_text",
         "'ref_text' is not valid utf-8 text: send UTF-8, or name the charset"),
        ([("name", "eve"), ("ref_text", "Grüße".encode("latin-1")), ("audio_sample", sample)], "ref_text",
         "'ref_text' is not valid utf-8 text"),  # not guessed either: it names no charset
    ]:
        status, body = _multipart(gateway, parts)
        assert status == 400 and body["error"]["param"] == param and message in body["error"]["message"], body
    assert gateway.proc.poll() is None
    assert json.loads(gateway.get("/v1/audio/voices"))["voices"] == ["default"]
    # a text part that names its charset is read in it
    status, body = _multipart(gateway, [("name", "gbk"), ("ref_text", "你好，世界".encode("gbk"), "text/plain; charset=gbk"),
                                        ("audio_sample", ("a.wav", _wav(1, seconds=1.0)))])
    assert status == 200 and body["id"] == "gbk", body
    from voxcpm_triton.serving.voices import VoiceStore

    assert VoiceStore(server.env["VOXCPM_VOICES_DIR"]).load("gbk").transcript == "你好，世界"
    client.audio.voices.delete("gbk")


def _decoders(gateway) -> list[int]:
    """The gateway's upload decoders: children of its forkserver, the gateway's child."""
    return [pid for child in _children(gateway.proc.pid) for pid in _children(child)]


def _partial_upload(gateway, path: str = "/v1/audio/voices", sent: bytes = b"--x\r\n") -> socket.socket:
    """A request whose headers promise a 1000-byte body of which `sent` arrives; the socket stays open."""
    s = socket.create_connection(("127.0.0.1", gateway.port), timeout=60)
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: gateway\r\nAuthorization: Bearer {KEY}\r\n"
              "Content-Type: multipart/form-data; boundary=x\r\nContent-Length: 1000\r\n\r\n".encode() + sent)
    return s


def _slow_flac(seconds: int = 59) -> bytes:
    """8-channel silence at 384 kHz: 0.2 MB for 59 s, over a second of decoding (in bounds)."""
    buf = io.BytesIO()
    with sf.SoundFile(buf, "w", samplerate=384000, channels=8, format="FLAC", subtype="PCM_16") as f:
        second = np.zeros((384000, 8), np.float32)
        for _ in range(seconds):
            f.write(second)
    return buf.getvalue()


def test_an_upload_whose_decoder_crashes_or_runs_long_fails_alone(client, gateway, server, tmp_path):
    """Uploads decode in a child process: one that crashes (here killed with SIGSEGV mid-decode)
    is a 400 naming audio_sample, and so is one past --decode-timeout (its child killed); the
    gateway serves on and no decoder process is left."""
    import threading

    flac = _slow_flac()
    for _ in range(3):  # the decode must still run when the test finds it
        result = {}

        def upload():
            try:
                client.audio.voices.create(name="crash", audio_sample=("c.flac", flac, "audio/flac"), consent="c")
                result["ok"] = True
            except openai.APIStatusError as e:
                result["err"] = error_body(e)

        thread = threading.Thread(target=upload)
        thread.start()
        killed, seen = None, {}
        while thread.is_alive() and killed is None:
            for pid in _decoders(gateway):  # once it has had time to read its work: decoding
                if time.monotonic() - seen.setdefault(pid, time.monotonic()) > 0.2:
                    os.kill(pid, signal.SIGSEGV)
                    killed = pid
            time.sleep(0.01)
        thread.join(120)
        if "ok" in result:
            client.audio.voices.delete("crash")
        if killed:
            break
    err = result.get("err")
    assert killed and err and err["param"] == "audio_sample", result
    assert "the decoder crashed (SIGSEGV)" in err["message"], err
    assert gateway.proc.poll() is None and gateway.status("/health") == 200 and not _decoders(gateway)
    v = client.audio.voices.create(name="after", audio_sample=("a.mka", _matroska("stereo", 2), "audio/x-matroska"),
                                   consent="c")
    client.audio.voices.delete(v.id)

    gw = Gateway(server.grpc_url, tmp_path, args=["--decode-timeout", "0.05"])
    try:
        c = openai.OpenAI(base_url=gw.url + "/v1", api_key=KEY, max_retries=0, timeout=60)
        with pytest.raises(openai.BadRequestError) as info:
            c.audio.voices.create(name="slow", audio_sample=("s.flac", flac, "audio/flac"), consent="c")
        err = error_body(info.value)
        assert err["param"] == "audio_sample" and "took longer than 0.05 s to decode" in err["message"], err
        assert not _decoders(gw)
    finally:
        gw.stop()


def test_uploads_past_the_pending_limit_are_429(client, gateway):
    """Each upload in progress holds its file (spooled to a temporary file as it arrives, then in
    memory) and they decode one at a time: past --max-pending-uploads (4) at once, an upload is
    refused at once with 429 and Retry-After. Uploads still sending their bodies count: else any
    number of them could fill the disk."""
    from concurrent.futures import ThreadPoolExecutor

    def meanwhile():
        v = client.audio.voices.create(name="meanwhile", audio_sample=("a.wav", _wav(1), "audio/wav"), consent="c")
        client.audio.voices.delete(v.id)

    assert _gateway_metric(gateway, "voxcpm_gateway_voice_uploads_in_progress") == 0
    slow = [_partial_upload(gateway) for _ in range(4)]
    try:
        deadline = time.monotonic() + 30
        while _gateway_metric(gateway, "voxcpm_gateway_voice_uploads_in_progress") < 4:
            assert time.monotonic() < deadline, "uploads still sending their bodies were not counted"
            time.sleep(0.1)
        with pytest.raises(openai.RateLimitError) as info:
            meanwhile()
        assert "voice uploads are in progress" in error_body(info.value)["message"], error_body(info.value)
    finally:
        for sock in slow:
            sock.close()
    # hung up mid-body: counted (499), no traceback in the log, their slots free again
    deadline = time.monotonic() + 10
    while _gateway_metric(gateway, "voxcpm_gateway_requests_total", '{format="",route="voices",status="499"}') < 4:
        assert time.monotonic() < deadline, gateway.metrics()
        time.sleep(0.1)
    assert _gateway_metric(gateway, "voxcpm_gateway_voice_uploads_in_progress") == 0
    meanwhile()
    assert "Exception in ASGI application" not in gateway.log_path.read_text()
    flac = _slow_flac(61)  # decoded for a second or more, then refused: longer than 60 s

    def upload(i: int):
        try:
            client.audio.voices.create(name=f"many{i}", audio_sample=("m.flac", flac, "audio/flac"), consent="c")
        except openai.APIStatusError as e:
            return e.status_code, error_body(e), e.response.headers.get("retry-after")
        return 200, None, None

    with ThreadPoolExecutor(7) as pool:
        results = list(pool.map(upload, range(7)))
    busy = [r for r in results if r[0] == 429]
    assert 1 <= len(busy) <= 3, results  # 4 fit; how many of the others came while 4 ran depends on timing
    assert all(err["code"] == "server_busy" and "voice uploads are in progress" in err["message"]
               and retry == "1" for _, err, retry in busy), busy
    assert all(status == 400 and "longer than 60 s" in err["message"] for status, err, _ in results if status != 429)
    assert json.loads(gateway.get("/v1/audio/voices"))["voices"] == ["default"] and not _decoders(gateway)


def _triton_metric(server, metric: str, model: str) -> float:
    """One of Triton's per-model metrics, summed over the model's series."""
    from tests.test_server import metric_samples

    return sum(v for name, labels, v in metric_samples(server) if name == metric and labels.get("model") == model)


def _remove_voices(sdk, names):
    """A test's voices gone, those it never stored too."""
    for name in names:
        try:
            sdk.audio.voices.delete(name)
        except openai.NotFoundError:
            pass


def test_an_upload_holds_its_slot_until_triton_has_stored_it(server, tmp_path):
    """A decoded sample (up to 92 MB: 60 s at 384 kHz in float32) waits in the gateway and in
    Triton until the voices model is done with it: its slot is held until then, else any number of
    decoded uploads pile up there. Both voices instances frozen (SIGSTOP), three uploads reach
    Triton (two held by the instances, the third queued) and hold the three slots; a fourth is 429."""
    from concurrent.futures import ThreadPoolExecutor

    from tests.server import _cmdline

    gw = Gateway(server.grpc_url, tmp_path, args=["--max-pending-uploads", "3"])
    sdk = openai.OpenAI(base_url=gw.url + "/v1", api_key=KEY, max_retries=0, timeout=120)
    voices = [p for p in server.stub_pids() if "/voices/1/model.py" in _cmdline(p)]
    assert len(voices) == 2, voices

    def upload(name: str):
        return sdk.audio.voices.create(name=name, audio_sample=("a.wav", _wav(1), "audio/wav"), consent="c")

    names = [f"held{i}" for i in range(3)]
    try:
        with ThreadPoolExecutor(3) as pool:
            for pid in voices:
                os.kill(pid, signal.SIGSTOP)
            try:
                held = [pool.submit(upload, name) for name in names]
                deadline = time.monotonic() + 60
                while _triton_metric(server, "nv_inference_pending_request_count", "voices") < 1:
                    # the third is in Triton's queue: all three decoded and sent
                    assert time.monotonic() < deadline and not any(f.done() for f in held), \
                        [f.result() for f in held if f.done()]
                    time.sleep(0.1)
                assert _gateway_metric(gw, "voxcpm_gateway_voice_uploads_in_progress") == 3
                with pytest.raises(openai.RateLimitError) as info:
                    upload("fourth")
                assert "voice uploads are in progress" in error_body(info.value)["message"], error_body(info.value)
            finally:
                for pid in voices:
                    os.kill(pid, signal.SIGCONT)
            assert sorted(f.result().id for f in held) == names
        assert _gateway_metric(gw, "voxcpm_gateway_voice_uploads_in_progress") == 0
    finally:
        _remove_voices(sdk, names)
        gw.stop()


def _encodes(server) -> int:
    """vae_encoder's requests so far (Triton's metrics)."""
    return int(_triton_metric(server, "nv_inference_request_success", "vae_encoder"))


def test_a_full_voice_store_is_a_429_the_sdk_does_not_retry(gateway, server):
    """max_voices reached stays reached until a voice is removed: OpenAI's SDK, which retries a 429
    twice by default, raises at the first (x-should-retry: false), and the refused sample is not
    encoded. Replacing a stored voice is not refused."""
    sdk = openai.OpenAI(base_url=gateway.url + "/v1", api_key=KEY, max_retries=2, timeout=60)
    names = [f"full{i}" for i in range(MAX_VOICES)]
    refused = '{format="",route="voices",status="429"}'
    try:
        for name in names:
            sdk.audio.voices.create(name=name, audio_sample=("a.wav", _wav(1), "audio/wav"), consent="c")
        before, encoded = _gateway_metric(gateway, "voxcpm_gateway_requests_total", refused), _encodes(server)
        assert encoded >= MAX_VOICES  # (what the check below reads)
        with pytest.raises(openai.RateLimitError) as info:
            sdk.audio.voices.create(name="onemore", audio_sample=("a.wav", _wav(1), "audio/wav"), consent="c")
        err = error_body(info.value)
        assert err["code"] == "voice_limit_reached" and f"{MAX_VOICES} voices are stored already" in err["message"], err
        headers = info.value.response.headers
        assert headers.get("x-should-retry") == "false" and "retry-after" not in headers, headers
        assert _gateway_metric(gateway, "voxcpm_gateway_requests_total", refused) == before + 1  # no retries
        assert _encodes(server) == encoded
        sdk.audio.voices.create(name=names[0], audio_sample=("a.wav", _wav(1), "audio/wav"), consent="c")
    finally:
        _remove_voices(sdk, names)
    assert json.loads(gateway.get("/v1/audio/voices"))["voices"] == ["default"]


def _mono(data: bytes) -> np.ndarray:
    """Decoded with PyAV as float planar, the channels averaged: the gateway's decoding, by hand."""
    with av.open(io.BytesIO(data)) as c:
        blocks = [f.to_ndarray() for f in c.decode(audio=0)]
    return np.concatenate([b.mean(axis=0, dtype=np.float32) for b in blocks]).astype(np.float32)


# --- errors and limits --------------------------------------------------------------------------------


def test_bad_fields_get_openai_shaped_errors(client, gateway, tmp_path):
    cases = [
        (dict(text=""), openai.BadRequestError, "input", "input is empty"),
        (dict(text="   "), openai.BadRequestError, "input", "input is empty"),
        (dict(fmt="ogg"), openai.BadRequestError, "response_format", "response_format"),
        (dict(speed=2.0), openai.BadRequestError, "speed", "speed must be 1.0"),
        (dict(extra={"cfg_value": 100}), openai.BadRequestError, "cfg_value", "CFG_VALUE must be within"),
        (dict(extra={"inference_timesteps": 0}), openai.BadRequestError, "inference_timesteps",
         "INFERENCE_TIMESTEPS"),
        (dict(extra={"seed": "7"}), openai.BadRequestError, "seed", "seed"),
        (dict(extra={"seed": 2**63}), openai.BadRequestError, "seed", "seed"),
        (dict(extra={"voice_mode": "both"}), openai.BadRequestError, "voice_mode", "voice_mode needs a stored voice"),
        (dict(extra={"cfg_value": 1e40}), openai.BadRequestError, "cfg_value", "cfg_value must be a finite number"),
        (dict(gen={}, extra={"min_length": 5000}), openai.BadRequestError, "min_length", "MIN_LENGTH 5000 is more than"),
        (dict(extra={"cfg": 1.5}), openai.BadRequestError, "cfg", "unknown field 'cfg'"),
        (dict(voice="../x"), openai.BadRequestError, "voice", "not a valid voice name"),
        (dict(voice="nobody"), openai.NotFoundError, "voice", "unknown voice 'nobody'"),
        (dict(text="x" * 5000), openai.BadRequestError, "input", "limit is 4096"),
        (dict(extra={"lora": "dialect"}), openai.BadRequestError, "lora", "LORA"),
    ]
    for kw, exc, param, message in cases:
        kw = dict(kw)
        with pytest.raises(exc) as info:
            speech(client, kw.pop("fmt", "pcm"), text=kw.pop("text", TEXT), **kw)
        err = error_body(info.value)
        assert err["param"] == param and message in err["message"], (kw, err)
        assert err["type"] == "invalid_request_error"
    with pytest.raises(openai.NotFoundError) as info:
        client.audio.speech.create(model="gpt-4o-mini-tts", input=TEXT, voice="default")
    assert error_body(info.value)["code"] == "model_not_found"
    # a client's long value is quoted cut short, not sent back whole
    huge = "m" * 500_000
    with pytest.raises(openai.NotFoundError) as info:
        client.audio.speech.create(model=huge, input=TEXT, voice="default")
    err = error_body(info.value)
    assert len(err["message"]) < 300 and "(500000 characters)" in err["message"], err["message"][:300]
    with pytest.raises(openai.BadRequestError) as info:
        speech(client, "pcm", text=TEXT, extra={huge: 1})
    err = error_body(info.value)
    assert len(err["message"]) < 300 and len(err["param"]) == 80, (err["message"][:300], len(err["param"]))

    # the API key: a wrong one, none at all
    bad = openai.OpenAI(base_url=gateway.url + "/v1", api_key="wrong-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as info:
        bad.models.list()
    assert error_body(info.value)["code"] == "invalid_api_key"
    with pytest.raises(urllib.error.HTTPError) as info:
        gateway.get("/v1/models", key=None)
    assert info.value.code == 401 and json.loads(info.value.read())["error"]["code"] == "invalid_api_key"
    # two Authorization headers, in either order: a proxy checking one and the gateway the other
    # would each pass a key the other never saw
    for keys in ((KEY, "wrong-key"), ("wrong-key", KEY), (KEY, KEY)):
        with socket.create_connection(("127.0.0.1", gateway.port), timeout=30) as s:
            s.sendall(("GET /v1/models HTTP/1.1\r\nHost: x\r\n" + "".join(f"Authorization: Bearer {k}\r\n"
                                                                         for k in keys) + "\r\n").encode())
            assert s.recv(65536).startswith(b"HTTP/1.1 401"), keys
    assert gateway.status("/health") == 200 and gateway.status("/metrics") == 200  # open, like Triton's
    head = urllib.request.Request(gateway.url + "/health", method="HEAD")  # what some load balancers send
    with urllib.request.urlopen(head, timeout=10) as r:
        assert r.status == 200 and r.read() == b""
    # no schema or docs pages beside the API (they would be open past the key), no redirect to a route
    for path in ("/openapi.json", "/docs", "/v1/models/"):
        with pytest.raises(urllib.error.HTTPError) as info:
            gateway.get(path)
        assert info.value.code == 404 and json.loads(info.value.read())["error"]["code"] == "not_found", path

    # request size: an upload past --max-upload-mb, a JSON body past 1 MiB
    big = tmp_path / "big.wav"
    sf.write(str(big), np.zeros(UPLOAD_LIMIT_MB * 600_000, np.float32), 48000, subtype="FLOAT")
    with pytest.raises(openai.APIStatusError) as info:
        client.audio.voices.create(name="big", audio_sample=big.open("rb"), consent="c")
    assert info.value.status_code == 413 and error_body(info.value)["code"] == "request_too_large"
    with pytest.raises(openai.APIStatusError) as info:
        speech(client, text="y" * (2 << 20))
    assert info.value.status_code == 413


def _raw_post(gateway, body: bytes | None, content_type: str | None = "application/json", method: str = "POST",
              path: str = "/v1/audio/speech"):
    """(status, error object) for a request the openai package would not send as it is."""
    headers = {"Authorization": f"Bearer {KEY}", **({"Content-Type": content_type} if content_type else {})}
    req = urllib.request.Request(gateway.url + path, data=body, headers=headers, method=method)
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(req, timeout=60)
    body = json.loads(info.value.read())
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    return info.value.code, body["error"]


def test_malformed_bodies_get_400s_that_name_what_is_wrong(gateway):
    """Valid JSON that no text is (a lone surrogate), a number past any float, no body, a body that
    is not a JSON object or not sent as JSON: 400s that say so, never the gateway's 500."""
    cases = [
        (b'{"input": "a\\ud800b"}', "application/json", "input", "lone surrogate"),
        (b'{"input": "ab", "instructions": "calm \\udfff"}', "application/json", "instructions", "lone surrogate"),
        (b'{"input": "ab", "voice": "x\\udfff"}', "application/json", "voice", "lone surrogate"),
        (b'{"input": "ab", "voice": {"id": "x\\udfff"}}', "application/json", "voice", "lone surrogate"),
        (b'{"input": "ab", "cfg_value": 1' + b"0" * 400 + b"}", "application/json", "cfg_value", "finite number"),
        # a union field's own words, not pydantic's forms ("voice.str: Input should be a valid string")
        (b'{"input": "ab", "voice": {}}', "application/json", "voice", "or an object {\"id\": \"<voice name>\"}: "
         "voice.id: Field required"),
        (b'{"input": "ab", "voice": null}', "application/json", "voice", "got null"),
        (b'{"input": "ab", "voice": {"id": "a", "x": 1}}', "application/json", "voice", "voice.x: Extra inputs"),
        (b'{"input": "ab", "speed": "fast"}', "application/json", "speed", "speed: Input should be a valid number"),
        (None, "application/json", None, "the request body is missing"),
        (b"[1, 2]", "application/json", None, "must be a JSON object"),
        (b'{"input": "ab"}', "application/x-www-form-urlencoded", None, "Content-Type application/json"),
        (b'{"input": "ab"', "application/json", None, "not valid JSON"),
        # what json.loads raises besides a syntax error: FastAPI's generic "error parsing the body" before
        (b'{"input": "a\xff"}', "application/json", None, "not valid JSON: 'utf-8' codec can't decode"),
        (b"[" * 100000 + b"]" * 100000, "application/json", None, "not valid JSON: maximum recursion depth"),
        (b'{"input": "ab", "speed": ' + b"9" * 5000 + b"}", "application/json", None,
         "not valid JSON: Exceeds the limit (4300 digits)"),
    ]
    for body, content_type, param, message in cases:
        status, err = _raw_post(gateway, body, content_type)
        assert status == 400 and err["param"] == param and message in err["message"], (body[:80], err)
        assert err["type"] == "invalid_request_error"
        if "not valid JSON" in message:
            assert err["code"] == "invalid_json", err
    status, err = _raw_post(gateway, None, None, method="GET")
    assert status == 405 and err["type"] == "invalid_request_error" and err["code"] == "method_not_allowed"
    # a voice upload that is not multipart, or multipart the parser refuses: 400s with a code that says so
    for body, content_type, code, message in (
            (b'{"name": "a"}', "application/json", "invalid_content_type", "takes a multipart/form-data body"),
            (b"name=a", "application/x-www-form-urlencoded", "invalid_content_type", "not application/x-www-form"),
            (b"--x\r\n", "multipart/form-data", "invalid_request", "boundary"),
            # cut off: its unfinished part was dropped, then said to be a missing field ("name is required")
            (b'--zz\r\nContent-Disposition: form-data; name="name"\r\n\r\nx\r\n', "multipart/form-data; boundary=zz",
             "invalid_request", "the multipart body ended before its closing boundary"),
            # nothing at all: said as such, not as a body cut off
            (b"", "multipart/form-data; boundary=zz", "invalid_request", "the request body is empty")):
        status, err = _raw_post(gateway, body, content_type, path="/v1/audio/voices")
        assert status == 400 and err["code"] == code and message in err["message"], (content_type, err)
    # instructions go before the input as one TEXT: its limit counts both, and the error says so
    body = json.dumps({"input": "x" * 4000, "instructions": "y" * 200, "response_format": "pcm"}).encode()
    status, err = _raw_post(gateway, body)
    assert status == 400 and err["param"] == "input" and "limit is 4096" in err["message"], err
    assert "after its instructions" in err["message"], err


def _send_raw_request(gateway, body: dict, receive_buffer: int | None = None) -> socket.socket:
    """POST /v1/audio/speech on a plain socket, sent whole; returns the socket."""
    data = json.dumps(body).encode()
    s = socket.socket()
    if receive_buffer:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    s.settimeout(60)
    s.connect(("127.0.0.1", gateway.port))
    s.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"
              + f"Authorization: Bearer {KEY}\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
    return s


def _open_raw_stream(gateway, body: dict) -> tuple[socket.socket, bytes]:
    """POST /v1/audio/speech on a plain socket; returns it once the first body bytes are in."""
    s = _send_raw_request(gateway, body)
    got = b""
    while b"\r\n\r\n" not in got or len(got.split(b"\r\n\r\n", 1)[1]) < 100:
        chunk = s.recv(65536)
        assert chunk, got
        got += chunk
    return s, got


def _gateway_metric(gateway, name: str, labels: str = "") -> float:
    m = re.search(rf"^{re.escape(name)}{re.escape(labels)} ([0-9.e+-]+)$", gateway.metrics(), re.M)
    return float(m.group(1)) if m else 0.0


def test_busy_is_429_and_a_client_hanging_up_frees_the_decoder(client, gateway, server):
    wait_idle(server)
    hung_up_before = _gateway_metric(gateway, "voxcpm_gateway_streams_ended_total", '{outcome="client_disconnected"}')
    sock, head = _open_raw_stream(gateway, {"input": "A long utterance nobody listens to.", "response_format": "pcm",
                                            "seed": 1, "min_length": 2000, "max_length": 2000})
    assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in head.lower()
    try:
        assert _gateway_metric(gateway, "voxcpm_gateway_streams_in_flight") == 1
        # the server's one tts_stream slot is taken: Triton says busy, the client gets 429
        with pytest.raises(openai.RateLimitError) as info:
            speech(client)
        err = error_body(info.value)
        assert err["code"] == "server_busy" and err["message"].startswith("server busy")
        assert info.value.response.headers["retry-after"] == "1"
        steps_before = triton_metrics(server)["voxcpm_engine_decode_steps_total"]
    finally:
        sock.close()  # hang up mid-stream
    m = wait_idle(server)  # decoder: no request running, every KV block free; VAE: no stream
    assert m["voxcpm_engine_decode_steps_total"] - steps_before < 1500, "decoding went on after the client left"
    deadline = time.monotonic() + 30
    while _gateway_metric(gateway, "voxcpm_gateway_streams_in_flight") != 0:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert _gateway_metric(gateway, "voxcpm_gateway_streams_ended_total",
                           '{outcome="client_disconnected"}') == hung_up_before + 1
    # the slot is free again once tts_stream has ended the cancelled stream
    while True:
        try:
            assert len(pcm16(speech(client).content)) == 6 * PATCH
            break
        except openai.RateLimitError:
            assert time.monotonic() < deadline, "tts_stream kept the cancelled stream"
            time.sleep(0.2)


def test_a_client_hanging_up_before_its_first_audio_is_counted_and_cancelled(gateway, server):
    """Gone while the gateway waits for Triton's first audio (nothing sent yet): its Triton request
    is cancelled, the hang-up is counted (499) and logged in a line, not as the ASGI app's failure.
    The client hangs up right after its request. When the server saw the hang-up before it read the
    body, the request never started (nothing counted, nothing logged): it tries again."""
    ended = ("voxcpm_gateway_streams_ended_total", '{outcome="client_disconnected"}')
    gone_label = '{format="pcm",route="speech",status="499"}'
    body = {"input": "Nobody waits for this.", "response_format": "pcm", "seed": 1, "inference_timesteps": 100,
            "min_length": 2000, "max_length": 2000}
    for _ in range(5):
        wait_idle(server)
        hung_up = _gateway_metric(gateway, *ended)
        gone = _gateway_metric(gateway, "voxcpm_gateway_requests_total", gone_label)
        _send_raw_request(gateway, body).close()  # at once: long before its first audio (a hang-up after it is counted with status 200)
        deadline = time.monotonic() + 5
        while _gateway_metric(gateway, *ended) == hung_up and time.monotonic() < deadline:
            time.sleep(0.05)
        log = gateway.log_path.read_text()
        assert "Exception in ASGI application" not in log and "CancelledError" not in log, log[-3000:]
        if _gateway_metric(gateway, *ended) == hung_up + 1:
            break
    else:
        pytest.fail("no hang-up was counted")
    assert _gateway_metric(gateway, "voxcpm_gateway_requests_total", gone_label) == gone + 1
    wait_idle(server)  # its Triton request ended: the decoder and the VAE idle


def test_a_client_that_reads_or_sends_nothing_is_cut_off(server, tmp_path):
    """A client that keeps its connection but reads nothing (its socket full) is cut off after
    --stall-timeout: counted as client_stalled, its Triton request cancelled, so the decoder and the
    stream slot are free long before the utterance's end, with the socket still open. A request
    whose body stops arriving gets a 408 after the same time."""
    gw = Gateway(server.grpc_url, tmp_path, args=["--stall-timeout", "2"])
    stalled = ("voxcpm_gateway_streams_ended_total", '{outcome="client_stalled"}')
    sock = None
    try:
        wait_idle(server)
        steps_before = triton_metrics(server)["voxcpm_engine_decode_steps_total"]
        sock = _send_raw_request(gw, {"input": "Nobody reads this.", "response_format": "pcm", "seed": 1,
                                      "min_length": 2000, "max_length": 2000}, receive_buffer=4096)
        deadline = time.monotonic() + 120
        while _gateway_metric(gw, *stalled) == 0:
            assert time.monotonic() < deadline, gw.log_path.read_text()[-3000:]
            time.sleep(0.2)
        m = wait_idle(server)
        assert m["voxcpm_engine_decode_steps_total"] - steps_before < 1500, "decoding went on after the cut"
        c = openai.OpenAI(base_url=gw.url + "/v1", api_key=KEY, max_retries=0, timeout=60)
        assert len(pcm16(speech(c).content)) == 6 * PATCH  # the one tts_stream slot is free again
        assert _gateway_metric(gw, "voxcpm_gateway_streams_in_flight") == 0
        assert "read nothing for 2 s" in gw.log_path.read_text()
        # the other way: a request body (an upload, a speech request) that stops arriving is a 408
        for path in ("/v1/audio/voices", "/v1/audio/speech"):
            t0 = time.monotonic()
            with _partial_upload(gw, path) as partial:
                head = partial.recv(65536)
                while b"\r\n\r\n" not in head or not head.rstrip().endswith(b"}"):
                    more = partial.recv(65536)
                    assert more, head
                    head += more
            assert head.startswith(b"HTTP/1.1 408") and b'"code":"body_timeout"' in head, head
            assert 1.5 < time.monotonic() - t0 < 30, path
        # a body that trickles in, a byte well within each stall timeout, is a 408 too: once it falls a stall
        # timeout behind the least average rate (64 KiB/s)
        t0, head = time.monotonic(), b""
        with _partial_upload(gw) as partial:
            partial.settimeout(0.5)
            while not head.rstrip().endswith(b"}"):
                assert time.monotonic() - t0 < 20, f"a trickling body was not cut off: {head!r}"
                try:
                    partial.sendall(b"x")
                    more = partial.recv(65536)
                except socket.timeout:
                    continue
                except OSError:
                    break
                if not more:
                    break
                head += more
        assert head.startswith(b"HTTP/1.1 408") and b"arrived too slowly" in head, head
    finally:
        if sock is not None:
            sock.close()
        gw.stop()


def test_health_is_503_when_triton_answers_nothing(tmp_path):
    """A gRPC server that takes calls and never answers them (a stuck Triton): /health says 503
    within its timeout instead of hanging with it, and a voice call ends at --voice-timeout (504),
    letting go of what it held (an upload's slot)."""
    import asyncio
    import threading

    import grpc

    port, started, stop = free_port(), threading.Event(), threading.Event()

    def serve():
        async def main():
            async def never(request, context):
                await asyncio.sleep(3600)

            async def never_streamed(requests, context):
                await asyncio.sleep(3600)
                yield b""

            class Stuck(grpc.GenericRpcHandler):
                def service(self, details):
                    if details.method.endswith("ModelStreamInfer"):
                        return grpc.stream_stream_rpc_method_handler(never_streamed)
                    return grpc.unary_unary_rpc_method_handler(never)

            server = grpc.aio.server(handlers=[Stuck()])
            server.add_insecure_port(f"127.0.0.1:{port}")
            await server.start()
            started.set()
            while not stop.is_set():
                await asyncio.sleep(0.05)
            await server.stop(0)

        asyncio.run(main())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert started.wait(30)
    gw = Gateway(f"127.0.0.1:{port}", tmp_path, wait_healthy=False,  # its own wait got 503s too
                 args=["--voice-timeout", "1"])
    try:
        t0 = time.monotonic()
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(gw.url + "/health", timeout=60)
        assert info.value.code == 503 and time.monotonic() - t0 < 10  # HEALTH_TIMEOUT_S is 5
        t0 = time.monotonic()
        with pytest.raises(urllib.error.HTTPError) as info:
            gw.get("/v1/audio/voices")
        body = json.loads(info.value.read())["error"]
        assert info.value.code == 504 and body["code"] == "request_timeout", body
        assert "voice timeout of 1 s (--voice-timeout)" in body["message"] and time.monotonic() - t0 < 10, body
    finally:
        gw.stop()
        stop.set()
        thread.join(10)


def test_a_connection_that_never_finishes_its_headers_is_closed(tmp_path):
    """uvicorn waits for good on a request's headers (a slow-loris client holds its connection, and
    enough of them the gateway's file descriptors): the gateway closes a connection whose headers are
    not in within --stall-timeout, on a fresh connection and on a kept-alive one after a response."""
    gw = Gateway(f"127.0.0.1:{free_port()}", tmp_path, wait_healthy=False, args=["--stall-timeout", "2"])

    def closed_within(s: socket.socket, seconds: float) -> bool:
        s.settimeout(seconds)
        try:
            while s.recv(65536):
                pass
            return True
        except socket.timeout:
            return False

    try:
        with socket.create_connection(("127.0.0.1", gw.port)) as s:
            t0 = time.monotonic()
            s.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\n")
            assert closed_within(s, 15) and time.monotonic() - t0 >= 1.5
        with socket.create_connection(("127.0.0.1", gw.port)) as s:
            s.sendall(f"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n\r\n".encode())
            s.settimeout(10)
            assert s.recv(65536).startswith(b"HTTP/1.1 200")
            s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n")  # the next request's headers, half of them
            assert closed_within(s, 15)
        assert gw.status("/v1/models") in (200, 401)  # the gateway itself is fine
    finally:
        gw.stop()


def test_request_headers_past_64_kib_are_431_and_the_connection_closed(tmp_path):
    """uvicorn's httptools protocol bounds no header: one connection sending a 120 MiB header held
    the event loop for seconds, every stream with it (a review). Past 64 KiB of request line and
    headers, fresh or on a kept-alive connection, the gateway answers 431 and closes; a request with
    60 KiB of headers is served, its body in the same packets too."""
    gw = Gateway(f"127.0.0.1:{free_port()}", tmp_path, wait_healthy=False)

    def answer(s: socket.socket) -> bytes:
        got = b""
        while chunk := s.recv(65536):
            got += chunk
        return got

    try:
        for kept_alive in (False, True):
            with socket.create_connection(("127.0.0.1", gw.port), timeout=30) as s:
                if kept_alive:
                    s.sendall(f"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n\r\n".encode())
                    first = b""
                    while b"\r\n\r\n" not in first or len(first.split(b"\r\n\r\n", 1)[1]) < int(
                            re.search(rb"content-length: (\d+)", first.lower()).group(1)):
                        first += s.recv(65536)
                    assert first.startswith(b"HTTP/1.1 200"), first
                s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: ")
                for _ in range(25):  # 100 KiB of one header, 4 KiB at a time
                    s.sendall(b"a" * 4096)
                got = answer(s)  # the 431, read whole: the gateway drops what comes after it, then closes
            assert got.startswith(b"HTTP/1.1 431"), got[:200]
            err = json.loads(got.split(b"\r\n\r\n", 1)[1])["error"]
            assert err["code"] == "request_header_fields_too_large" and "65536 bytes" in err["message"], err
        # a head over the limit that comes whole in one send, or behind a request on a kept-alive
        # connection: parsed by h11, then refused all the same
        big = f"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nX-Big: {'a' * 70000}\r\n\r\n"
        small = f"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n\r\n"
        for data in (big, small + big):
            with socket.create_connection(("127.0.0.1", gw.port), timeout=30) as s:
                s.sendall(data.encode())
                got = answer(s)
            assert got.count(b"HTTP/1.1 431") == 1 and got.count(b"HTTP/1.1 200") == data.count(small), got[:300]
        assert "refusing a request from 127.0.0.1: its line and headers are over 65536 bytes" in gw.log_path.read_text()
        body = json.dumps({"model": MODEL, "input": TEXT, "voice": "default", "speed": 9}).encode()
        with socket.create_connection(("127.0.0.1", gw.port), timeout=30) as s:
            s.sendall(f"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                      f"X-Pad: {'a' * 60000}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                      "Connection: close\r\n\r\n".encode() + body)
            got = answer(s)
        assert got.startswith(b"HTTP/1.1 400") and b'"param":"speed"' in got, got[:300]
        assert gw.proc.poll() is None
    finally:
        gw.stop()


def test_a_stream_still_running_past_the_shutdown_timeout_ends_with_an_error_event(server, tmp_path):
    """uvicorn cancels what still runs once its graceful shutdown time is up: an SSE stream was then
    closed without the `error` event the API promises (a review). Past --shutdown-timeout the
    stream gets a 503 `error` event, its Triton request is cancelled and the gateway exits."""
    wait_idle(server)
    gw = Gateway(server.grpc_url, tmp_path, args=["--shutdown-timeout", "2"])
    try:
        sock, got = _open_raw_stream(gw, {"model": MODEL, "input": "A long utterance cut by a shutdown.",
                                          "voice": "default", "response_format": "pcm", "stream_format": "sse",
                                          "seed": 1, "min_length": 2000, "max_length": 2000})
        t0 = time.monotonic()
        gw.proc.send_signal(signal.SIGTERM)
        with sock:
            while chunk := sock.recv(65536):
                got += chunk
        waited = time.monotonic() - t0
        body, chunked = got.split(b"\r\n\r\n", 1)[1], b""
        while body:  # HTTP/1.1's chunked framing taken off
            size, _, rest = body.partition(b"\r\n")
            chunked, body = chunked + rest[:int(size, 16)], rest[int(size, 16) + 2:]
        events = [json.loads(e[len(b"data: "):]) for e in chunked.split(b"\n\n") if e.startswith(b"data: ")]
        assert events[0]["type"] == "speech.audio.delta" and events[-1]["type"] == "error", events[-1]
        assert events[-1]["error"]["code"] == "server_unavailable" and "shutting down" in events[-1]["error"]["message"]
        assert 1.5 < waited < 20, waited
        assert gw.proc.wait(30) in (0, -signal.SIGTERM)
        wait_idle(server)  # its Triton request cancelled
        assert "Exception in ASGI application" not in gw.log_path.read_text()
    finally:
        gw.stop()


def test_a_request_still_waiting_for_triton_past_the_shutdown_timeout_gets_a_503(tmp_path):
    """A request whose Triton call has not answered yet when the drain ends (here a "Triton" that takes
    the connection and never answers) gets a JSON 503, not uvicorn's text 500: gRPC's own
    CancelledError was taken for a failure (a review). So does a voice upload waiting for Triton."""
    from concurrent.futures import ThreadPoolExecutor

    with socket.socket() as mute, ThreadPoolExecutor(1) as pool:
        mute.bind(("127.0.0.1", 0))
        mute.listen(8)
        gw = Gateway(f"127.0.0.1:{mute.getsockname()[1]}", tmp_path, wait_healthy=False,
                     args=["--shutdown-timeout", "2"])
        try:
            sock = _send_raw_request(gw, {"model": MODEL, "input": TEXT, "voice": "default",
                                          "response_format": "pcm", **GEN})
            upload = pool.submit(_multipart, gw, [("name", "eve"), ("audio_sample", ("a.wav", _wav(1)))])
            time.sleep(2)  # their calls to "Triton" under way (the upload decoded first)
            t0 = time.monotonic()
            gw.proc.send_signal(signal.SIGTERM)
            got = b""
            with sock:
                while chunk := sock.recv(65536):
                    got += chunk
            waited = time.monotonic() - t0
            head, body = got.split(b"\r\n\r\n", 1)
            assert head.startswith(b"HTTP/1.1 503") and b"retry-after: 1" in head.lower(), got[:400]
            err = json.loads(body)["error"]
            assert err["code"] == "server_unavailable" and "gateway is shutting down" in err["message"], err
            assert 1.5 < waited < 6, waited
            status, body = upload.result(30)
            assert status == 503 and body["error"]["code"] == "server_unavailable", body
            assert gw.proc.wait(30) in (0, -signal.SIGTERM)
            assert "Exception in ASGI application" not in gw.log_path.read_text()
        finally:
            gw.stop()


def test_an_http_1_0_client_gets_the_stream_ended_by_the_close(gateway, server):
    """HTTP/1.0 has no chunked encoding: a streamed response to such a client is its bytes, ended
    by closing the connection (httptools sent it chunks, their framing in the audio: a review)."""
    wait_idle(server)
    body = json.dumps({"model": MODEL, "input": TEXT, "voice": "default", "response_format": "pcm", **GEN}).encode()
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=60) as s:
        s.sendall(f"POST /v1/audio/speech HTTP/1.0\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json"
                  f"\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        got = b""
        while chunk := s.recv(65536):
            got += chunk
    head, data = got.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding" not in head.lower(), head
    assert len(data) == GEN["max_length"] * PATCH * 2


def test_one_address_holds_at_most_max_connections_per_client(tmp_path):
    """One host opening as many idle connections as the gateway may hold files kept everybody else out.
    Past --max-connections-per-client a connection from that address gets 429 (the official client's
    RateLimitError) and is closed; other addresses are served, and so is the first once it has let go
    of one."""
    gw = Gateway(f"127.0.0.1:{free_port()}", tmp_path, wait_healthy=False, args=["--max-connections-per-client", "3"])
    held = [socket.create_connection(("127.0.0.1", gw.port)) for _ in range(3)]
    try:
        c = openai.OpenAI(base_url=gw.url + "/v1", api_key=KEY, max_retries=0, timeout=30)
        with pytest.raises(openai.RateLimitError) as info:
            c.models.list()
        assert error_body(info.value)["code"] == "too_many_connections", error_body(info.value)
        assert "at most 3 at once (--max-connections-per-client)" in error_body(info.value)["message"]
        with socket.create_connection(("127.0.0.1", gw.port), source_address=("127.0.0.2", 0)) as other:
            other.sendall(f"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n\r\n".encode())
            other.settimeout(10)
            assert other.recv(65536).startswith(b"HTTP/1.1 200")
        held.pop().close()
        assert MODEL in [m.id for m in c.models.list().data]
        c.close()
        for s in held:
            s.close()
        held = []
        assert re.search(r"^voxcpm_gateway_connections_refused_total 1\.0$", gw.metrics(), re.M), gw.metrics()
        assert "refusing connections from 127.0.0.1: it holds 3 already" in gw.log_path.read_text()
    finally:
        for s in held:
            s.close()
        gw.stop()


def test_connections_count_against_an_ipv4_address_or_an_ipv6_64():
    """One IPv6 host usually holds a whole /64: counted by address it would have the cap billions of times."""
    sys.path.insert(0, str(REPO / "gateway"))
    from voxcpm_gateway.connections import client_of

    assert client_of(("192.0.2.7", 5000)) == "192.0.2.7"
    assert client_of(("::ffff:192.0.2.7", 5000, 0, 0)) == "192.0.2.7"  # a dual-stack listener's IPv4 client
    assert client_of(("2001:db8:1:2:aaaa::1", 5000, 0, 0)) == client_of(("2001:db8:1:2:bbbb::9", 1, 0, 0)) \
        == "2001:db8:1:2::/64"
    assert client_of(("2001:db8:1:3::1", 5000, 0, 0)) == "2001:db8:1:3::/64"
    assert client_of(("fe80::1%eth0", 5000, 0, 2)) == "fe80::/64"
    assert client_of(None) == client_of("") == "local"


def test_every_documented_log_level_runs(tmp_path):
    """uvicorn's trace is no level of Python's logging: the gateway must not set it there by name."""
    for level in ("trace", "critical"):
        gw = Gateway(f"127.0.0.1:{free_port()}", tmp_path, wait_healthy=False, args=["--log-level", level])
        try:
            assert gw.status("/health") == 503
        finally:
            gw.stop()


def test_unreachable_triton_is_503(tmp_path):
    gw = Gateway(f"127.0.0.1:{free_port()}", tmp_path, wait_healthy=False)
    try:
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(gw.url + "/health", timeout=30)
        assert info.value.code == 503 and info.value.headers["Retry-After"] == "1"
        c = openai.OpenAI(base_url=gw.url + "/v1", api_key=KEY, max_retries=0, timeout=30)
        with pytest.raises(openai.InternalServerError) as info:
            speech(c)
        assert info.value.status_code == 503 and error_body(info.value)["code"] == "server_unavailable"
        with pytest.raises(openai.InternalServerError) as info:
            c.get("/audio/voices", cast_to=object)
        assert info.value.status_code == 503
    finally:
        gw.stop()


def test_the_gateways_channel_keeps_tritonclients_options_and_backs_off_a_second_at_most():
    """Passing channel_args replaces all of tritonclient's own: the gateway's are those and the backoff."""
    import asyncio

    sys.path.insert(0, str(REPO / "gateway"))
    import tritonclient.grpc.aio as grpcaio

    from voxcpm_gateway.triton_client import channel_args

    made = {}
    real = grpcaio.grpc.aio.insecure_channel
    try:
        def spy(url, options=None, **kw):
            made["options"] = options
            return real(url, options=options, **kw)

        async def build():  # a grpc.aio channel belongs to a running event loop
            await grpcaio.InferenceServerClient("127.0.0.1:1").close()

        grpcaio.grpc.aio.insecure_channel = spy
        asyncio.run(build())
    finally:
        grpcaio.grpc.aio.insecure_channel = real
    assert channel_args() == [*made["options"], ("grpc.initial_reconnect_backoff_ms", 1000),
                              ("grpc.max_reconnect_backoff_ms", 1000)]


def test_the_gateway_finds_a_triton_that_comes_back_within_seconds(tmp_path):
    """A Triton down for long (a restart loading a big model) is found again within a few seconds of
    its return: gRPC's default reconnect backoff grows to two minutes, the gateway's stays at 1 s."""
    from concurrent import futures

    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    class Ready(service_pb2_grpc.GRPCInferenceServiceServicer):
        def ModelReady(self, request, context):
            return service_pb2.ModelReadyResponse(ready=True)

    port = free_port()
    gw = Gateway(f"127.0.0.1:{port}", tmp_path, wait_healthy=False)
    server = grpc.server(futures.ThreadPoolExecutor(2))
    try:
        deadline = time.monotonic() + 45  # Triton away long enough for the default backoff to pass 15 s
        while time.monotonic() < deadline:
            assert gw.status("/health") == 503
            time.sleep(1)
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(Ready(), server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        server.start()
        t0 = time.monotonic()
        while gw.status("/health") != 200:
            assert time.monotonic() - t0 < 5, "the gateway did not reconnect within 5 s"
            time.sleep(0.1)
    finally:
        server.stop(0)
        gw.stop()


def test_normalize_reaches_tts_stream(client, server):
    """`normalize` is sent as NORMALIZE: the same audio as tts_stream with NORMALIZE."""
    text = "It costs $5 on 3/4."
    want = Audio(server, text, whole=False, NORMALIZE=("BOOL", np.array([True])))
    got = pcm16(speech(client, text=text, extra={"normalize": True}).content)
    want.check_pcm16(got)
    plain = Audio(server, text, whole=False).streamed  # the normalized text made other audio
    assert np.abs(got.astype(np.int32) - quantize16(plain)).max() > 100


def test_metrics_count_requests_by_status_and_format(gateway):
    text = gateway.metrics()
    for fmt in ("pcm", "wav", "flac", "mp3", "opus", "aac"):
        assert re.search(rf'voxcpm_gateway_requests_total{{format="{fmt}",route="speech",status="200"}} [1-9]',
                         text), fmt
    for status in ("400", "404", "429"):
        assert re.search(rf'voxcpm_gateway_requests_total{{format="[a-z0-9]*",route="speech",status="{status}"}} '
                         r'[1-9]', text), status
    count = re.search(r'voxcpm_gateway_time_to_first_byte_seconds_count{format="pcm",stream_format="audio"} '
                      r'([0-9.]+)', text)
    assert count and float(count.group(1)) >= 5
    assert re.search(r"^voxcpm_gateway_streams_in_flight 0\.0$", text, re.M)


def test_an_error_mid_stream_ends_the_response_visibly(server, tmp_path):
    """A failure after the first audio (here the gateway's own request timeout): the SSE response,
    already 200, ends with an OpenAI error event; a raw stream ends without the end of its chunked
    body, so no client takes the part for the whole; flac, nothing sent yet, gets the error's status.
    Every time Triton's request is cancelled."""
    gw = Gateway(server.grpc_url, tmp_path, args=["--request-timeout", "2"])
    try:
        c = openai.OpenAI(base_url=gw.url + "/v1", api_key=KEY, max_retries=0, timeout=60)
        long = {"seed": 2, "min_length": 2000, "max_length": 2000}
        with c.audio.speech.with_streaming_response.create(
                model=MODEL, input="A long one, cut short.", voice="default", response_format="pcm",
                stream_format="sse", extra_body=long) as r:
            events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
        assert len(events) >= 2 and {e["type"] for e in events[:-1]} == {"speech.audio.delta"}, events[-1]
        assert events[-1]["type"] == "error", events[-1]
        assert events[-1]["error"]["code"] == "request_timeout" and "2 s" in events[-1]["error"]["message"]
        wait_idle(server)

        got = 0
        with pytest.raises(Exception) as info:  # httpx's RemoteProtocolError: incomplete chunked read
            with c.audio.speech.with_streaming_response.create(
                    model=MODEL, input="A long one, cut short.", voice="default", response_format="pcm",
                    extra_body=long) as r:
                for b in r.iter_bytes():
                    got += len(b)
        assert type(info.value).__name__ == "RemoteProtocolError" and "incomplete" in str(info.value), info.value
        assert got > 0
        wait_idle(server)
        # flac sends its bytes only at the end: the same failure is the timeout's own 504, not a 200
        with pytest.raises(openai.APIStatusError) as info:
            c.audio.speech.create(model=MODEL, input="A long one, cut short.", voice="default",
                                  response_format="flac", extra_body=long)
        assert info.value.status_code == 504 and error_body(info.value)["code"] == "request_timeout"
        wait_idle(server)
        assert 'voxcpm_gateway_streams_ended_total{outcome="error"} 3.0' in gw.metrics()
    finally:
        gw.stop()


def test_a_model_process_that_died_is_503_with_retry_after():
    """Triton's own answer for a dead stub (a voices, loras or tts_stream process killed), and for a
    model it is unloading while it stops (the supervisor's restart), is the server's unavailability,
    not a 500 to give up on."""
    sys.path.insert(0, str(REPO / "gateway"))
    from voxcpm_gateway import errors
    from voxcpm_gateway.speech_request import PARAMS

    for message in ("Stub process 'voices_0_0' is not healthy.", "Stub process 'tts_stream_0_1' is not healthy.",
                    "Request for unknown model: 'tts_stream' has no available versions"):  # Triton stopping
        err = errors.from_triton(message, PARAMS)
        assert (err.status, err.code, err.headers.get("Retry-After")) == (503, "server_unavailable", "1"), err


def test_a_voice_the_store_cannot_read_is_the_servers_error_not_the_clients(tmp_path, monkeypatch):
    """A stored voice corrupted on disk, or a store that hangs: a 500, not a 400 on `voice` (the
    messages as the voice store makes them)."""
    import asyncio
    import threading

    sys.path.insert(0, str(REPO / "gateway"))
    from voxcpm_gateway import errors
    from voxcpm_gateway.speech_request import PARAMS
    from voxcpm_triton.serving.voices import READERS, VoiceStore

    store = VoiceStore(str(tmp_path))
    store.add("v3", np.zeros((2, 4, 3), np.float32), None, None, 16000)
    with open(os.path.join(os.path.realpath(str(tmp_path / "v3")), "latents.safetensors"), "wb") as f:
        f.write(os.urandom(64))
    messages = []
    with pytest.raises(RuntimeError) as info:
        store.load("v3")
    messages.append(str(info.value))
    release = threading.Event()
    monkeypatch.setattr(store, "load", lambda name: release.wait(30))

    async def stuck():
        return await asyncio.gather(*(store.load_async("v3", timeout=0.5) for _ in range(READERS + 1)),
                                    return_exceptions=True)

    try:
        messages += sorted({str(e) for e in asyncio.run(stuck())})
    finally:
        release.set()
    assert len(messages) == 3, messages  # unreadable, did not answer, not answering
    for message in messages:
        err = errors.from_triton(message, PARAMS)
        assert (err.status, err.param) == (500, None), (message, err)


def test_a_gateway_that_decoded_an_upload_leaves_no_temporary_directory(server, tmp_path):
    """The forkserver's directory goes with the gateway, which ends by the signal that stopped it."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    gw = Gateway(server.grpc_url, tmp_path, env={"TMPDIR": str(tmp)})
    try:
        c = openai.OpenAI(base_url=gw.url + "/v1", api_key=KEY, max_retries=0, timeout=120)
        v = c.audio.voices.create(name="brief", audio_sample=("a.wav", _wav(1), "audio/wav"), consent="c")
        c.audio.voices.delete(v.id)
        assert list(tmp.glob("pymp-*")), "the upload did not use the forkserver (nothing to check)"
    finally:
        gw.stop()
    assert not list(tmp.glob("pymp-*")), list(tmp.iterdir())


def test_a_clients_name_that_spells_an_input_is_not_taken_for_that_input():
    """A voice or adapter named like an input (SEED) is quoted in the server's messages; `param`
    names the input the message is about, and a store's failure stays the server's (a 500)."""
    sys.path.insert(0, str(REPO / "gateway"))
    from voxcpm_gateway import errors
    from voxcpm_gateway.speech_request import PARAMS

    cases = {
        "voice 'SEED' has no transcript, so it cannot serve VOICE_MODE 'continuation'": (400, "voice_mode"),
        # the voices model's TEXT named after it is not the speech request's (input)
        "voice 'plain' has no transcript, so it cannot serve VOICE_MODE continuation; add it again with its "
        "transcript (the voices model's TEXT, the OpenAI gateway's ref_text), or use VOICE_MODE reference":
            (400, "voice_mode"),
        "the voice store cannot read voice 'SEED' (bad file); remove it and add it again": (500, None),
        'the voice store did not answer in 10 s reading voice "it\'s SEED"': (500, None),
        "unknown voice 'SEED'": (404, "voice"),
        "LORA: unknown LoRA adapter 'TEXT' (loaded: none)": (400, "lora"),
        # past the positions: the voice when its transcript and audio hold more of them than TEXT
        "the prompt is 4100 positions: TEXT's 5 tokens, PROMPT_TEXT's or the voice's transcript's 4000, 90 patches "
        "of reference audio, 0 of prompt audio and 5 markers; the model's limit is 4096: send shorter text or audio":
            (400, "voice"),
        "the prompt is 4100 positions: TEXT's 4000 tokens, PROMPT_TEXT's or the voice's transcript's 5, 90 patches "
        "of reference audio, 0 of prompt audio and 5 markers; the model's limit is 4096: send shorter text or audio":
            (400, "input"),
        # Triton's own checks quote the input they are about (Triton 2.51's words)
        "[request id: <id_unknown>] unexpected inference input 'SEED' for model 'tts_stream'": (400, "seed"),
        "[request id: <id_unknown>] inference input 'SEED' data-type is 'INT32', but model 'tts' expects 'INT64'":
            (400, "seed"),
        "[request id: <id_unknown>] unexpected shape for input 'SEED' for model 'tts'. Expected [1], got [2]. ":
            (400, "seed"),
    }
    for message, want in cases.items():
        err = errors.from_triton(message, PARAMS)
        assert (err.status, err.param) == want, (message, err)


def test_a_prompt_past_the_models_positions_names_the_field_holding_most_of_them(client, tmp_path):
    """The decoder tells the prompt part by part; `param` is the voice when its transcript and audio
    take more positions than the input, else the input (a probe registered a voice whose transcript
    alone filled the context: the error named `input`)."""
    wav = tmp_path / "ref.wav"
    sf.write(str(wav), sine_wave(0.5, 16000, seed=9), 16000, subtype="FLOAT")
    client.audio.voices.create(name="wordy", audio_sample=wav.open("rb"), consent="c",
                               extra_body={"ref_text": "\N{GRINNING FACE}" * 1024})
    client.audio.voices.create(name="brief", audio_sample=wav.open("rb"), consent="c", extra_body={"ref_text": "Hi."})
    try:
        for voice, text, param in (("wordy", TEXT, "voice"), ("brief", "\N{GRINNING FACE}" * 1024, "input"),
                                   ("default", "\N{GRINNING FACE}" * 1024, "input")):
            extra = {} if voice == "default" else {"voice_mode": "both"}
            with pytest.raises(openai.BadRequestError) as info:
                speech(client, text=text, voice=voice, extra=extra)
            err = error_body(info.value)
            assert err["param"] == param and err["message"].startswith("the prompt is "), (voice, err)
            assert "the model's limit is 4096" in err["message"], err
    finally:
        _remove_voices(client, ["wordy", "brief"])
