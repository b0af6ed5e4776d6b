"""What serve.sh checks once, before the first start: the documented environment settings that every
model would refuse in the same way, which otherwise fail each model's load, five starts in a row.
Torch is imported only where VOXCPM_DEVICE is set (its check needs it)."""

from __future__ import annotations

import os
import sys

from ..formats.checkpoint_layout import CheckpointError, checkpoint_files
from ..model.config import ConfigError, VoxCPM2Config
from .parameters import TABLE


def _device_problem(device: str) -> str | None:
    from .placement import instance_device  # torch

    try:
        instance_device({}, device)
    except (ValueError, RuntimeError) as e:
        return str(e)
    return None


def problems(env: dict[str, str]) -> list[str]:
    """What is wrong with `env`'s VOXCPM_* settings, one line each."""
    said = []
    path = env.get("VOXCPM_CHECKPOINT", "").strip()  # as the models read it (Param.parse)
    if path:
        try:
            VoxCPM2Config.from_file(checkpoint_files(path)["config"])
        except (CheckpointError, ConfigError, OSError, UnicodeDecodeError) as e:
            said.append(f"VOXCPM_CHECKPOINT={env['VOXCPM_CHECKPOINT']} cannot be served: {e}")
    dtype = TABLE["decoder"]["dtype"]
    try:
        dtype.parse(env.get(dtype.env, ""))  # as the decoder reads it
    except ValueError:
        said.append(f"{dtype.env}={env[dtype.env]} is not a dtype: must be {dtype.allowed()}")
    lora_dir = env.get("VOXCPM_LORA_DIR", "").strip()
    if lora_dir and not os.path.isdir(lora_dir):
        said.append(f"VOXCPM_LORA_DIR={env['VOXCPM_LORA_DIR']} is not a directory")
    device = env.get("VOXCPM_DEVICE", "").strip()
    if device and (problem := _device_problem(device)):
        said.append(f"VOXCPM_DEVICE={env['VOXCPM_DEVICE']} cannot be used: {problem}")
    return said


def main() -> int:
    said = problems(dict(os.environ))
    for line in said:
        print(f"[serve] {line}", file=sys.stderr)
    return 2 if said else 0


if __name__ == "__main__":
    sys.exit(main())
