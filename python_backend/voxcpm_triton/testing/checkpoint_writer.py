"""Writes random VoxCPM2 checkpoints in the official format.

The tiny one is the project's embedded default (demo, server, tests); a
full-size one (from the real config) is what benchmarks run on, since speed
depends on shapes, not on values. Same seed (and device), same bytes.

Each tensor is drawn from its own generator, seeded from (seed, name), directly
in the target dtype, and streamed into the safetensors file as it is made, so
a 2B-parameter checkpoint never sits in memory whole.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import shutil
import struct
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from ..model.audio_vae import AudioVAE, CausalConv1d, CausalConvTranspose1d, ResidualUnit, vae_state_dict_official
from ..formats.checkpoint import meta_model
from ..model.config import DTYPES, VoxCPM2Config
from ..paths import DEFAULT_TINY_DIR
from .tokenizer_builder import write_tiny_tokenizer


def _rope(head_dim: int, n_pos: int) -> dict:
    return {"type": "longrope", "long_factor": [1.0] * (head_dim // 2), "short_factor": [1.0] * (head_dim // 2),
            "original_max_position_embeddings": n_pos}


# Shaped like VoxCPM2 (GQA, mup off, residual LM without RoPE, patch 4, 25 Hz latents
# at 16 kHz in, 48 kHz out) with small widths, so everything runs on a CPU in seconds.
TINY_CONFIG = {
    "architecture": "voxcpm2",
    "lm_config": {
        "bos_token_id": 1, "eos_token_id": 2, "hidden_size": 64, "intermediate_size": 128,
        "max_position_embeddings": 4096, "num_attention_heads": 4, "num_hidden_layers": 2,
        "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "rope_theta": 10000, "kv_channels": 16,
        "rope_scaling": _rope(16, 4096), "vocab_size": 4096, "use_mup": False, "scale_emb": 12,
        "dim_model_base": 256, "scale_depth": 1.4,
    },
    "patch_size": 4, "feat_dim": 16, "scalar_quantization_latent_dim": 32, "scalar_quantization_scale": 9,
    "residual_lm_num_layers": 2, "residual_lm_no_rope": True,
    "encoder_config": {"hidden_dim": 32, "ffn_dim": 64, "num_heads": 4, "num_layers": 2, "kv_channels": 16},
    "dit_config": {"hidden_dim": 32, "ffn_dim": 64, "num_heads": 4, "num_layers": 2, "kv_channels": 16,
                   "dit_mean_mode": False,
                   "cfm_config": {"sigma_min": 1e-6, "solver": "euler", "t_scheduler": "log-norm",
                                  "inference_cfg_rate": 2.0}},
    "audio_vae_config": {"encoder_dim": 4, "encoder_rates": [2, 5, 8, 8], "latent_dim": 16, "decoder_dim": 64,
                         "decoder_rates": [8, 6, 5, 2, 2, 2], "sr_bin_boundaries": [20000, 30000, 40000],
                         "sample_rate": 16000, "out_sample_rate": 48000},
    "max_length": 4096,
    "dtype": "float32",
}


_ST_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.int32: "I32",
              torch.int64: "I64"}


def _generator(seed: int, name: str, device="cpu") -> torch.Generator:
    """A generator per tensor: its values depend on (seed, name), not on the order of generation."""
    h = hashlib.sha256(f"{seed}/{name}".encode()).digest()
    return torch.Generator(device).manual_seed(int.from_bytes(h[:8], "little") >> 1)


def random_weight(name: str, shape, dtype: torch.dtype, seed: int, device="cpu") -> torch.Tensor:
    """One LM-side weight, scaled so activations stay O(1) through the stack, whatever the width."""
    g = _generator(seed, name, device)
    t = torch.empty(shape, dtype=dtype, device=device)
    if name.endswith("norm.weight"):
        return t.normal_(1.0, 0.1, generator=g)
    if len(shape) >= 2 and "embed_tokens" not in name:
        return t.normal_(0.0, shape[-1] ** -0.5, generator=g)
    return t.normal_(0.0, 0.02 if name.endswith("bias") else 1.0, generator=g)  # biases, embeddings, special token


def random_vae_state(cfg: VoxCPM2Config, seed: int) -> dict:
    """AudioVAE weights in the official layout (weight_g/weight_v), fp32.

    Convolutions get fan-in scaled weights so activations keep O(1) variance;
    residual branches are damped (the decoder chains 18 of them) and the last
    convolution before the tanh is scaled down, so typical latents (unit
    variance) decode to a waveform peaking around 0.3-0.8, not a saturated one.
    """
    with torch.random.fork_rng(devices=[]):  # the module's own init is overwritten below
        vae = AudioVAE(cfg.audio_vae_config)
    g = torch.Generator().manual_seed(seed + 1)
    done = set()
    with torch.no_grad():
        for m in vae.modules():
            if isinstance(m, (CausalConv1d, CausalConvTranspose1d)):
                w = m.weight  # [out, in/groups, k]; transposed: [in, out, 2*stride], 2*in taps per output
                fan_in = w[0].numel() if isinstance(m, CausalConv1d) else w.shape[0] * w.shape[2] // m.stride
                w.normal_(0.0, fan_in ** -0.5, generator=g)
                done.add(id(w))
                if m.bias is not None:
                    m.bias.normal_(0.0, 0.02, generator=g)
                    done.add(id(m.bias))
        for m in vae.modules():
            if isinstance(m, ResidualUnit):
                m.block[-1].weight.mul_(0.2)
        last = vae.decoder.model[-2]
        last.weight.mul_(0.06)
        last.bias.zero_()
        for name, p in vae.named_parameters():
            if name.endswith("alpha"):  # snake: positive, around 1
                p.uniform_(0.5, 1.5, generator=g)
            elif name.endswith("scale_embed.weight"):
                p.normal_(1.0, 0.05, generator=g)
            elif id(p) not in done:  # the other sample-rate condition embeddings
                p.normal_(0.0, 0.02, generator=g)
    return vae_state_dict_official(vae)


def _say(progress, t0, msg):
    if progress:
        progress(f"[{time.time() - t0:7.1f}s] {msg}")


def write_safetensors(path: str, entries: list, progress=None, t0: float | None = None):
    """Write a safetensors file from entries (name, shape, dtype, make); make() returns the tensor.

    The header is written first, from the declared shapes, then each tensor as it
    is made, while the next one is being made: at most two are held at a time.
    The file appears under its name only once complete."""
    t0 = time.time() if t0 is None else t0
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape, dtype, _ in entries:
        n = math.prod(shape) * dtype.itemsize
        header[name] = {"dtype": _ST_DTYPES[dtype], "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # data starts 8-byte aligned, as safetensors writes it
    tmp, done, last = f"{path}.tmp", 0, time.time()
    with open(tmp, "wb") as f, ThreadPoolExecutor(1) as writer:
        f.write(struct.pack("<Q", len(head)) + head)
        pending = None
        for name, shape, dtype, make in entries:
            t = make()
            if t.dtype != dtype or tuple(t.shape) != tuple(shape):
                raise AssertionError(f"{name}: made {t.dtype} {list(t.shape)}, declared {dtype} {list(shape)}")
            data = t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy()
            del t
            if pending is not None:
                pending.result()
            pending = writer.submit(f.write, data)
            done += data.nbytes
            if progress and time.time() - last > 2:
                _say(progress, t0, f"{os.path.basename(path)} {100 * done / offset:5.1f}% "
                                   f"({done / 1e9:.2f} of {offset / 1e9:.2f} GB)")
                last = time.time()
        if pending is not None:
            pending.result()
    os.replace(tmp, path)


def write_checkpoint(out_dir: str, config: dict, seed: int = 0, weights_dtype: str | None = None,
                     device: str = "cpu", progress=print) -> str:
    """Write config.json, model.safetensors, audiovae.safetensors, tokenizer.json(+config).

    weights_dtype: of the LM weights (default: the config's dtype); the AudioVAE is fp32.
    device: where the LM weights are drawn ("cuda" is faster; CPU and CUDA values differ)."""
    cfg = VoxCPM2Config.from_dict(copy.deepcopy(config))
    dtype = getattr(torch, DTYPES[weights_dtype or cfg.dtype])
    os.makedirs(out_dir, exist_ok=True)
    marker = os.path.join(out_dir, "config.json")
    if os.path.exists(marker):  # an older checkpoint here is about to stop being whole
        os.remove(marker)
    t0 = time.time()
    dtype_name = str(dtype).removeprefix("torch.")
    _say(progress, t0, f"writing a random VoxCPM2 checkpoint to {out_dir} (seed {seed}, {dtype_name}, on {device})")
    shapes = [(n, tuple(p.shape)) for n, p in meta_model(cfg).named_parameters()]
    write_safetensors(os.path.join(out_dir, "model.safetensors"),
                      [(n, s, dtype, lambda n=n, s=s: random_weight(n, s, dtype, seed, device)) for n, s in shapes],
                      progress, t0)
    _say(progress, t0, f"model.safetensors: {sum(math.prod(s) for _, s in shapes) / 1e6:.1f}M parameters")
    vae = random_vae_state(cfg, seed)
    write_safetensors(os.path.join(out_dir, "audiovae.safetensors"),
                      [(k, tuple(v.shape), v.dtype, lambda v=v: v) for k, v in vae.items()], progress, t0)
    del vae
    write_tiny_tokenizer(out_dir, vocab_size=min(cfg.lm_config.vocab_size, 4096))
    # config.json last: its presence marks a complete checkpoint.
    with open(marker + ".tmp", "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
    os.replace(marker + ".tmp", marker)
    _say(progress, t0, f"done: {out_dir}")
    return out_dir


def ensure_tiny_checkpoint(path: str | None = None, progress=None) -> str:
    """The embedded default checkpoint, generated on first use.

    Several processes (Triton model instances) may start at once: each writes
    into its own directory beside `path` and renames it into place; the first
    rename wins and the others discard their copy."""
    path = os.path.abspath(path or DEFAULT_TINY_DIR)
    if not os.path.isfile(os.path.join(path, "config.json")):
        parent = os.path.dirname(path)
        try:
            os.makedirs(parent, exist_ok=True)
            tmp = tempfile.mkdtemp(prefix=os.path.basename(path) + ".tmp-", dir=parent)
        except OSError as e:  # e.g. a read-only mount
            raise RuntimeError(f"no checkpoint at {path}, and cannot write one there ({e}); "
                               "run scripts/make_tiny_checkpoint.py where it is writable") from None
        try:
            os.chmod(tmp, 0o755)  # mkdtemp makes it 0700; the server may run as another user
            write_checkpoint(tmp, TINY_CONFIG, seed=0, progress=progress)
            try:
                os.rename(tmp, path)  # atomic; fails if another process got there first
            except OSError:
                pass
        finally:
            shutil.rmtree(tmp, ignore_errors=True)  # gone already after a successful rename
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise RuntimeError(f"{path} exists but holds no checkpoint (no config.json); remove it and retry")
    return path
