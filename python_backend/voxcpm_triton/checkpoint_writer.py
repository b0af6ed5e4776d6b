"""Writes random VoxCPM2 checkpoints in the official format.

The tiny one is the project's embedded default (demo, server, tests); a
full-size one (from the real config) is what benchmarks run on, since speed
depends on shapes, not on values. Same seed, same bytes.
"""

from __future__ import annotations

import copy
import json
import math
import os
import time

import torch

from .audio_vae import AudioVAE, vae_state_dict_official
from .config import VoxCPM2Config
from .model import VoxCPM2Model
from .tokenizer_builder import write_tiny_tokenizer

DEFAULT_TINY_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "checkpoints", "tiny")


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


def _init_(name: str, p: torch.Tensor, g: torch.Generator):
    """Scaled so activations stay O(1) through the stack, whatever the width."""
    if name.endswith("norm.weight"):
        p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
    elif p.dim() >= 2 and "embed_tokens" not in name:
        p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))
    else:  # biases, embeddings, special token
        p.copy_((0.02 if name.endswith("bias") else 1.0) * torch.randn(p.shape, generator=g))


def random_model_state(cfg: VoxCPM2Config, seed: int, dtype: torch.dtype, progress=None) -> dict:
    with torch.device("meta"):
        model = VoxCPM2Model(cfg)
    names = [(n, p.shape) for n, p in model.named_parameters()]
    total = sum(math.prod(s) for _, s in names)
    g = torch.Generator().manual_seed(seed)
    out, done, last = {}, 0, time.time()
    for name, shape in names:
        t = torch.empty(shape, dtype=torch.float32)
        _init_(name, t, g)
        out[name] = t.to(dtype)
        done += t.numel()
        if progress and time.time() - last > 2:
            progress(f"  weights {100 * done / total:5.1f}% ({done / 1e6:.0f}M of {total / 1e6:.0f}M parameters)")
            last = time.time()
    return out


def random_vae_state(cfg: VoxCPM2Config, seed: int) -> dict:
    torch.manual_seed(seed + 1)
    vae = AudioVAE(cfg.audio_vae_config)
    g = torch.Generator().manual_seed(seed + 2)
    with torch.no_grad():
        for name, p in vae.named_parameters():
            if name.endswith("alpha"):  # snake: keep positive, around 1
                p.copy_(0.5 + torch.rand(p.shape, generator=g))
    return vae_state_dict_official(vae)


def write_checkpoint(out_dir: str, config: dict, seed: int = 0, weights_dtype: str | None = None,
                     progress=print) -> str:
    """Write config.json, model.safetensors, audiovae.safetensors, tokenizer.json(+config)."""
    from safetensors.torch import save_file

    cfg = VoxCPM2Config.from_dict(copy.deepcopy(config))
    dtype = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
             "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}[weights_dtype or cfg.dtype]
    os.makedirs(out_dir, exist_ok=True)
    t0 = time.time()
    progress and progress(f"writing random VoxCPM2 checkpoint to {out_dir} (seed {seed}, {dtype})")
    state = random_model_state(cfg, seed, dtype, progress)
    tmp = os.path.join(out_dir, "model.safetensors.tmp")
    save_file(state, tmp)
    os.replace(tmp, os.path.join(out_dir, "model.safetensors"))
    n_params = sum(t.numel() for t in state.values())
    del state
    save_file({k: v.contiguous() for k, v in random_vae_state(cfg, seed).items()},
              os.path.join(out_dir, "audiovae.safetensors"))
    write_tiny_tokenizer(out_dir, vocab_size=min(cfg.lm_config.vocab_size, 4096))
    # config.json last: its presence marks a complete checkpoint.
    with open(os.path.join(out_dir, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
    progress and progress(f"done: {n_params / 1e6:.1f}M parameters in {time.time() - t0:.1f}s")
    return out_dir


def ensure_tiny_checkpoint(path: str | None = None, progress=None) -> str:
    """The embedded default checkpoint, generated on first use."""
    path = path or DEFAULT_TINY_DIR
    if not os.path.isfile(os.path.join(path, "config.json")):
        # Several Triton models may start at once: write aside, then rename into place.
        tmp = f"{path}.tmp-{os.getpid()}"
        write_checkpoint(tmp, TINY_CONFIG, seed=0, progress=progress)
        try:
            os.rename(tmp, path)
        except OSError:  # another process won the race
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    return path
