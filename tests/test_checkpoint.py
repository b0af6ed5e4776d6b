"""Checkpoints: the writer (determinism, CLI, audible random VAE, the embedded tiny
default) and the strict loader (file variants, bad tensors, files and configs)."""

import copy
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.conftest import CONFIGS, sine_wave, variant_config
from tests.reference import voxcpm2_module
from voxcpm_triton import VoxCPM2
from voxcpm_triton.formats.checkpoint import CheckpointError
from voxcpm_triton.testing.checkpoint_writer import TINY_CONFIG, ensure_tiny_checkpoint, write_checkpoint
from voxcpm_triton.model.config import VoxCPM2Config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILES = ("config.json", "model.safetensors", "audiovae.safetensors", "tokenizer.json", "tokenizer_config.json")


def load(path, dtype="float32"):
    return VoxCPM2.from_pretrained(str(path), device="cpu", dtype=dtype)


def read(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def same_files(a, b, names=FILES):
    return all(read(os.path.join(a, n)) == read(os.path.join(b, n)) for n in names)


@pytest.fixture
def ckpt(tmp_path, checkpoint_dirs):
    """A private copy of the real-shaped tiny checkpoint, to damage."""
    return str(shutil.copytree(checkpoint_dirs["real_shaped"], tmp_path / "ckpt"))


# --------------------------------------------------------------------------- writer


def test_same_seed_same_bytes(tmp_path):
    a, b, c = (write_checkpoint(str(tmp_path / n), TINY_CONFIG, seed=s, progress=None)
               for n, s in (("a", 3), ("b", 3), ("c", 4)))
    assert same_files(a, b)
    for n in ("model.safetensors", "audiovae.safetensors"):
        assert read(os.path.join(a, n)) != read(os.path.join(c, n))


def test_cli_writes_the_same_checkpoint(tmp_path):
    """The script: tiny default, and --config with --dtype; bytes as written in-process."""
    cfg_file = tmp_path / "variant.json"
    cfg_file.write_text(json.dumps(variant_config()))
    script = [sys.executable, os.path.join(REPO, "scripts", "make_tiny_checkpoint.py")]
    for extra, config, dtype, seed in (([], TINY_CONFIG, "float32", 0),
                                       (["--config", str(cfg_file), "--dtype", "bfloat16", "--seed", "5"],
                                        variant_config(), "bfloat16", 5)):
        out = str(tmp_path / f"cli-{seed}")
        r = subprocess.run(script + ["--out", out] + extra, cwd="/", capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert "done" in r.stdout
        want = write_checkpoint(str(tmp_path / f"lib-{seed}"), config, seed=seed, weights_dtype=dtype, progress=None)
        assert same_files(out, want)
    assert load_file(os.path.join(out, "model.safetensors"))["base_lm.norm.weight"].dtype == torch.bfloat16
    assert torch.isfinite(load(out).generate_latents("Hi.", seed=1, max_len=4)).all()
    # bad arguments: one line, exit 2, nothing half-written (an empty --out wrote over checkpoints/tiny)
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "latin1.json").write_bytes(b"\xff\xfe")
    for args, said in [(["--out", ""], "--out must name a directory"),
                       (["--out", str(tmp_path / "a_file")], "--out must name a directory"),
                       (["--out", str(tmp_path / "s"), "--seed", str(2**70)], "--seed must be from 0 to 2**63-1"),
                       (["--out", str(tmp_path / "c"), "--config", str(tmp_path / "latin1.json")], "--config: 'utf-8'")]:
        r = subprocess.run(script + args, cwd="/", capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and said in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
    assert not (tmp_path / "s").exists() and not (tmp_path / "c").exists()


@pytest.mark.parametrize("name", list(CONFIGS))
def test_random_vae_is_audible(checkpoint_dirs, name):
    """Random weights, but the waveform is audible and not clipped."""
    m = load(checkpoint_dirs[name])
    for seed in (1, 2):
        wav = m.generate("Hello there, this is a test.", seed=seed, max_len=30)
        peak = float(np.abs(wav).max())
        assert 0.05 <= peak <= 0.9, peak
        assert np.mean(np.abs(wav) > 0.99) < 0.01
        assert wav.std() > 0.005


def _ensure_worker(path, barrier, results):
    barrier.wait(timeout=120)  # both start writing at once
    results.put(ensure_tiny_checkpoint(path))


def test_ensure_tiny_checkpoint_concurrent(tmp_path):
    path = str(tmp_path / "ckpts" / "tiny")
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_ensure_worker, args=(path, barrier, results)) for _ in range(2)]
    for p in procs:
        p.start()
    got = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    assert got == [path, path]
    assert os.listdir(tmp_path / "ckpts") == ["tiny"]  # no temporary directories left
    assert ensure_tiny_checkpoint(path) == path  # present: nothing to do
    assert same_files(path, write_checkpoint(str(tmp_path / "ref"), TINY_CONFIG, seed=0, progress=None))
    load(path)


def test_ensure_tiny_checkpoint_refuses_a_foreign_directory(tmp_path):
    path = tmp_path / "tiny"
    path.mkdir()
    (path / "notes.txt").write_text("not a checkpoint")
    with pytest.raises(RuntimeError, match="no config.json"):
        ensure_tiny_checkpoint(str(path))
    assert sorted(os.listdir(tmp_path)) == ["tiny"]


def test_config_round_trips_through_ours_and_the_reference(checkpoint_dirs):
    ref = voxcpm2_module()
    full = os.path.join(REPO, "benchmarks", "voxcpm2_config.json")  # the VoxCPM2 config
    texts = [read(os.path.join(p, "config.json")).decode() for p in checkpoint_dirs.values()] + [read(full).decode()]
    as_json = lambda cfg: json.loads(json.dumps(cfg.to_dict()))  # noqa: E731 (tuples -> lists)
    for text in texts:
        ours = VoxCPM2Config.from_dict(json.loads(text))
        assert VoxCPM2Config.from_dict(ours.to_dict()) == ours
        theirs = ref.VoxCPMConfig.model_validate_json(text)
        assert as_json(VoxCPM2Config.from_dict(theirs.model_dump())) == as_json(ours)
        back = ours.to_dict()
        for sub in ("lm_config", "encoder_config", "dit_config"):  # the reference takes absent, not null
            if back[sub]["kv_channels"] is None:
                del back[sub]["kv_channels"]
        assert ref.VoxCPMConfig.model_validate(back) == theirs


# --------------------------------------------------------------------------- file variants


def _variant(src, dst, model_bin=False, vae_pth=False, wrap=False):
    """The same checkpoint with pytorch_model.bin / audiovae.pth (optionally {"state_dict": ...})."""
    shutil.copytree(src, dst)
    for on, st, pt in ((model_bin, "model.safetensors", "pytorch_model.bin"),
                       (vae_pth, "audiovae.safetensors", "audiovae.pth")):
        if on:
            sd = load_file(os.path.join(dst, st))
            os.remove(os.path.join(dst, st))
            torch.save({"state_dict": sd} if wrap else sd, os.path.join(dst, pt))
    return str(dst)


@torch.inference_mode()
def test_file_variants_give_identical_results(tmp_path, checkpoint_dirs):
    src = checkpoint_dirs["real_shaped"]
    wave = sine_wave(0.5, 16000)

    def run(path):
        m = load(path)
        lat = m.generate_latents("Hello there.", seed=3, max_len=8)
        return lat, m.decode(lat), m.encode_audio(wave, 16000, "right")

    want = run(src)
    variants = [_variant(src, tmp_path / "bin", model_bin=True), _variant(src, tmp_path / "pth", vae_pth=True),
                _variant(src, tmp_path / "wrapped", model_bin=True, vae_pth=True, wrap=True)]
    for path in variants:
        got = run(path)
        assert torch.equal(got[0], want[0]), path
        assert np.array_equal(got[1], want[1]), path
        assert torch.equal(got[2], want[2]), path


def test_reference_loads_every_tensor(tmp_path, checkpoint_dirs):
    """The reference loads non-strictly; check it really took every tensor of ours (and nothing else)."""
    ref_mod = voxcpm2_module()
    src = checkpoint_dirs["real_shaped"]
    want = load_file(os.path.join(src, "model.safetensors"))
    want.update({f"audio_vae.{k}": v for k, v in load_file(os.path.join(src, "audiovae.safetensors")).items()})
    for path in (src, _variant(src, tmp_path / "wrapped", model_bin=True, vae_pth=True, wrap=True)):
        got = ref_mod.VoxCPM2Model.from_local(path, optimize=False, device="cpu").state_dict()
        assert sorted(got) == sorted(want)
        bad = [k for k in want if not torch.equal(got[k].to(want[k].dtype), want[k])]
        assert not bad, bad[:5]


# --------------------------------------------------------------------------- what must fail


def _edit(path, fn):
    sd = load_file(path)
    fn(sd)
    save_file(sd, path)


def _set(name, value):
    return lambda sd: sd.__setitem__(name, value)


def _poison(name, value=float("nan")):
    def fn(sd):
        sd[name] = sd[name].clone()
        sd[name].view(-1)[3] = value
    return fn


TENSOR_CASES = {
    "model missing": ("model.safetensors", lambda sd: sd.pop("base_lm.norm.weight"),
                      ["missing", "base_lm.norm.weight"]),
    "model unexpected": ("model.safetensors", _set("base_lm.extra.weight", torch.zeros(3)),
                         ["unexpected", "base_lm.extra.weight"]),
    "model shape": ("model.safetensors", _set("fsq_layer.in_proj.weight", torch.zeros(31, 64)),
                    ["fsq_layer.in_proj.weight", "[31, 64]", "[32, 64]"]),
    "model dtype": ("model.safetensors", _set("stop_head.weight", torch.zeros(2, 64, dtype=torch.int32)),
                    ["stop_head.weight", "int32"]),
    "model nan": ("model.safetensors", _poison("base_lm.layers.1.mlp.down_proj.weight"),
                  ["base_lm.layers.1.mlp.down_proj.weight", "inf/nan"]),
    "model inf": ("model.safetensors", _poison("feat_encoder.special_token", float("inf")),
                  ["feat_encoder.special_token", "inf/nan"]),
    "vae missing": ("audiovae.safetensors", lambda sd: sd.pop("decoder.model.2.block.1.weight_g"),
                    ["missing", "decoder.model.2.block.1.weight_g"]),
    "vae unexpected": ("audiovae.safetensors", _set("decoder.extra.bias", torch.zeros(3)),
                       ["unexpected", "decoder.extra.bias"]),
    "vae shape": ("audiovae.safetensors", _set("encoder.fc_mu.weight_v", torch.zeros(16, 64, 2)),
                  ["encoder.fc_mu.weight_v", "(16, 64, 2)"]),
    "vae nan": ("audiovae.safetensors", _poison("decoder.model.3.block.0.alpha"),
                ["decoder.model.3.block.0.alpha", "inf/nan"]),
}


@pytest.mark.parametrize("case", list(TENSOR_CASES))
def test_bad_tensor_is_named(ckpt, case):
    file, fn, words = TENSOR_CASES[case]
    _edit(os.path.join(ckpt, file), fn)
    with pytest.raises(CheckpointError) as e:
        load(ckpt)
    for w in [file] + words:
        assert w in str(e.value)


def test_bad_tensor_in_pytorch_bin_is_named(tmp_path, checkpoint_dirs):
    path = _variant(checkpoint_dirs["real_shaped"], tmp_path / "bin", model_bin=True, vae_pth=True, wrap=True)
    sd = torch.load(os.path.join(path, "pytorch_model.bin"))
    del sd["state_dict"]["stop_proj.bias"]
    torch.save(sd, os.path.join(path, "pytorch_model.bin"))
    with pytest.raises(CheckpointError, match=r"pytorch_model\.bin: missing tensor\(s\): stop_proj\.bias"):
        load(path)


def test_overflow_in_the_cast_is_named(ckpt):
    _edit(os.path.join(ckpt, "model.safetensors"), _poison("lm_to_dit_proj.weight", 1e6))
    load(ckpt)  # fine in fp32
    with pytest.raises(CheckpointError, match=r"lm_to_dit_proj\.weight has inf/nan values \(as float16\)"):
        load(ckpt, dtype="float16")


@pytest.mark.parametrize("name", FILES)
def test_missing_file_is_named(ckpt, name):
    os.remove(os.path.join(ckpt, name))
    with pytest.raises(ValueError, match=name.replace(".", r"\.")):
        load(ckpt)


def test_missing_directory_is_named(tmp_path):
    with pytest.raises(CheckpointError, match="checkpoint directory not found"):
        load(tmp_path / "nowhere")


def _truncate(path):
    data = read(path)
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])


def _garbage(path):
    with open(path, "wb") as f:
        f.write(np.random.default_rng(0).bytes(4096))


@pytest.mark.parametrize("file,damage", [("model.safetensors", _truncate), ("model.safetensors", _garbage),
                                         ("audiovae.safetensors", _truncate), ("audiovae.safetensors", _garbage)])
def test_corrupt_weights_file_is_named(ckpt, file, damage):
    damage(os.path.join(ckpt, file))
    with pytest.raises(CheckpointError, match=rf"{file.replace('.', '[.]')}: cannot read tensors"):
        load(ckpt)


def test_corrupt_pickles_are_named(tmp_path, checkpoint_dirs):
    path = _variant(checkpoint_dirs["real_shaped"], tmp_path / "bin", model_bin=True, vae_pth=True)
    _garbage(os.path.join(path, "audiovae.pth"))
    with pytest.raises(CheckpointError, match=r"audiovae\.pth: cannot read tensors"):
        load(path)
    torch.save({"weights": [1, 2, 3]}, os.path.join(path, "pytorch_model.bin"))
    with pytest.raises(CheckpointError, match=r"pytorch_model\.bin: expected a mapping of tensor names to tensors"):
        load(path)


def _lm(**kv):
    return lambda c: c["lm_config"].update(kv)


def _drop(*keys):
    def fn(c):
        d = c
        for k in keys[:-1]:
            d = d[k]
        del d[keys[-1]]
    return fn


CONFIG_CASES = {
    "heads not a multiple of kv heads": (_lm(num_attention_heads=3), "num_attention_heads"),
    "negative patch_size": (lambda c: c.update(patch_size=-4), "patch_size"),
    "string for an int": (_lm(hidden_size="64"), "lm_config.hidden_size"),
    "float for an int": (lambda c: c.update(patch_size=4.0), "patch_size"),
    "bool for an int": (lambda c: c.update(max_length=True), "max_length"),
    "unknown top-level field": (lambda c: c.update(flux_capacitor=1), "flux_capacitor"),
    "unknown lm field": (_lm(num_expert=8), "num_expert"),
    "unknown vae field": (lambda c: c["audio_vae_config"].update(codebooks=4), "codebooks"),
    "feat_dim != vae latent_dim": (lambda c: c.update(feat_dim=32), "feat_dim"),
    "missing lm hidden_size": (_drop("lm_config", "hidden_size"), "lm_config.hidden_size"),
    "missing encoder_config": (_drop("encoder_config"), "encoder_config"),
    # a section that is no object: a TypeError from dict() before, or read as an empty one
    "null lm_config": (lambda c: c.update(lm_config=None), "lm_config: expected an object, got NoneType"),
    "list dit_config": (lambda c: c.update(dit_config=[]), "dit_config: expected an object, got list"),
    "missing rope_scaling field": (_drop("lm_config", "rope_scaling", "short_factor"), "short_factor"),
    "rope factors of wrong length": (lambda c: c["lm_config"]["rope_scaling"].update(long_factor=[1.0] * 7),
                                     "long_factor"),
    "bad dtype": (lambda c: c.update(dtype="int8"), "dtype"),
    "vocab too small": (_lm(vocab_size=100), "vocab_size"),
    "bad vae rates": (lambda c: c["audio_vae_config"].update(decoder_rates=[]), "decoder_rates"),
    "bad solver": (lambda c: c["dit_config"]["cfm_config"].update(solver="rk4"), "solver"),
    # Valid on its own, but not the checkpoint's shapes.
    "config disagrees with weights": (_lm(intermediate_size=96), "base_lm.layers.0.mlp"),
}


@pytest.mark.parametrize("case", list(CONFIG_CASES))
def test_bad_config_is_named(ckpt, case):
    fn, words = CONFIG_CASES[case]
    cfg = copy.deepcopy(TINY_CONFIG)
    fn(cfg)
    with open(os.path.join(ckpt, "config.json"), "w") as f:
        json.dump(cfg, f)
    with pytest.raises(ValueError) as e:
        load(ckpt)
    assert words in str(e.value)


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", "", '{"patch_size": ' + "9" * 5000 + "}"])
def test_unparsable_config_is_named(ckpt, text):
    with open(os.path.join(ckpt, "config.json"), "w") as f:
        f.write(text)
    with pytest.raises(ValueError, match="config"):
        load(ckpt)


def test_the_offline_api_refuses_bad_arguments_by_name(checkpoint_dirs):
    """What it took in silence or failed on deep inside (a review): flags that are not booleans, a lone
    surrogate (a TypeError from the tokenizer about a str), empty or non-finite latents and noise, a
    context that is not latents."""
    m = load(checkpoint_dirs["real_shaped"])
    P, D = m.patch_size, m.feat_dim
    lat = torch.zeros(3, P, D)
    for call, error, said in [
            (lambda: m.generate("Hi.", normalize="yes", max_len=2), TypeError, "normalize must be True or False"),
            (lambda: m.generate("Hi.", retry_badcase="no", max_len=2), TypeError, "retry_badcase must be True or False"),
            (lambda: m.generate_latents("Hi \ud800", max_len=2), ValueError, "text is not valid text: a lone surrogate"),
            (lambda: m.decode(torch.zeros(0, P, D)), ValueError, "latents must be [steps >= 1"),
            (lambda: m.decode(torch.full((2, P, D), float("nan"))), ValueError, "latents hold inf or NaN"),
            (lambda: m.decode(lat, context=np.zeros(3)), ValueError, "context must be finite [steps"),
            (lambda: m.generate_latents("Hi.", max_len=2, noise=torch.full((2, D, P), float("inf"))), ValueError,
             "noise holds inf or NaN")]:
        with pytest.raises(error) as info:
            call()
        assert said in str(info.value), (said, info.value)
    assert m.decode(lat, context=torch.zeros(1, P, D)).size > 0
