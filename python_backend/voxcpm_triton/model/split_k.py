"""A linear layer whose output has few columns, split along K through cuBLAS itself:

    y = x W^T = sum_s x[:, s] W[:, s]^T     (S slices of K, one batched GEMM on strided views, no copies)

A decode step's output and down projections (LocDiT's [tokens, 1024] from K = 2048 and 4096, the LMs'
[rows, 2048]) make few output tiles: at LocDiT's 176 tokens (batch 8) the [176, 1024] output is 16 tiles
of 128 x 128 for 132 SMs, each streaming 1 MB of weights. S slices make S times the tiles. Each partial
product is rounded to bf16 (one GEMM rounds once; bf16 partials keep the batched GEMM and the sum
plain for inductor), and the sum is taken by the kernel that adds the residual after it (inductor
fuses the two). `benchmarks/kernel_split_k.py` measures it.

Only where it measured faster: CUDA, bf16 (an fp16 half could overflow where the sum does not), a
plain weight (not FP8), no adapter op on the site (`LayerMath`), at most `MAX_TOKENS` rows. Everywhere
else (the CPU, fp16, fp32, prefills of long prompts) `linear` is the plain one. On by default;
VOXCPM_SPLIT_K=0 turns it off. The row bound is a guard of the compiled layers: the engine's start-up
prefills a throwaway pack past it (`Engine._warm_up_prefill`), so that both branches are compiled
before any request.
"""

from __future__ import annotations

import os

import torch

from ..kernels.fp8 import linear as plain_linear

ENABLED = os.environ.get("VOXCPM_SPLIT_K", "1") != "0"
SPLITS = 2
MAX_TOKENS = 1536  # LocDiT up to batch 64 (1408 tokens); past it the GEMM has tiles enough
_MIN_SLICE = 64  # K per slice: a whole K tile


def split_views(x: torch.Tensor, w: torch.Tensor, splits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (rows contiguous), w [N, K] -> [S, M, K/S] (row stride K) and [S, K/S, N] (column-major)
    views of the same memory: the operands of the batched GEMM."""
    M, K = x.shape
    N = w.shape[0]
    return x.view(M, splits, K // splits).transpose(0, 1), w.view(N, splits, K // splits).permute(1, 2, 0)


def split_matmul(x: torch.Tensor, w: torch.Tensor, splits: int) -> torch.Tensor:
    """x w^T as `splits` partial products summed (any device)."""
    return torch.bmm(*split_views(x, w, splits)).sum(0)


def runs(x: torch.Tensor, w) -> bool:
    """Whether `linear` splits this call (into `SPLITS`, read at the call: a benchmark may change it)."""
    return (ENABLED and isinstance(w, torch.Tensor) and x.is_cuda and x.dim() == 2 and x.dtype == w.dtype
            and x.dtype == torch.bfloat16 and x.shape[0] <= MAX_TOKENS
            and x.shape[1] % (SPLITS * _MIN_SLICE) == 0 and x.stride(1) == 1 and x.stride(0) == x.shape[1])


def linear(x: torch.Tensor, w) -> torch.Tensor:
    """x W^T: split along K where that runs faster (`runs`), else the plain (or FP8) linear."""
    return split_matmul(x, w, SPLITS) if runs(x, w) else plain_linear(x, w)
