"""Which device a model instance runs on.

Triton runs each instance of a Python model in its own process and says which one it is in
`args`: `model_instance_name` (`<group>_<k>`, k counting the group's instances) and, for
KIND_GPU, `model_instance_device_id`. Where a model's device resolves to a GPU without an index
("" on a GPU machine, or "cuda"), instances spread over the visible GPUs: a KIND_GPU instance
takes the GPU Triton placed it on, any other takes GPU k mod (number of GPUs). A device with an
index ("cuda:1") or "cpu" is taken as given by every instance.
"""

from __future__ import annotations

import re

import torch

from ..loading import resolve_device
from . import triton_io


def instance_name(args: dict) -> str:
    return args.get("model_instance_name") or args.get("model_name", "")


def instance_index(args: dict) -> int:
    """k of `<group>_<k>`: the instance's number in its group (0 when the name has none)."""
    m = re.search(r"_(\d+)$", instance_name(args))
    return int(m.group(1)) if m else 0


def instance_count(args: dict) -> int:
    """How many instances of this model the server runs (`triton_io.instance_count`), a KIND_AUTO
    group left unresolved counted per visible GPU."""
    return triton_io.instance_count(args, lambda: torch.cuda.device_count() if torch.cuda.is_available() else 0)


def instance_device(args: dict, device: str | None) -> torch.device:
    """The device of this instance for the model parameter `device` (None: automatic); the
    process's current CUDA device is set to it, so kernels launched without a device land there."""
    dev = resolve_device(device)
    if dev.type == "cuda" and dev.index is None:
        if args.get("model_instance_kind") == "GPU":
            dev = torch.device("cuda", int(args["model_instance_device_id"]))
        else:
            dev = torch.device("cuda", instance_index(args) % torch.cuda.device_count())
    if dev.type == "cuda":
        if dev.index >= torch.cuda.device_count():
            raise ValueError(f"device {str(dev)!r}: only {torch.cuda.device_count()} GPU(s) are visible")
        torch.cuda.set_device(dev)
    return dev


def labels(args: dict, model: str, device: torch.device) -> dict:
    """Metric labels of this instance: the model, the instance, its device."""
    return {"model": model, "instance": instance_name(args), "device": str(device)}
