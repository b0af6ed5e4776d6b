"""Copies between host and GPU that do not wait for the GPU.

A copy from pageable host memory first waits for the work queued on its stream, and `.cpu()`
waits for the copy: each is a round trip to the GPU, and every process on the GPU (the decoder's,
and vae_decoder's or vae_encoder's) time-slices it, so each round trip can cost the other process's
turn. Through pinned buffers both copies are queued like kernels; one event then waits for all.
PyTorch keeps freed pinned buffers for reuse and never gives them back, so only copies up to
PINNED_MAX_BYTES take one; larger ones (none in normal serving) wait as before.
"""

from __future__ import annotations

import torch

PINNED_MAX_BYTES = 64 << 20


def to_device(t: torch.Tensor, device) -> torch.Tensor:
    """t on `device`; from the CPU to a GPU through a pinned buffer, without waiting."""
    device = torch.device(device)
    if device.type == "cuda" and t.device.type == "cpu" and _pinnable(t):
        return t.contiguous().pin_memory().to(device, non_blocking=True)
    return t.to(device)


def to_host(t: torch.Tensor) -> torch.Tensor:
    """t on the CPU; from a GPU into a pinned buffer, queued: valid once the stream has run it."""
    if t.device.type != "cuda":
        return t
    if not _pinnable(t):
        return t.cpu()
    return torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t, non_blocking=True)


def _pinnable(t: torch.Tensor) -> bool:
    return t.numel() * t.element_size() <= PINNED_MAX_BYTES
