"""What serve.sh checks once, before the first start: the settings that every start would fail on in the
same way, which otherwise fail each model's load, five starts in a row. Those are the documented
environment variables and the repository's config.pbtxt parameters, read as the models read them
(`parameters`), then the checkpoint, LoRA directory and device they name. Torch is imported only where a
device is set (its check needs it)."""

from __future__ import annotations

import logging
import os
import sys

from ..formats.checkpoint_layout import CheckpointError, checkpoint_files
from ..model.config import ConfigError, VoxCPM2Config
from .parameters import IDLE_US, TABLE, check_invariants, parse_values, read_pbtxt


def _device_problem(device: str) -> str | None:
    from .placement import instance_device  # torch

    try:
        instance_device({}, device)
    except (ValueError, RuntimeError) as e:
        return str(e)
    return None


def _checkpoint_problem(path: str) -> str | None:
    try:
        VoxCPM2Config.from_file(checkpoint_files(path)["config"])
    except (CheckpointError, ConfigError, OSError, UnicodeDecodeError) as e:
        return str(e)
    return None


def _dir_problem(path: str) -> str | None:
    return None if os.path.isdir(path) else "not a directory"


# What is checked of the paths and the device a setting names, by parameter
_VALUE_PROBLEMS = {"checkpoint": _checkpoint_problem, "lora_dir": _dir_problem, "device": _device_problem}


def _environment(env: dict[str, str]) -> list[str]:
    """The documented VOXCPM_* variables that no model would take, one line each."""
    said = []
    path = env.get("VOXCPM_CHECKPOINT", "").strip()  # as the models read it (Param.parse)
    if path and (problem := _checkpoint_problem(path)):
        said.append(f"VOXCPM_CHECKPOINT={env['VOXCPM_CHECKPOINT']} cannot be served: {problem}")
    dtype = TABLE["decoder"]["dtype"]
    try:
        dtype.parse(env.get(dtype.env, ""))  # as the decoder reads it
    except ValueError:
        said.append(f"{dtype.env}={env[dtype.env]} is not a dtype: must be {dtype.allowed()}")
    lora_dir = env.get("VOXCPM_LORA_DIR", "").strip()
    if lora_dir and _dir_problem(lora_dir):
        said.append(f"VOXCPM_LORA_DIR={env['VOXCPM_LORA_DIR']} is not a directory")
    device = env.get("VOXCPM_DEVICE", "").strip()
    if device and (problem := _device_problem(device)):
        said.append(f"VOXCPM_DEVICE={env['VOXCPM_DEVICE']} cannot be used: {problem}")
    return said


def _repository(repo: str, env: dict[str, str]) -> list[str]:
    """The config.pbtxt parameters of `repo`'s models that their model would refuse, one line each; a
    parameter that a set environment variable overrides is the environment's to check."""
    said, configs, named = [], {}, {}  # named: (parameter, value) -> the config.pbtxt files that give it
    for model, params in TABLE.items():
        path = os.path.join(repo, model, "config.pbtxt")
        if not os.path.isfile(path):
            continue
        try:
            raw, idle = read_pbtxt(path)
        except (ValueError, OSError) as e:
            said.append(f"{path}: {e}")
            continue
        overridden = {n for n, p in params.items() if p.env and env.get(p.env, "").strip()}
        raw = {n: v for n, v in raw.items() if n not in overridden}
        bad = []
        for n, v in raw.items():  # each, as the model would say the first
            try:
                parse_values(model, {n: v}, env=False)
            except ValueError as e:
                bad.append(f"{path}: {e}")
        if bad:
            said += bad
            continue
        values = parse_values(model, raw, env=False)
        configs[model] = {**values, IDLE_US: idle}
        for name in _VALUE_PROBLEMS:
            if name in params and name not in overridden and values[name]:
                named.setdefault((name, values[name]), []).append(path)
    for (name, value), paths in named.items():
        if problem := _VALUE_PROBLEMS[name](value):
            said.append(f"{', '.join(paths)}: parameter {name!r} ({value}) cannot be used: {problem}")
    for model in configs:
        try:
            check_invariants(configs, model)
        except ValueError as e:
            if f"{e}" not in said:  # a rule between two models fails for each of them
                said.append(f"{e}")
    return said


def problems(env: dict[str, str], repo: str | None = None) -> list[str]:
    """What is wrong with `env`'s VOXCPM_* settings and, given `repo`, its models' parameters, one line each."""
    return _environment(env) + (_repository(repo, env) if repo else [])


def main(repo: str | None = None) -> int:
    logging.getLogger("voxcpm_triton.parameters").setLevel(logging.ERROR)  # the rules' warnings: the models log them
    said = problems(dict(os.environ), repo)
    for line in said:
        print(f"[serve] {line}", file=sys.stderr)
    return 2 if said else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:2]))
