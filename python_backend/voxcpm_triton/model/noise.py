"""Counter-based Gaussian noise: sample (seed, step) -> the CFM start patch.

A request's noise depends only on its own seed and step index, never on the
batch it shares or on a generator's position, so batched and solo runs agree.
It is built from integer tensor ops only (no host sync, no generator state),
so it can be produced inside a captured CUDA graph.
"""

from __future__ import annotations

import math

import torch

_M32 = 0xFFFFFFFF


def _mix32(x: int | torch.Tensor) -> int | torch.Tensor:
    """A 32-bit avalanche hash on int64 tensors holding values < 2**32, or on a Python int (the
    same value: the products fit in int64, and Python's shifts and masks are two's complement's).

    Multipliers stay below 2**31 so products fit in int64 without overflow.
    """
    x = x & _M32
    x = x ^ (x >> 16)
    x = (x * 0x27D4EB2F) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x165667B1) & _M32
    x = x ^ (x >> 13)
    x = (x * 0x2C1B3C6D) & _M32
    return x ^ (x >> 16)


def request_key(seed: int | torch.Tensor) -> int | torch.Tensor:
    """seed: int64 [B] (any int64 value) -> 32-bit key [B]; or one int64 value as a Python int -> its
    key as an int (a request's, at submit: no tensor ops on the caller's thread)."""
    lo = seed & _M32
    hi = (seed >> 32) & _M32
    return _mix32(lo ^ _mix32(hi + 0x3C6EF372))


def gaussian_noise(key: torch.Tensor, step: torch.Tensor, shape: tuple[int, ...], dtype=torch.float32) -> torch.Tensor:
    """key, step: int64 [B] -> standard normal [B, *shape], via Box-Muller on hashed counters."""
    n = math.prod(shape)
    idx = torch.arange(n, device=key.device, dtype=torch.int64)
    k = _mix32(key ^ _mix32(step * 2 + 1))[:, None]
    a = _mix32(k ^ _mix32(idx * 2))
    b = _mix32(k ^ _mix32(idx * 2 + 1) ^ 0x5BD1E995)
    u1 = (a.double() + 1.0) / 4294967296.0  # (0, 1]: log is finite
    u2 = b.double() / 4294967296.0
    z = torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2.0 * math.pi * u2)
    return z.view(key.size(0), *shape).to(dtype)


def noise_for_steps(seed: int, n_steps: int, shape: tuple[int, ...], dtype=torch.float32) -> torch.Tensor:
    """The noise a request with `seed` uses at steps 0..n_steps-1: [n_steps, *shape]."""
    key = request_key(torch.tensor([seed], dtype=torch.int64)).expand(n_steps)
    return gaussian_noise(key, torch.arange(n_steps, dtype=torch.int64), shape, dtype)
