"""What the kernel modules share: triton is optional (without it, as in the CPU image, the PyTorch
paths run), whether the kernels can run compiled, and whether triton's CPU interpreter runs them."""

from __future__ import annotations

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
