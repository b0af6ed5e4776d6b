"""What the kernel modules share: triton is optional (without it, as in the CPU image, the PyTorch
paths run), whether the kernels can run compiled, whether triton's CPU interpreter runs them, and
the GPU's sizes that launches are chosen by."""

from __future__ import annotations

import functools

import torch

try:
    import triton
    import triton.language as tl

    HAVE_TRITON = True
except Exception:  # pragma: no cover - depends on the install
    triton = tl = None
    HAVE_TRITON = False


def available() -> bool:
    """True when the kernels can run compiled: triton importable and a CUDA device present."""
    return HAVE_TRITON and torch.cuda.is_available()


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def interpreted(kernel) -> bool:
    """True when `kernel` (a triton.jit function) runs under triton's CPU interpreter (CPU, numpy):
    TRITON_INTERPRET=1 at decoration time makes triton.jit return interpreter-run functions."""
    return type(kernel).__name__ == "InterpretedFunction"


@functools.lru_cache(maxsize=None)
def _properties(index: int):
    return torch.cuda.get_device_properties(index)


def _cuda_properties(device: torch.device):
    return _properties(device.index if device.index is not None else torch.cuda.current_device())


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (None index: the current one)."""
    return _cuda_properties(device).multi_processor_count


def shared_memory(device: torch.device) -> int:
    """Shared memory one program may use on a CUDA device (bytes, with the opt-in above the default)."""
    props = _cuda_properties(device)
    return getattr(props, "shared_memory_per_block_optin", 0) or props.shared_memory_per_block


def warpgroup_mma(device: torch.device) -> bool:
    """Whether a CUDA device multiplies with Hopper's warpgroup MMA (wgmma: compute capability 9.x),
    which triton uses for a product whose M side has 64 rows or more."""
    return device.type == "cuda" and _cuda_properties(device).major == 9
