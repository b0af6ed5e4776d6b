"""How a checkpoint's parts are built, for the offline API and the server alike: the device, dtype
and attention backend a model runs with, the AudioVAE alone (the VAE models, the decoder's audio
thread)."""

from __future__ import annotations

import torch

from .formats.checkpoint import load_tensors
from .formats.checkpoint_layout import CheckpointError, checkpoint_files
from .model.audio_vae import AudioVAE, compile_snakes
from .model.config import DTYPES, VoxCPM2Config


def resolve_device(device: str | None) -> torch.device:
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError:  # torch lists every device type it knows; only two are served
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device {device!r}: must be cpu, cuda or cuda:<index> (or auto)")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available")
    return dev


def resolve_attention(attention: str, device: torch.device) -> str:
    """"auto" | "triton" | "torch" -> "triton" or "torch" for a model on `device` (see VoxCPM2.from_pretrained)."""
    if attention not in ("auto", "triton", "torch"):
        raise ValueError(f"attention must be 'auto', 'triton' or 'torch', got {attention!r}")
    if attention == "torch" or (attention == "auto" and device.type != "cuda"):
        return "torch"  # no triton import where it cannot be used
    from .kernels import _triton

    if attention == "auto":
        return "triton" if _triton.available() else "torch"
    if device.type == "cuda":
        if not _triton.available():
            raise ValueError("attention='triton' requested but triton is unavailable")
    else:
        from .kernels import local_attention  # the CPU can run the kernels only interpreted (tests)

        if not local_attention._INTERPRETED:
            raise ValueError("attention='triton' needs a CUDA device (or triton's CPU interpreter, "
                             "TRITON_INTERPRET=1)")
    return "triton"


def resolve_dtype(dtype, device: torch.device) -> torch.dtype:
    """bf16 on a GPU, fp32 on the CPU, unless asked otherwise."""
    if dtype in (None, "auto"):
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"unsupported dtype {dtype!r}; use one of {sorted(DTYPES)}")
    return getattr(torch, DTYPES[dtype])


def load_audio_vae(path: str, device, triton_kernels: bool = False, compile: bool = False,
                   decode_precision: str = "fp32") -> tuple[VoxCPM2Config, AudioVAE]:
    """The checkpoint's AudioVAE alone, for the VAE Triton models, built with its decoder's
    backends: triton_kernels (`AudioVAE`: the `kernels.vae` kernels; the caller checks that they
    can run), compile (GPU: the snake activations torch.compile'd and warmed up here,
    `audio_vae.compile_snakes`) and decode_precision (the decoder's weights and activations:
    fp32, or opt-in bf16 / fp16, `AudioVAE.set_decode_precision`)."""
    files = checkpoint_files(path)
    cfg = VoxCPM2Config.from_file(files["config"])
    vae = AudioVAE(cfg.audio_vae_config, triton_kernels=triton_kernels)
    try:
        vae.load_vae_state_dict(load_tensors(files["vae"]))
    except ValueError as e:
        raise CheckpointError(f"{files['vae']}: {e}") from None
    vae = vae.to(device).eval().requires_grad_(False).set_decode_precision(decode_precision)
    if compile:
        compile_snakes(vae)
    return cfg, vae


def decoding_vae(path: str, device, triton_kernels: bool, compile: bool):
    """The checkpoint's AudioVAE for decoding chunks: on a GPU with the Triton kernels (where they
    can run) and the compiled snakes asked for; plain on the CPU -> (config, vae)."""
    if device.type != "cuda":
        return load_audio_vae(path, device)
    if triton_kernels:
        from .kernels import vae as vae_kernels  # imports triton: only where it can run

        triton_kernels = vae_kernels.available()
    return load_audio_vae(path, device, triton_kernels=triton_kernels, compile=compile)
