"""Where a model finds its checkpoint, device and dtype.

Checkpoint: the VOXCPM_CHECKPOINT env var, else the model's `checkpoint`
config parameter, else the embedded tiny checkpoint (generated on first use).
Device/dtype: VOXCPM_DEVICE / VOXCPM_DTYPE, else the `device` / `dtype`
parameters, else automatic (GPU + bf16 when there is a GPU, CPU + fp32 otherwise).
"""

from __future__ import annotations

import json
import os


def model_parameters(args: dict) -> dict:
    """Triton's `parameters { key: ... value { string_value: ... } }` as a plain dict."""
    cfg = json.loads(args["model_config"])
    return {k: v.get("string_value", "") for k, v in cfg.get("parameters", {}).items()}


def setting(params: dict, name: str, default: str | None = None) -> str | None:
    env = os.environ.get(f"VOXCPM_{name.upper()}")
    if env:
        return env
    value = params.get(name, "")
    return value if value not in ("", None) else default


def flag(params: dict, name: str, default: bool) -> bool:
    """A true/false setting; anything else stops the model with a message naming it."""
    value = setting(params, name, "true" if default else "false").strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"parameter {name!r} must be true or false, got {value!r}")


def positive_ints(params: dict, name: str, default: str) -> tuple:
    """A comma-separated list of positive ints; anything else stops the model with a message naming it."""
    value = setting(params, name, default)
    try:
        out = tuple(int(x) for x in value.split(","))
    except ValueError:
        out = ()
    if not out or min(out) < 1:
        raise ValueError(f"parameter {name!r} must be positive integers separated by commas, got {value!r}")
    return out


def positive_int(params: dict, name: str, default: int) -> int:
    value = setting(params, name, str(default))
    if not value.strip().isdigit() or int(value) < 1:
        raise ValueError(f"parameter {name!r} must be a positive integer, got {value!r}")
    return int(value)


def positive_float(params: dict, name: str, default: float) -> float:
    value = setting(params, name, str(default))
    try:
        out = float(value)
    except ValueError:
        out = float("nan")
    if not (out > 0 and out < float("inf")):
        raise ValueError(f"parameter {name!r} must be a positive number, got {value!r}")
    return out


def resolve_checkpoint(params: dict) -> str:
    path = setting(params, "checkpoint")
    if path:
        if not os.path.isdir(path):
            raise FileNotFoundError(f"VoxCPM2 checkpoint directory not found: {path}")
        return path
    from ..paths import DEFAULT_TINY_DIR

    if os.path.isfile(os.path.join(DEFAULT_TINY_DIR, "config.json")):
        return DEFAULT_TINY_DIR
    from ..testing import ensure_tiny_checkpoint  # imports torch: only when generating

    return ensure_tiny_checkpoint()


def read_config(path: str) -> dict:
    with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
        return json.load(f)
