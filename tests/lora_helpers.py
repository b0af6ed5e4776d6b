"""LoRA adapters written by the official voxcpm 2.0.3 itself, for the LoRA tests.

The reference builds a `VoxCPM2Model` with a `LoRAConfig` (its `LoRALinear`s in every targeted
module), its LoRA parameters get random values here, and they are saved the way the official
trainer saves them: the `lora_` entries of the model's state_dict, to `lora_weights.safetensors`
(or `{"state_dict": ...}` to `lora_weights.ckpt`), with the config as `lora_config.json`.
"""

from __future__ import annotations

import json
import math
import os

import torch

from tests.reference import voxcpm2_module

ALL_LM = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ALL_DIT = ALL_LM + ["in_proj", "cond_proj", "out_proj", "linear_1", "linear_2"]
ALL_PROJ = ["enc_to_lm_proj", "lm_to_dit_proj", "res_to_dit_proj", "fusion_concat_proj", "stop_proj", "stop_head"]

# name -> (LoRAConfig fields, file format, whether lora_config.json is written)
ADAPTERS = {
    # The official defaults (LM and LocDiT attention), saved as the trainer does, with no JSON:
    # what the official VoxCPM(lora_weights_path=...) assumes then is what it was trained with.
    "lm_dit": (dict(enable_lm=True, enable_dit=True, r=8, alpha=16), "safetensors", False),
    # Every target the reference supports, another rank and alpha, the .ckpt format.
    "everything": (dict(enable_lm=True, enable_dit=True, enable_proj=True, r=4, alpha=6,
                        target_modules_lm=ALL_LM, target_modules_dit=ALL_DIT, target_proj_modules=ALL_PROJ),
                   "ckpt", True),
    # The LMs' MLPs and the default projections only.
    "lm_mlp_proj": (dict(enable_lm=True, enable_proj=True, r=16, alpha=8,
                         target_modules_lm=["gate_proj", "up_proj", "down_proj", "v_proj"]), "safetensors", True),
}


def reference_model(ckpt: str, config: dict | None):
    ref = voxcpm2_module()
    lora = ref.LoRAConfig(**config) if config is not None else None
    model = ref.VoxCPM2Model.from_local(ckpt, optimize=False, device="cpu", lora_config=lora)
    return model.eval()


@torch.no_grad()
def randomize_lora(model, seed: int, b_scale: float = 0.3):
    """Random LoRA values that change the output clearly without blowing it up: A ~ 1/sqrt(in),
    B ~ b_scale/sqrt(r)."""
    g = torch.Generator().manual_seed(seed)
    for name, p in sorted(model.named_parameters()):
        if name.endswith("lora_A"):
            p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1]))
        elif name.endswith("lora_B"):
            p.copy_(torch.randn(p.shape, generator=g) * b_scale / math.sqrt(p.shape[1]))


def save_official(model, folder: str, fmt: str = "safetensors", config: dict | None = None):
    """As the official trainer's save_checkpoint does for a LoRA run (and the config beside it)."""
    os.makedirs(folder, exist_ok=True)
    sd = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items() if "lora_" in k}
    if fmt == "safetensors":
        from safetensors.torch import save_file

        save_file(sd, os.path.join(folder, "lora_weights.safetensors"))
    else:
        torch.save({"state_dict": sd}, os.path.join(folder, "lora_weights.ckpt"))
    if config is not None:
        with open(os.path.join(folder, "lora_config.json"), "w", encoding="utf-8") as f:
            json.dump(config, f)
    return folder


def write_adapters(ckpt: str, lora_dir: str, names=tuple(ADAPTERS), seed: int = 0) -> dict:
    """Each named adapter of ADAPTERS, written by the reference into lora_dir/<name> -> {name: the
    reference model carrying it}."""
    out = {}
    for i, name in enumerate(names):
        config, fmt, with_json = ADAPTERS[name]
        model = reference_model(ckpt, config)
        randomize_lora(model, seed + 100 * i)
        save_official(model, os.path.join(lora_dir, name), fmt, config if with_json else None)
        out[name] = model
    return out
