"""LoRA adapters through a real tritonserver (tiny checkpoint, CPU): LORA on tts and tts_stream
equals the offline API, a broken adapter is left out at start-up, unknown names are clear errors,
and the `loras` model adds, lists and removes adapters while the server runs."""

import os
import shutil

import numpy as np
import pytest

from tests.conftest import require_module

require_module("tritonclient", "tritonclient[all] in requirements.txt")
import tritonclient.http as httpclient  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from tests.lora_helpers import write_adapters  # noqa: E402
from tests.server import triton_server_factory  # noqa: E402,F401
from tests.test_server import tts_http, tts_stream  # noqa: E402
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
    write_adapters(ckpt, os.path.join(d, ".spare"), names=("lm_dit", "everything"), seed=1)
    for n in ("lm_dit", "everything"):
        shutil.copytree(os.path.join(d, ".spare", n), os.path.join(d, n))
    # A broken adapter: reported at start-up and left out; the server serves the others.
    os.makedirs(os.path.join(d, "broken"))
    with open(os.path.join(d, "broken", "lora_weights.safetensors"), "wb") as f:
        f.write(b"not a safetensors file")
    return d


@pytest.fixture(scope="module")
def server(triton_server_factory, ckpt, lora_dir):  # noqa: F811
    return triton_server_factory("model_repository", env={"VOXCPM_CHECKPOINT": ckpt, "VOXCPM_LORA_DIR": lora_dir})


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


def test_loras_model_adds_replaces_and_removes_while_serving(server, lora_dir):
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


@pytest.mark.parametrize("action, name, message", [
    ("remove", "nope", r"unknown LoRA adapter 'nope'"),
    ("add", "missing", r"LoRA adapter directory not found: .*missing"),
    ("add", "broken", r"broken/lora_weights\.safetensors: cannot read tensors"),
    ("add", "a/b", r"NAME: 'a/b' is not a valid LoRA adapter name"),
    ("add", None, r"ACTION add needs NAME"),
    ("list", "lm_dit", r"ACTION list takes no NAME"),
    ("load", "lm_dit", r"ACTION must be one of add, remove, list, got 'load'"),
])
def test_loras_model_errors_name_the_problem(server, action, name, message):
    with pytest.raises(InferenceServerException, match=message):
        loras(server, action, name)
    assert loras(server, "list") == ["everything", "lm_dit"]
