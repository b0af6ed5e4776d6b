"""The reference's retry_badcase: offline, against voxcpm 2.0.3, and through a served `tts`."""

import os
import shutil

import numpy as np
import pytest
import torch

from tests.conftest import TINY_CONFIG, write_checkpoint
from tests.reference import voxcpm2_module
from tests.test_model_parity import patched_randn
from tests.server import triton_server_factory  # noqa: F401
from voxcpm_triton import VoxCPM2, checks
from voxcpm_triton.model.noise import noise_for_steps
from voxcpm_triton.serving import contract
from voxcpm_triton.serving.triton_io import InputError

TOL = 1e-4
TEXT = "Hello there."


def never_stopping(src: str, dst: str) -> str:
    """A copy of checkpoint `src` whose stop head always says "go on": stop_proj's row 0 is the
    constant 1 (bias only), and stop_head turns silu(1) into the "go on" logit, "stop" staying 0."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    sd = load_file(os.path.join(src, "model.safetensors"))
    proj_w, proj_b, head_w = (torch.zeros_like(sd[n]) for n in ("stop_proj.weight", "stop_proj.bias", "stop_head.weight"))
    proj_b[0] = 1.0
    head_w[0, 0] = 1.0
    sd.update({"stop_proj.weight": proj_w, "stop_proj.bias": proj_b, "stop_head.weight": head_w})
    save_file(sd, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    return dst


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    base = write_checkpoint(str(tmp_path_factory.mktemp("retry_ckpt")), TINY_CONFIG, seed=3, progress=None)
    return {"stops": base, "never": never_stopping(base, str(tmp_path_factory.mktemp("never") / "ckpt"))}


@pytest.fixture(scope="module")
def models(ckpts):
    return {k: VoxCPM2.from_pretrained(p, device="cpu", dtype="float32") for k, p in ckpts.items()}


def count_tries(monkeypatch, vox) -> list:
    """The lengths of each try generate_latents makes, from here on."""
    lengths = []
    once = vox._generate_once

    def counted(*a, **kw):
        out = once(*a, **kw)
        lengths.append(out.shape[0])
        return out

    monkeypatch.setattr(vox, "_generate_once", counted)
    return lengths


def test_rule_and_seed_derivation():
    assert checks.is_badcase(18, 3) and not checks.is_badcase(17, 3)
    assert checks.can_retry(2, 3) and not checks.can_retry(16, 3)
    assert [checks.retry_seed(7, a) for a in range(3)] == [7, 8, 9]
    assert checks.retry_seed(2**63 - 1, 1) == -(2**63)  # wraps within int64


def test_contract_reads_retry_badcase():
    text = {"TEXT": np.array([b"Hi."], dtype=object)}
    assert contract.parse(dict(text)).retry_badcase is True
    assert contract.parse({**text, "RETRY_BADCASE": np.array([False])}).retry_badcase is False
    with pytest.raises(InputError, match="RETRY_BADCASE must be BOOL"):
        contract.parse({**text, "RETRY_BADCASE": np.array([0], np.int32)})


@torch.inference_mode()
def test_never_stopping_is_retried_with_derived_seeds(models, monkeypatch):
    vox = models["never"]
    n_tok = vox.prepare_prompt(TEXT).n_target_tokens
    full = checks.default_max_len(n_tok)
    tries = count_tries(monkeypatch, vox)
    got = vox.generate_latents(TEXT, seed=5, retry_badcase=True, inference_timesteps=4)
    assert tries == [full] * checks.RETRY_MAX_TIMES
    # The kept result is the last try's: seed 5 + 2.
    tries.clear()
    want = vox.generate_latents(TEXT, seed=checks.retry_seed(5, 2), inference_timesteps=4)
    assert tries == [full]
    assert torch.equal(got, want)
    # generate retries by default (as VoxCPM.generate); generate_latents does not (as VoxCPM2Model).
    tries.clear()
    vox.generate(TEXT, seed=5, inference_timesteps=4)
    assert len(tries) == checks.RETRY_MAX_TIMES
    tries.clear()
    vox.generate(TEXT, seed=5, inference_timesteps=4, retry_badcase=False)
    assert len(tries) == 1
    # A MIN_LENGTH that forces a bad-case length on every try is not retried.
    tries.clear()
    vox.generate_latents(TEXT, seed=5, retry_badcase=True, min_len=full - 2, inference_timesteps=4)
    assert len(tries) == 1


@torch.inference_mode()
def test_early_stop_is_not_retried(models, monkeypatch):
    vox = models["stops"]
    tries = count_tries(monkeypatch, vox)
    vox.generate_latents(TEXT, seed=5, retry_badcase=True, inference_timesteps=4)
    assert len(tries) == 1 and not checks.is_badcase(tries[0], vox.prepare_prompt(TEXT).n_target_tokens)


@torch.inference_mode()
def test_matches_reference_retries(models, ckpts):
    """Same tries, lengths and kept result as the reference's generate with retry_badcase, when
    its fresh noise per try is ours for seeds 5, 6, 7."""
    vox = models["never"]
    ref = voxcpm2_module().VoxCPM2Model.from_local(ckpts["never"], optimize=False, device="cpu")
    ref.eval()
    full = checks.default_max_len(vox.prepare_prompt(TEXT).n_target_tokens)
    shape = (vox.feat_dim, vox.patch_size)
    samples = [n[None] for a in range(checks.RETRY_MAX_TIMES)
               for n in noise_for_steps(checks.retry_seed(5, a), full, shape)]
    used = []
    with patched_randn(s for s in samples if not used.append(1)):
        _, _, feats = ref.generate_with_prompt_cache(target_text=TEXT, prompt_cache=None, retry_badcase=True,
                                                     max_len=4096, inference_timesteps=4, cfg_value=2.0)
    assert len(used) == checks.RETRY_MAX_TIMES * full  # three tries of `full` steps each
    got = vox.generate_latents(TEXT, seed=5, retry_badcase=True, inference_timesteps=4, cfg_value=2.0)
    assert got.shape == feats.shape == (full, vox.patch_size, vox.feat_dim)
    assert (got - feats).abs().max().item() <= TOL


# ---------------------------------------------------------------------------------- served
@pytest.fixture(scope="module")
def served(triton_server_factory, ckpts):  # noqa: F811
    return triton_server_factory("model_repository", env={"VOXCPM_CHECKPOINT": ckpts["never"]})


def test_served_tts_retries_and_counts(served, models):
    from tests.test_server import HOP, metrics, tts_http, tts_stream

    full = checks.default_max_len(models["never"].prepare_prompt(TEXT).n_target_tokens)
    no_retry = ("BOOL", np.array([False]))
    m0 = metrics(served)
    audio, _ = tts_http(served, TEXT, SEED=5, INFERENCE_TIMESTEPS=4)
    m1 = metrics(served)
    assert m1["voxcpm_badcases_total"] - m0.get("voxcpm_badcases_total", 0) == 3
    assert m1["voxcpm_retries_total"] - m0.get("voxcpm_retries_total", 0) == 2
    assert audio.size == full * HOP
    # The kept audio is the last try's, seed 5 + 2; RETRY_BADCASE false makes one try only.
    last, _ = tts_http(served, TEXT, SEED=7, INFERENCE_TIMESTEPS=4, RETRY_BADCASE=no_retry)
    m2 = metrics(served)
    assert m2["voxcpm_retries_total"] == m1["voxcpm_retries_total"]
    assert m2["voxcpm_badcases_total"] - m1["voxcpm_badcases_total"] == 1
    assert np.abs(audio - last).max() <= TOL
    # NORMALIZE: the retries read the words text_normalizer made once, not three calls of it.
    from tests.test_server import metric_samples

    def normalizer_calls():
        return sum(v for name, labels, v in metric_samples(served)
                   if name == "nv_inference_request_success" and labels.get("model") == "text_normalizer")

    n0 = normalizer_calls()
    tts_http(served, TEXT, SEED=5, INFERENCE_TIMESTEPS=4, NORMALIZE=("BOOL", np.array([True])))
    m3 = metrics(served)
    assert m3["voxcpm_retries_total"] - m2["voxcpm_retries_total"] == 2
    assert normalizer_calls() - n0 == 1
    # tts_stream cannot take audio back: it does not declare the input, and Triton names it.
    with pytest.raises(Exception, match="RETRY_BADCASE"):
        tts_stream(served, TEXT, SEED=5, MAX_LENGTH=2, RETRY_BADCASE=no_retry)


def test_served_tts_retries_keep_the_voice_they_started_with(served):
    """A request's tries share one preparation: its stored voice removed while it retries does not fail
    it, and its text is tokenized once (each try used to look the voice up and tokenize again)."""
    import sys
    import threading
    import time

    from tests.conftest import sine_wave
    from tests.server import REPO
    from tests.test_server import metric_samples, metrics, tts_http

    sys.path.insert(0, str(REPO / "client"))
    import voxcpm_client

    def successes(model):
        return sum(v for name, labels, v in metric_samples(served)
                   if name == "nv_inference_request_success" and labels.get("model") == model)

    voice = ("BYTES", np.array([b"leaving"], dtype=object))
    voxcpm_client.add_voice("leaving", sine_wave(0.5, 16000), 16000, url=served.http_url)
    whole, _ = tts_http(served, TEXT, SEED=5, INFERENCE_TIMESTEPS=4, VOICE=voice)  # the voice there throughout
    tokenized, retries = successes("tokenizer"), metrics(served)["voxcpm_retries_total"]
    out = {}
    t = threading.Thread(target=lambda: out.update(r=tts_http(served, TEXT, SEED=5, INFERENCE_TIMESTEPS=4,
                                                              VOICE=voice)))
    t.start()
    deadline = time.monotonic() + 120
    while metrics(served)["voxcpm_retries_total"] == retries:  # its second try has begun
        assert t.is_alive() and time.monotonic() < deadline
        time.sleep(0.02)
    voxcpm_client.remove_voice("leaving", url=served.http_url)
    t.join(300)
    assert "r" in out, "the request failed once its voice was removed"
    assert metrics(served)["voxcpm_retries_total"] - retries == 2
    assert np.abs(out["r"][0] - whole).max() <= TOL
    assert successes("tokenizer") - tokenized == 1
