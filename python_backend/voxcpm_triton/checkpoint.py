"""Reading an official VoxCPM2 checkpoint directory, strictly.

Files: config.json; model.safetensors or pytorch_model.bin; audiovae.safetensors
or audiovae.pth; tokenizer.json + tokenizer_config.json. Tensor names are the
reference's. Anything missing, unexpected or mis-shaped is an error naming it.
"""

from __future__ import annotations

import os

import torch

from .config import VoxCPM2Config


class CheckpointError(ValueError):
    pass


def _find(path: str, names: list[str], what: str) -> str:
    for n in names:
        p = os.path.join(path, n)
        if os.path.isfile(p):
            return p
    raise CheckpointError(f"{path}: no {what} file (expected one of {', '.join(names)})")


def load_tensors(file: str) -> dict[str, torch.Tensor]:
    """A safetensors or torch pickle (weights only) state dict."""
    try:
        if file.endswith(".safetensors"):
            from safetensors.torch import load_file

            return load_file(file, device="cpu")
        sd = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as e:  # corrupt or truncated files
        raise CheckpointError(f"{file}: cannot read tensors: {e}") from None
    if isinstance(sd, dict) and isinstance(sd.get("state_dict"), dict):
        sd = sd["state_dict"]
    if not isinstance(sd, dict) or not all(torch.is_tensor(v) for v in sd.values()):
        raise CheckpointError(f"{file}: expected a mapping of tensor names to tensors")
    return sd


def checkpoint_files(path: str) -> dict[str, str]:
    if not os.path.isdir(path):
        raise CheckpointError(f"checkpoint directory not found: {path}")
    return {
        "config": _find(path, ["config.json"], "config"),
        "model": _find(path, ["model.safetensors", "pytorch_model.bin"], "model weights"),
        "vae": _find(path, ["audiovae.safetensors", "audiovae.pth"], "AudioVAE weights"),
        "tokenizer": _find(path, ["tokenizer.json"], "tokenizer"),
        "tokenizer_config": _find(path, ["tokenizer_config.json"], "tokenizer config"),
    }


def load_config(path: str) -> VoxCPM2Config:
    return VoxCPM2Config.from_file(checkpoint_files(path)["config"])


def _summarise(names: list[str], limit: int = 8) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" ... ({len(names)} in all)" if len(names) > limit else "")


def check_state_dict(expected: dict[str, torch.Size], given: dict[str, torch.Tensor], file: str):
    missing = sorted(set(expected) - set(given))
    unexpected = sorted(set(given) - set(expected))
    if missing:
        raise CheckpointError(f"{file}: missing tensor(s): {_summarise(missing)}")
    if unexpected:
        raise CheckpointError(f"{file}: unexpected tensor(s): {_summarise(unexpected)}")
    for name, shape in expected.items():
        if tuple(given[name].shape) != tuple(shape):
            raise CheckpointError(
                f"{file}: tensor {name} has shape {list(given[name].shape)}, expected {list(shape)}")
        if not given[name].is_floating_point():
            raise CheckpointError(f"{file}: tensor {name} has dtype {given[name].dtype}, expected floating point")


def load_model_weights(model: torch.nn.Module, file: str):
    """Copy an official state dict into `model` (any device/dtype), strictly."""
    sd = load_tensors(file)
    # The reference merges the VAE into the same module under `audio_vae.`; we keep it apart.
    sd = {k: v for k, v in sd.items() if not k.startswith("audio_vae.")}
    params = dict(model.named_parameters())
    check_state_dict({k: p.shape for k, p in params.items()}, sd, file)
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(sd[name])
