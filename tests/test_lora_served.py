"""LoRA adapters through a real tritonserver (tiny checkpoint, CPU): LORA on tts and tts_stream
equals the offline API, a broken adapter is left out at start-up, unknown names are clear errors,
and the `loras` model adds, lists and removes adapters while the server runs."""

import json
import os
import shutil
import sys

import numpy as np
import pytest

from tests.conftest import require_module, sine_wave

require_module("tritonclient", "tritonclient[all] in requirements.txt")
import tritonclient.http as httpclient  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from tests.lora_helpers import write_adapters  # noqa: E402
from tests.server import REPO, edited_repository, triton_server_factory  # noqa: E402,F401
from tests.test_server import tts_http, tts_stream  # noqa: E402
from tests.test_voices import voices  # noqa: E402
from voxcpm_triton.testing.checkpoint_writer import TINY_CONFIG, write_checkpoint  # noqa: E402

TOL = 1e-4
TEXT = "A fine-tuned voice says this."
GEN = dict(SEED=7, MIN_LENGTH=3, MAX_LENGTH=3, INFERENCE_TIMESTEPS=4)
OFFLINE_GEN = dict(seed=7, min_len=3, max_len=3, inference_timesteps=4)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_checkpoint(str(tmp_path_factory.mktemp("lora_ckpt")), TINY_CONFIG, seed=3, progress=None)


@pytest.fixture(scope="module")
def lora_dir(ckpt, tmp_path_factory):
    d = str(tmp_path_factory.mktemp("served_loras"))
    write_adapters(ckpt, os.path.join(d, ".spare"), names=("lm_dit", "everything", "lm_mlp_proj"), seed=1)
    for n in ("lm_dit", "everything"):
        shutil.copytree(os.path.join(d, ".spare", n), os.path.join(d, n))
    # A broken adapter: reported at start-up and left out; the server serves the others.
    os.makedirs(os.path.join(d, "broken"))
    with open(os.path.join(d, "broken", "lora_weights.safetensors"), "wb") as f:
        f.write(b"not a safetensors file")
    return d


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("lora_state"))  # the supervisor's: where the loaded set is kept


@pytest.fixture(scope="module")
def server(triton_server_factory, ckpt, lora_dir, state_dir):  # noqa: F811
    return triton_server_factory("model_repository", env={"VOXCPM_CHECKPOINT": ckpt, "VOXCPM_LORA_DIR": lora_dir,
                                                          "VOXCPM_STATE_DIR": state_dir})


def kept(state_dir):
    """The adapters a supervisor's next server would load (run_state.save_loras)."""
    with open(os.path.join(state_dir, "loras.json"), encoding="utf-8") as f:
        return sorted(json.load(f)["loaded"])


@pytest.fixture(scope="module")
def offline(ckpt, lora_dir):
    from voxcpm_triton import VoxCPM2

    return VoxCPM2.from_pretrained(ckpt, device="cpu", dtype="float32", lora_dir=lora_dir)


def _b(s):
    return ("BYTES", np.array([s.encode()], dtype=object))


def loras(server, action, name=None):
    inputs = []
    for k, v in (("ACTION", action), ("NAME", name)):
        if v is not None:
            t = httpclient.InferInput(k, [1], "BYTES")
            t.set_data_from_numpy(np.array([v.encode()], dtype=object))
            inputs.append(t)
    c = httpclient.InferenceServerClient(server.http_url, network_timeout=300)
    try:
        return [n.decode() for n in c.infer("loras", inputs).as_numpy("NAMES").reshape(-1)]
    finally:
        c.close()


def test_served_lora_equals_the_offline_api_over_http_and_grpc_streaming(server, offline):
    assert loras(server, "list") == ["everything", "lm_dit"]
    for name in ("lm_dit", "everything"):
        whole, _ = tts_http(server, TEXT, LORA=_b(name), RETRY_BADCASE=("BOOL", np.array([False])), **GEN)
        want = offline.generate(TEXT, lora=name, retry_badcase=False, **OFFLINE_GEN)
        assert whole.shape == want.shape and np.abs(whole - want).max() <= TOL, name
        streamed = np.concatenate(tts_stream(server, TEXT, LORA=_b(name), **GEN))
        assert streamed.shape == whole.shape and np.abs(streamed - whole).max() <= TOL, name
    base, _ = tts_http(server, TEXT, LORA=_b(""), **GEN)  # empty: the base model
    assert np.abs(base - offline.generate(TEXT, **OFFLINE_GEN)).max() <= TOL
    assert np.abs(base - whole).max() > 100 * TOL


@pytest.mark.parametrize("name, message", [
    ("nope", r"unknown LoRA adapter 'nope' \(loaded: everything, lm_dit\)"),
    ("broken", r"unknown LoRA adapter 'broken'"),
    ("../lm_dit", r"LORA: '\.\./lm_dit' is not a valid LoRA adapter name"),
])
def test_unknown_or_malformed_lora_is_a_clear_error(server, name, message):
    for call in (tts_http, tts_stream):
        with pytest.raises(InferenceServerException, match=message) as e:
            call(server, TEXT, LORA=_b(name), **GEN)
        if call is tts_http:
            assert e.value.status() == "400"  # the client's mistake (INVALID_ARG), not the server's


def test_loras_model_adds_replaces_and_removes_while_serving(server, lora_dir, state_dir):
    spare = os.path.join(lora_dir, ".spare")
    want, _ = tts_http(server, TEXT, LORA=_b("lm_dit"), **GEN)
    shutil.copytree(os.path.join(spare, "lm_dit"), os.path.join(lora_dir, "copy"))
    assert loras(server, "add", "copy") == ["copy", "everything", "lm_dit"]
    got, _ = tts_http(server, TEXT, LORA=_b("copy"), **GEN)
    assert np.abs(got - want).max() <= TOL
    # Replaced by other weights under the same name: new requests get them.
    shutil.rmtree(os.path.join(lora_dir, "copy"))
    shutil.copytree(os.path.join(spare, "everything"), os.path.join(lora_dir, "copy"))
    assert loras(server, "add", "copy") == ["copy", "everything", "lm_dit"]
    got, _ = tts_http(server, TEXT, LORA=_b("copy"), **GEN)
    other, _ = tts_http(server, TEXT, LORA=_b("everything"), **GEN)
    assert np.abs(got - other).max() <= TOL
    assert loras(server, "remove", "copy") == ["everything", "lm_dit"]
    with pytest.raises(InferenceServerException, match="unknown LoRA adapter 'copy'"):
        tts_http(server, TEXT, LORA=_b("copy"), **GEN)
    assert kept(state_dir) == ["everything", "lm_dit"]


def test_an_adapter_that_makes_the_model_overflow_fails_its_requests_not_others(server, lora_dir):
    """An adapter whose weights pass every load check (finite, and finite once scaled) but make the
    model overflow: its requests fail with an error that names it, instead of audio of NaN; others
    go on."""
    from safetensors.torch import load_file, save_file

    hot = os.path.join(lora_dir, "hot")
    shutil.copytree(os.path.join(lora_dir, ".spare", "lm_dit"), hot)
    f = os.path.join(hot, "lora_weights.safetensors")
    save_file({k: v * 1e36 if k.endswith("lora_B") else v for k, v in load_file(f).items()}, f)
    added = False
    try:
        assert loras(server, "add", "hot") == ["everything", "hot", "lm_dit"]
        added = True
        for call in (tts_http, tts_stream):
            with pytest.raises(InferenceServerException, match=r"not finite \(NaN or Inf\): LoRA adapter 'hot'"):
                call(server, TEXT, LORA=_b("hot"), **GEN)
        base, _ = tts_http(server, TEXT, **GEN)
        assert np.isfinite(base).all() and base.size
    finally:
        if added:
            loras(server, "remove", "hot")
        shutil.rmtree(hot)


@pytest.mark.parametrize("action, name, message", [
    ("remove", "nope", r"unknown LoRA adapter 'nope'"),
    ("add", "missing", r"LoRA adapter directory not found: <lora_dir>/missing \(<lora_dir>: the server's LoRA "
                       r"folder, the decoder's lora_dir or VOXCPM_LORA_DIR\)$"),
    ("add", "broken", r"\] <lora_dir>/broken/lora_weights\.safetensors: cannot read tensors"),
    ("add", "a/b", r"NAME: 'a/b' is not a valid LoRA adapter name"),
    ("add", "z" * 70_000, r"NAME: 'z{80}'\.\.\. \(70000 characters\) is not a valid LoRA adapter name"),
    ("add", None, r"ACTION add needs NAME \(the adapter's subfolder in the LoRA directory\)$"),
    ("remove", None, r"ACTION remove needs NAME \(a loaded adapter's name\)$"),
    ("add", "", r"NAME: '' is not a valid LoRA adapter name: "),
    ("list", "lm_dit", r"ACTION list takes no NAME"),
    ("load", "lm_dit", r"ACTION must be one of add, remove, list, got 'load'"),
])
def test_loras_model_errors_name_the_problem(server, lora_dir, action, name, message):
    with pytest.raises(InferenceServerException, match=message) as info:
        loras(server, action, name)
    assert lora_dir not in info.value.message() and os.path.realpath(lora_dir) not in info.value.message()
    assert loras(server, "list") == ["everything", "lm_dit"]


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_client_cli_loras(server, lora_dir, protocol):
    """`voxcpm-tts loras add|list|remove` over either protocol; a refused add is one line, exit 2."""
    import subprocess

    url = server.grpc_url if protocol == "grpc" else server.http_url
    env = {**os.environ, "PYTHONPATH": str(REPO / "client")}

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "voxcpm_client", "loras", *args, "--protocol", protocol,
                               "--url", url], capture_output=True, text=True, env=env, timeout=300)

    name = f"cli_{protocol}"
    shutil.copytree(os.path.join(lora_dir, ".spare", "lm_dit"), os.path.join(lora_dir, name))
    try:
        r = cli("add", name)
        assert r.returncode == 0 and r.stdout.split() == sorted([name, "everything", "lm_dit"]), r.stderr
        assert cli("list").stdout.split() == sorted([name, "everything", "lm_dit"])
        r = cli("remove", name)
        assert r.returncode == 0 and r.stdout.split() == ["everything", "lm_dit"], r.stderr
        r = cli("remove", name)
        assert r.returncode == 2 and r.stdout == "" and len(r.stderr.splitlines()) == 1, r.stderr
        assert r.stderr.startswith("error: ") and f"unknown LoRA adapter '{name}'" in r.stderr, r.stderr
        r = cli("add", "broken")
        assert r.returncode == 2 and "broken/lora_weights.safetensors: cannot read tensors" in r.stderr, r.stderr
    finally:
        shutil.rmtree(os.path.join(lora_dir, name))
    assert loras(server, "list") == ["everything", "lm_dit"]


def _close(a, b):
    return a.shape == b.shape and np.abs(a - b).max() <= TOL


def test_a_voice_with_a_default_adapter(server, lora_dir):
    """`voices` add with LORA: a request with the voice and no LORA uses that adapter; a request's own
    LORA wins, an empty one asking for the base model; an adapter removed since is an error naming
    voice and adapter."""
    audio = sine_wave(0.6, 16000, freq=200, seed=5)
    assert voices(server, "add", "narr", audio, 16000, lora="lm_dit") == ["narr"]
    voices(server, "add", "plain", audio, 16000)  # the same audio, no adapter
    with_lm_dit, _ = tts_http(server, TEXT, VOICE=_b("plain"), LORA=_b("lm_dit"), **GEN)
    base, _ = tts_http(server, TEXT, VOICE=_b("plain"), **GEN)
    assert np.abs(with_lm_dit - base).max() > 100 * TOL
    for lora, want in ((None, with_lm_dit), ("", base)):  # absent: the voice's adapter; empty: none
        extra = {} if lora is None else {"LORA": _b(lora)}
        got, _ = tts_http(server, TEXT, VOICE=_b("narr"), **extra, **GEN)
        assert _close(got, want), lora
        assert _close(np.concatenate(tts_stream(server, TEXT, VOICE=_b("narr"), **extra, **GEN)), want), lora
    got, _ = tts_http(server, TEXT, VOICE=_b("narr"), LORA=_b("everything"), **GEN)
    want, _ = tts_http(server, TEXT, VOICE=_b("plain"), LORA=_b("everything"), **GEN)
    assert _close(got, want)  # the request's own adapter wins

    # Registering checks the adapter now; a refused add stores nothing.
    for lora, message in (("nope", r"LORA: unknown LoRA adapter 'nope' \(loaded: everything, lm_dit\); a voice's "
                                   r"adapter must be loaded when the voice is added"),
                          ("../x", r"LORA: '\.\./x' is not a valid LoRA adapter name")):
        with pytest.raises(InferenceServerException, match=message) as e:
            voices(server, "add", "typo", audio, 16000, lora=lora)
        assert e.value.status() == "400"
    with pytest.raises(InferenceServerException, match=r"ACTION remove takes only NAME, got \['LORA', 'NAME'\]"):
        voices(server, "remove", "narr", lora="lm_dit")
    assert voices(server, "list") == ["narr", "plain"]

    # The voice's adapter removed later: requests that rely on it fail clearly, others still work.
    shutil.copytree(os.path.join(lora_dir, ".spare", "lm_dit"), os.path.join(lora_dir, "gone"))
    try:
        loras(server, "add", "gone")
        voices(server, "add", "orphan", audio, 16000, lora="gone")
        assert _close(tts_http(server, TEXT, VOICE=_b("orphan"), **GEN)[0], with_lm_dit)
    finally:
        loras(server, "remove", "gone")
        shutil.rmtree(os.path.join(lora_dir, "gone"))
    message = (r"VOICE 'orphan' has the default LoRA adapter 'gone', which cannot be used: unknown LoRA adapter "
               r"'gone' \(loaded: everything, lm_dit\)")
    for call in (tts_http, tts_stream):
        with pytest.raises(InferenceServerException, match=message) as e:
            call(server, TEXT, VOICE=_b("orphan"), **GEN)
        if call is tts_http:
            assert e.value.status() == "400"
    # The OpenAI gateway maps it onto its `voice` field (the client sent no lora).
    sys.path.insert(0, os.path.join(REPO, "gateway"))
    from voxcpm_gateway import errors as gateway_errors
    from voxcpm_gateway.speech_request import PARAMS

    err = gateway_errors.from_triton(e.value.message(), PARAMS)
    assert (err.status, err.param) == (400, "voice"), err
    assert _close(tts_http(server, TEXT, VOICE=_b("orphan"), LORA=_b("lm_dit"), **GEN)[0], with_lm_dit)
    for name in ("narr", "plain", "orphan"):
        voices(server, "remove", name)


@pytest.fixture(scope="module")
def all_targets(triton_server_factory, ckpt, lora_dir, tmp_path_factory):  # noqa: F811
    """A server with lora_targets=all, started with one adapter on the default targets only."""
    d = str(tmp_path_factory.mktemp("few_loras"))
    shutil.copytree(os.path.join(lora_dir, ".spare", "lm_dit"), os.path.join(d, "lm_dit"))
    # chunks by the schedule only, so that the gateway's samples compare with tts_stream's (as there)
    repo = edited_repository(tmp_path_factory.mktemp("all_targets") / "repo",
                              parameters={"decoder": {"lora_targets": "all", "playback_margin_ms": "0"}})
    return d, triton_server_factory(repo, env={"VOXCPM_CHECKPOINT": ckpt, "VOXCPM_LORA_DIR": d})


def test_lora_targets_all_takes_an_adapter_on_other_layers_while_serving(all_targets, ckpt, lora_dir, tmp_path):
    """With lora_targets=all, an adapter on the LMs' MLPs and the projections (layers no adapter
    present at start-up targets) is added while serving; over tts it equals the offline API loaded
    with it, and through the OpenAI gateway's `lora` field it is tts_stream's audio."""
    from tests.test_openai_gateway import KEY, MODEL, Gateway, openai, quantize16
    from voxcpm_triton import VoxCPM2

    d, srv = all_targets
    assert loras(srv, "list") == ["lm_dit"]
    shutil.copytree(os.path.join(lora_dir, ".spare", "lm_mlp_proj"), os.path.join(d, "mlp"))
    assert loras(srv, "add", "mlp") == ["lm_dit", "mlp"]
    whole, _ = tts_http(srv, TEXT, LORA=_b("mlp"), RETRY_BADCASE=("BOOL", np.array([False])), **GEN)
    offline = VoxCPM2.from_pretrained(ckpt, device="cpu", dtype="float32", lora_dir=d)
    want = offline.generate(TEXT, lora="mlp", retry_badcase=False, **OFFLINE_GEN)
    assert _close(whole, want)
    assert np.abs(whole - offline.generate(TEXT, **OFFLINE_GEN)).max() > 100 * TOL  # the adapter acts

    streamed = np.concatenate(tts_stream(srv, TEXT, LORA=_b("mlp"), **GEN))
    assert _close(streamed, whole)
    gw = Gateway(srv.grpc_url, tmp_path)
    try:
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key=KEY, max_retries=0, timeout=120)
        got = client.audio.speech.create(model=MODEL, input=TEXT, voice="default", response_format="pcm",
                                         extra_body={"seed": 7, "min_length": 3, "max_length": 3,
                                                     "inference_timesteps": 4, "lora": "mlp"})
        pcm = np.frombuffer(got.content, "<i2").astype(np.int32)
        assert pcm.shape == streamed.shape and np.abs(pcm - quantize16(streamed)).max() <= 4  # within 1e-4
    finally:
        gw.stop()
    assert loras(srv, "remove", "mlp") == ["lm_dit"]
