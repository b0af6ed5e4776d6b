"""Parity with the official voxcpm 2.0.3 package, on checkpoints written here, in fp32."""

import contextlib
import os
import shutil

import numpy as np
import pytest
import soundfile as sf
import torch

from tests.conftest import CONFIGS, sine_wave
from tests.reference import voxcpm2_module
from voxcpm_triton import VoxCPM2
from voxcpm_triton.model.local_modules import CfmSchedule
from voxcpm_triton.model.minicpm import full_attention
from voxcpm_triton.model.noise import noise_for_steps

TOL = 1e-4


@pytest.fixture(scope="module", params=list(CONFIGS))
def pair(request, checkpoint_dirs):
    path = checkpoint_dirs[request.param]
    ours = VoxCPM2.from_pretrained(path, device="cpu", dtype="float32")
    ref = voxcpm2_module().VoxCPM2Model.from_local(path, optimize=False, device="cpu")
    ref.eval()
    return request.param, path, ours, ref


def maxdiff(a, b):
    return (torch.as_tensor(a).float() - torch.as_tensor(b).float()).abs().max().item()


def test_weight_names_and_shapes_match_reference(pair):
    _, _, ours, ref = pair
    ref_sd = {k: v.shape for k, v in ref.state_dict().items() if not k.startswith("audio_vae.")}
    our_sd = {k: v.shape for k, v in ours.model.state_dict().items()}
    assert our_sd == ref_sd


@torch.inference_mode()
def test_lm_hidden_states(pair):
    _, _, ours, ref = pair
    g = torch.Generator().manual_seed(0)
    h = ours.cfg.lm_config.hidden_size
    x = torch.randn(2, 11, h, generator=g)
    pos = torch.arange(11)[None]
    for name in ("base_lm", "residual_lm"):
        want, _ = getattr(ref, name)(inputs_embeds=x, is_causal=True)
        got = getattr(ours.model, name)(x, pos, full_attention(causal=True))
        assert maxdiff(got, want) <= TOL, name


@torch.inference_mode()
def test_local_encoder_and_dit_velocity(pair):
    _, _, ours, ref = pair
    P, D = ours.patch_size, ours.feat_dim
    g = torch.Generator().manual_seed(1)
    feats = torch.randn(2, 5, P, D, generator=g)
    assert maxdiff(ours.model.feat_encoder(feats), ref.feat_encoder(feats)) <= TOL

    hd = ours.cfg.dit_config.hidden_dim
    for N in (1, 6):
        x, cond = torch.randn(N, D, P, generator=g), torch.randn(N, D, P, generator=g)
        mu = torch.randn(N, 2 * hd, generator=g)
        t, dt = torch.rand(N, generator=g), torch.rand(N, generator=g)
        want = ref.feat_decoder.estimator(x, mu, t, cond, dt)
        got = ours.model.feat_decoder.estimator(x, mu, t, cond, dt)
        assert maxdiff(got, want) <= TOL, N


@torch.inference_mode()
@pytest.mark.parametrize("timesteps", [10, 3, 30])
def test_cfm_solver(pair, timesteps):
    _, _, ours, ref = pair
    P, D, hd = ours.patch_size, ours.feat_dim, ours.cfg.dit_config.hidden_dim
    g = torch.Generator().manual_seed(timesteps)
    B = 3
    z, cond, mu = torch.randn(B, D, P, generator=g), torch.randn(B, D, P, generator=g), torch.randn(B, 2 * hd, generator=g)
    with patched_randn([z]):
        want = ref.feat_decoder(mu=mu, patch_size=P, cond=cond, n_timesteps=timesteps, cfg_value=2.5)
    got = ours.model.feat_decoder.sample(z, mu, cond, CfmSchedule([timesteps] * B, torch.float32, "cpu"), 2.5)
    assert maxdiff(got, want) <= TOL


@torch.inference_mode()
def test_cfm_rows_with_different_step_counts_match_solo_runs(pair):
    _, _, ours, _ = pair
    P, D, hd = ours.patch_size, ours.feat_dim, ours.cfg.dit_config.hidden_dim
    g = torch.Generator().manual_seed(5)
    counts = [10, 4, 25]
    z, cond, mu = torch.randn(3, D, P, generator=g), torch.randn(3, D, P, generator=g), torch.randn(3, 2 * hd, generator=g)
    solver = ours.model.feat_decoder
    batched = solver.sample(z, mu, cond, CfmSchedule(counts, torch.float32, "cpu"), torch.tensor([2.0, 1.5, 3.0]))
    for i, (k, c) in enumerate(zip(counts, [2.0, 1.5, 3.0])):
        solo = solver.sample(z[i:i + 1], mu[i:i + 1], cond[i:i + 1], CfmSchedule([k], torch.float32, "cpu"), c)
        assert maxdiff(batched[i:i + 1], solo) <= 1e-5


@torch.inference_mode()
def test_vae_encode_decode(pair):
    _, _, ours, ref = pair
    wav = torch.from_numpy(sine_wave(0.5, ours.encode_sample_rate))[None]
    z_ref = ref.audio_vae.encode(wav, ours.encode_sample_rate)
    assert maxdiff(ours.vae.encode(wav), z_ref) <= TOL
    assert maxdiff(ours.vae.decode(z_ref), ref.audio_vae.decode(z_ref)) <= TOL


@contextlib.contextmanager
def patched_randn(samples):
    """Feed the reference's CFM start noise (its only torch.randn call at inference) from `samples`."""
    it = iter(samples)
    orig = torch.randn

    def fake(*shape, **kw):
        s = next(it)
        dims = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)) else shape
        assert tuple(s.shape) == tuple(dims), (s.shape, dims)
        return s.clone().to(kw.get("dtype") or s.dtype)

    torch.randn = fake
    try:
        yield
    finally:
        torch.randn = orig


def write_wav(path, wav, rate):
    sf.write(path, wav, rate, subtype="FLOAT")
    return str(path)


MODES = ["zero_shot", "voice_design", "reference", "continuation", "combined"]


def _mode_inputs(mode, ours, tmp_path):
    rate = ours.encode_sample_rate
    ref_wav, prm_wav = sine_wave(0.7, rate, 180.0, 1), sine_wave(0.45, rate, 300.0, 2)
    text = "Hello world, this is a test." if mode != "voice_design" else "(a calm low voice)Hello world."
    kw, cache = {}, None
    ref_path, prm_path = write_wav(tmp_path / "ref.wav", ref_wav, rate), write_wav(tmp_path / "prm.wav", prm_wav, rate)
    if mode in ("reference", "combined"):
        kw.update(reference_audio=ref_wav, reference_sample_rate=rate)
    if mode in ("continuation", "combined"):
        kw.update(prompt_audio=prm_wav, prompt_sample_rate=rate, prompt_text="Earlier words.")
    if mode != "zero_shot" and mode != "voice_design":
        cache = dict(prompt_text=kw.get("prompt_text"), prompt_wav_path=prm_path if "prompt_audio" in kw else None,
                     reference_wav_path=ref_path if "reference_audio" in kw else None)
    return text, kw, cache


def _run_reference(ref, text, cache_args, noise, **gen):
    cache = ref.build_prompt_cache(**cache_args) if cache_args else None
    with patched_randn([noise[i:i + 1] for i in range(noise.size(0))]):
        wav, _, feats = ref.generate_with_prompt_cache(target_text=text, prompt_cache=cache, retry_badcase=False, **gen)
    return feats, wav[0].numpy()


@torch.inference_mode()
@pytest.mark.parametrize("mode", MODES)
def test_generate_latents_fixed_length(pair, mode, tmp_path):
    _, _, ours, ref = pair
    text, kw, cache = _mode_inputs(mode, ours, tmp_path)
    steps = 24
    noise = noise_for_steps(11, steps, (ours.feat_dim, ours.patch_size))
    want, want_wav = _run_reference(ref, text, cache, noise, min_len=steps, max_len=steps, cfg_value=2.0,
                                    inference_timesteps=10)
    got = ours.generate_latents(text, min_len=steps, max_len=steps, cfg_value=2.0, inference_timesteps=10,
                                noise=noise, **kw)
    assert got.shape == want.shape == (steps, ours.patch_size, ours.feat_dim)
    assert maxdiff(got, want) <= TOL
    # The whole utterance, with the continuation prompt's context priming the VAE.
    prompt = ours.prepare_prompt(text, **kw)
    wav = ours.decode(got, context=prompt.context)
    assert wav.shape == want_wav.shape
    assert np.abs(wav - want_wav).max() <= TOL


# The step (0-based) at which the stop head fires in each mode's free-stop run.
STOP_STEP = {"zero_shot": 9, "reference": 11, "continuation": 13, "combined": 15}
FREE_MIN_LEN = 2


def _stop_at(ckpt, out_dir, states, k):
    """A copy of checkpoint `ckpt` whose stop head fires on the LM state states[k], and on no earlier one.

    With random weights the stop head fires at the first allowed step, which checks almost
    nothing. Here w is the part of states[k] orthogonal to states[0..k-1] (the new direction
    the LM state took at step k): h.w is 0 for the earlier states and |w|^2 for states[k].
    stop_proj's row 0 computes h.w/|w| - |w|/2, stop_head turns silu of it into the "stop"
    logit and leaves "go on" at 0, so the head says stop iff h.w/|w| > |w|/2: a margin of
    |w|/2 on either side (0.2 to 2.5 here), far beyond the 1e-4 the two implementations differ by."""
    from safetensors.torch import load_file, save_file

    H = torch.stack(states).double()
    q, _ = torch.linalg.qr(H[:k].T)
    w = H[k] - q @ (q.T @ H[k])
    norm = w.norm().item()
    assert norm / 2 > 100 * TOL, f"step {k}'s LM state is (nearly) in the span of the earlier ones: |w| = {norm}"
    shutil.copytree(ckpt, out_dir)
    sd = load_file(os.path.join(ckpt, "model.safetensors"))
    proj_w, proj_b, head_w = (torch.zeros_like(sd[n]) for n in ("stop_proj.weight", "stop_proj.bias", "stop_head.weight"))
    proj_w[0] = (w / norm).float()
    proj_b[0] = -norm / 2
    head_w[1, 0] = 1.0
    sd.update({"stop_proj.weight": proj_w, "stop_proj.bias": proj_b, "stop_head.weight": head_w})
    save_file(sd, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    return out_dir


@torch.inference_mode()
@pytest.mark.parametrize("mode", list(STOP_STEP))
def test_generate_latents_free_stop(pair, mode, tmp_path):
    """The stop head decides the length, at a step well past min_len, the same way in both."""
    _, path, ours, ref = pair
    text, kw, cache = _mode_inputs(mode, ours, tmp_path)
    noise = noise_for_steps(3, 400, (ours.feat_dim, ours.patch_size))
    gen = dict(cfg_value=1.5, inference_timesteps=6)
    k = STOP_STEP[mode]
    # The LM states the stop head sees at steps 0..k, from a fixed-length reference run.
    states = []
    hook = ref.stop_proj.register_forward_pre_hook(lambda _m, args: states.append(args[0][0].clone()))
    try:
        _run_reference(ref, text, cache, noise, min_len=k + 1, max_len=k + 1, **gen)
    finally:
        hook.remove()
    assert len(states) == k + 1
    stop_dir = _stop_at(path, str(tmp_path / "ckpt_stop"), states, k)
    ours = VoxCPM2.from_pretrained(stop_dir, device="cpu", dtype="float32")
    ref = voxcpm2_module().VoxCPM2Model.from_local(stop_dir, optimize=False, device="cpu")
    ref.eval()

    max_len = k + 20
    want, _ = _run_reference(ref, text, cache, noise, min_len=FREE_MIN_LEN, max_len=max_len, **gen)
    got = ours.generate_latents(text, noise=noise, min_len=FREE_MIN_LEN, max_len=max_len, **gen, **kw)
    # The patch of the step whose state says stop is kept: k + 1 patches.
    assert want.shape[0] == k + 1, "the reference did not stop where the stop head was built to"
    assert k + 1 >= FREE_MIN_LEN + 6
    assert got.shape == want.shape
    assert maxdiff(got, want) <= TOL

    # min_len = k: a stop at step k is not allowed (only i > min_len is); both go on alike.
    want, _ = _run_reference(ref, text, cache, noise, min_len=k, max_len=max_len, **gen)
    got = ours.generate_latents(text, noise=noise, min_len=k, max_len=max_len, **gen, **kw)
    assert want.shape[0] > k + 1
    assert got.shape == want.shape
    assert maxdiff(got, want) <= TOL
