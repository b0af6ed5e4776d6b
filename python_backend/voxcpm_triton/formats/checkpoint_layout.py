"""Which files make an official VoxCPM2 checkpoint directory, found without loading anything (no torch:
serve.sh's pre-flight reads it)."""

from __future__ import annotations

import os


class CheckpointError(ValueError):
    pass


def _find(path: str, names: list[str], what: str) -> str:
    for n in names:
        p = os.path.join(path, n)
        if os.path.isfile(p):
            return p
    raise CheckpointError(f"{path}: no {what} file (expected one of {', '.join(names)})")


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
