"""Reading an official VoxCPM2 checkpoint directory, strictly.

Which files (`checkpoint_layout`): config.json; model.safetensors or pytorch_model.bin;
audiovae.safetensors or audiovae.pth; tokenizer.json + tokenizer_config.json. Tensor names are the
reference's. Anything missing, unexpected, mis-shaped or non-finite is an error
naming the file and the tensor.
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

from ..model.config import VoxCPM2Config
from .checkpoint_layout import CheckpointError


def _finite(t: torch.Tensor) -> bool:
    # One fp32 sum instead of isfinite(): any inf/nan makes it non-finite, and it is cheaper.
    return not t.is_floating_point() or bool(torch.isfinite(t.sum(dtype=torch.float32)))


def load_tensors(file: str, check_finite: bool = True) -> dict[str, torch.Tensor]:
    """A safetensors or torch pickle (weights only) state dict; a {"state_dict": ...} wrapper is unwrapped."""
    try:
        if file.endswith(".safetensors"):
            from safetensors.torch import load_file

            sd = load_file(file, device="cpu")
        else:
            sd = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as e:  # corrupt or truncated files
        raise CheckpointError(f"{file}: cannot read tensors: {type(e).__name__}: {e}") from None
    if isinstance(sd, dict) and isinstance(sd.get("state_dict"), dict):
        sd = sd["state_dict"]
    if not isinstance(sd, dict) or not all(isinstance(k, str) and torch.is_tensor(v) for k, v in sd.items()):
        raise CheckpointError(f"{file}: expected a mapping of tensor names to tensors")
    if check_finite:
        bad = sorted(k for k, v in sd.items() if not _finite(v))
        if bad:
            raise CheckpointError(f"{file}: tensor(s) with inf/nan values: {_summarise(bad)}")
    return sd


class _SkipRandomInit(TorchFunctionMode):
    """Skips random initialisation. On the meta device it does nothing anyway, but the
    meta kernels of normal_/randn make torch import torch._dynamo and sympy (2-3 s)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.Tensor.normal_, torch.nn.init.normal_):
            return args[0] if args else kwargs["tensor"]
        if func is torch.randn:
            kwargs.pop("generator", None)
            return torch.empty(*args, **kwargs)
        return func(*args, **kwargs)


def meta_model(cfg: VoxCPM2Config, attention: str = "torch", compile: bool = False):
    """The network on the meta device: names and shapes, no memory, no initialisation.
    attention, compile: its backends (`VoxCPM2Model`)."""
    from ..model.network import VoxCPM2Model

    # What building those backends imports (the Triton kernel modules; what torch.compile imports
    # when it wraps a function) is imported here, outside the meta-device context, so that no
    # module-level tensor of theirs is made on the meta device.
    if attention == "triton":
        from ..kernels import persistent_layer  # noqa: F401  (it imports kernels.local_attention)
    if compile:
        torch.compile(_identity)
    with torch.device("meta"), _SkipRandomInit():
        return VoxCPM2Model(cfg, attention=attention, compile=compile)


def _identity(x):
    return x


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
    sd = load_tensors(file, check_finite=False)  # checked after the copy, on the model's device
    # The reference merges the VAE into the same module under `audio_vae.`; we keep it apart.
    sd = {k: v for k, v in sd.items() if not k.startswith("audio_vae.")}
    params = dict(model.named_parameters())
    check_state_dict({k: p.shape for k, p in params.items()}, sd, file)
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(sd[name])
            if not _finite(p):  # inf/nan in the file, or overflow in the cast (fp32 -> fp16)
                src = "" if sd[name].dtype == p.dtype else f" (as {str(p.dtype).removeprefix('torch.')})"
                raise CheckpointError(f"{file}: tensor {name} has inf/nan values{src}")
            sd[name] = None  # free host memory as we go
