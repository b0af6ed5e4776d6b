"""A random LoRA adapter in the official format, shaped for a checkpoint: what the LoRA examples
need on the tiny default checkpoint, where no trained adapter exists (a real one comes from the
official trainer, in the same layout: see formats/lora.py)."""

from __future__ import annotations

import json
import os

import torch

from ..formats.checkpoint import meta_model
from ..formats.checkpoint_layout import checkpoint_files
from ..formats.lora import CONFIG_FILE, WEIGHT_FILES, LoraConfig, check_lora_name
from ..model.config import VoxCPM2Config
from ..model.lora import linear_shapes
from .checkpoint_writer import _generator


def write_random_adapter(checkpoint: str, out_dir: str, rank: int = 8, alpha: float = 16.0, seed: int = 0,
                         strength: float = 0.3) -> list[str]:
    """Write `out_dir`/lora_weights.safetensors and lora_config.json: an adapter on the official
    default targets (the LMs' and LocDiT's attention projections) of `checkpoint`'s shapes, with
    values that change the output clearly without blowing it up (A ~ 1/sqrt(in), B ~
    strength/sqrt(rank)); the same arguments write the same bytes. -> the modules it adapts."""
    from safetensors.torch import save_file

    check_lora_name(os.path.basename(os.path.normpath(out_dir)))
    if rank < 1:
        raise ValueError(f"rank must be at least 1, got {rank}")
    if not 0 < alpha < float("inf"):  # what the loader takes (NaN fails too)
        raise ValueError(f"alpha must be a positive number, got {alpha}")
    cfg = VoxCPM2Config.from_file(checkpoint_files(checkpoint)["config"])
    config = LoraConfig(enable_lm=True, enable_dit=True, r=rank, alpha=alpha)
    linears = linear_shapes(meta_model(cfg))
    modules = sorted(m for m in linears if config.targets(m))
    tensors = {}
    for module in modules:
        fan_in, fan_out = linears[module]
        a, b = f"{module}.lora_A", f"{module}.lora_B"
        tensors[a] = torch.randn(rank, fan_in, generator=_generator(seed, a)) * fan_in ** -0.5
        tensors[b] = torch.randn(fan_out, rank, generator=_generator(seed, b)) * (strength * rank ** -0.5)
    os.makedirs(out_dir, exist_ok=True)
    save_file(tensors, os.path.join(out_dir, WEIGHT_FILES[0]))
    with open(os.path.join(out_dir, CONFIG_FILE), "w", encoding="utf-8") as f:
        json.dump({"enable_lm": True, "enable_dit": True, "r": rank, "alpha": alpha}, f, indent=1)
    return modules
