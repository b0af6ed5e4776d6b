"""EXPERIMENT, not used by the server: a LocDiT/LocEnc decoder layer over a few tokens in five
kernels instead of about a dozen. Measured on an H100 (benchmarks/results.md, "Fifteenth session"):
no faster than the compiled PyTorch path at LocDiT's 22 and 44 tokens (its GEMMs with a norm
prologue are slower than cuBLAS's), 1.2x at LocEnc's 10; the server runs the persistent kernel
(`voxcpm_triton.kernels.persistent_layer`) instead. Kept with its sweep
(benchmarks/kernel_fused_layer.py) and its tests.

At batch 1 a decode step evaluates LocDiT's 12 layers 9 times, each over a few dozen tokens, and
every kernel of those layers is latency-bound: cuBLAS's GEMMs, inductor's norm and SiLU kernels
and cuBLAS's split-K reductions each cost a launch, a ramp and a tail for a few microseconds of
work. Here the norms go into the prologue of the GEMM that reads them, SiLU-times-up and the
residual adds into the epilogue of the GEMM that produces them, and split-K sums into the GEMM
itself (its last program to arrive adds the partials):

    qkv  = rms_norm(x) Wqkv^T                      `linear(norm=)`
    attn = local attention over qkv                `kernels.local_attention`
    x1   = x + attn Wo^T                           `linear(residual=)`
    act  = silu(g) * u,  [g u] = rms_norm(x1) Wgu^T  `linear(norm=, gated=True)`
    out  = x1 + act Wd^T                           `linear(residual=)`

Same roundings as `model.minicpm.LayerMath` run eagerly: each GEMM's output is rounded to the
activation dtype before it is used, the norm as `rms_norm` (fp32 variance, rounded, then times the
weight), SiLU rounded before the product. Every program covers all tokens (at most `MAX_TOKENS`).

The split-K counters (`skinny_gemm`'s, shared) are zero at rest and made before any CUDA-graph capture.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from experiments.skinny_gemm import _MAX_TILES, _counters
from voxcpm_triton.kernels import local_attention
from voxcpm_triton.kernels._triton import HAVE_TRITON, interpreted, tl, triton
from voxcpm_triton.kernels._triton import next_pow2 as _next_pow2

MAX_TOKENS = 64  # every program holds all tokens' rows


if HAVE_TRITON:

    @triton.jit
    def _rms_scale(x_rows, m_mask, K, eps, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
        """rsqrt(mean(x^2) + eps) per row, in fp32 (as `minicpm.rms_norm`)."""
        ss = tl.zeros((BLOCK_M,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + tl.arange(0, BLOCK_K)
            xt = tl.load(x_rows + kk[None, :], mask=m_mask[:, None] & (kk < K)[None, :], other=0.0)
            xt = xt.to(tl.float32)
            ss += tl.sum(xt * xt, axis=1)
        return tl.rsqrt(ss / K + eps)

    @triton.jit
    def _finish(acc, acc_up, rm, rn, m_mask, n_mask, res_ptr, out_ptr, N,
                GATED: tl.constexpr, RESIDUAL: tl.constexpr):
        dtype = out_ptr.dtype.element_ty
        y = acc.to(dtype).to(tl.float32)  # the GEMM's output, rounded
        if GATED:
            up = acc_up.to(dtype).to(tl.float32)
            y = (y * tl.sigmoid(y)).to(dtype).to(tl.float32) * up
        offs = rm.to(tl.int64)[:, None] * N + rn[None, :]
        mask = m_mask[:, None] & n_mask[None, :]
        if RESIDUAL:
            y += tl.load(res_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + offs, y.to(dtype), mask=mask)

    @triton.jit
    def _linear_kernel(x_ptr, nw_ptr, w_ptr, res_ptr, out_ptr, part_ptr, count_ptr,
                       M, N, K, K_SPLIT, eps,
                       NORM: tl.constexpr, GATED: tl.constexpr, RESIDUAL: tl.constexpr,
                       SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr):
        pid_n, pid_k = tl.program_id(0), tl.program_id(1)
        dtype = x_ptr.dtype.element_ty
        rm = tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        m_mask, n_mask = rm < M, rn < N
        x_rows = x_ptr + rm.to(tl.int64)[:, None] * K
        w_rows = w_ptr + rn.to(tl.int64)[:, None] * K
        if NORM:
            scale = _rms_scale(x_rows, m_mask, K, eps, BLOCK_M, BLOCK_K)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        k_lo = pid_k * K_SPLIT
        for k0 in range(k_lo, k_lo + K_SPLIT, BLOCK_K):
            kk = k0 + tl.arange(0, BLOCK_K)
            k_mask = kk < K
            xt = tl.load(x_rows + kk[None, :], mask=m_mask[:, None] & k_mask[None, :], other=0.0)
            if NORM:
                nw = tl.load(nw_ptr + kk, mask=k_mask, other=0.0).to(tl.float32)
                xt = (xt.to(tl.float32) * scale[:, None]).to(dtype)
                xt = (xt.to(tl.float32) * nw[None, :]).to(dtype)
            w_mask = n_mask[:, None] & k_mask[None, :]
            wt = tl.load(w_rows + kk[None, :], mask=w_mask, other=0.0)
            if UPCAST:
                xt, wt = xt.to(tl.float32), wt.to(tl.float32)
            acc += tl.dot(xt, tl.trans(wt), input_precision=PRECISION)
            if GATED:  # the up rows sit N rows below the gate rows
                ut = tl.load(w_rows + N * K + kk[None, :], mask=w_mask, other=0.0)
                if UPCAST:
                    ut = ut.to(tl.float32)
                acc_up += tl.dot(xt, tl.trans(ut), input_precision=PRECISION)
        if SPLIT_K == 1:
            _finish(acc, acc_up, rm, rn, m_mask, n_mask, res_ptr, out_ptr, N, GATED, RESIDUAL)
        else:
            # Partials to the workspace; the column tile's last program sums them in split order
            # (deterministic), finishes, and resets the tile's counter for the next launch.
            offs = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
            tile_part = part_ptr + pid_n.to(tl.int64) * (SPLIT_K * BLOCK_M * BLOCK_N)
            tl.store(tile_part + pid_k * (BLOCK_M * BLOCK_N) + offs, acc)
            tl.debug_barrier()  # every thread's partial is written before the count says so
            arrived = tl.atomic_add(count_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
            if arrived == SPLIT_K - 1:
                acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                for s in tl.static_range(SPLIT_K):
                    acc += tl.load(tile_part + s * (BLOCK_M * BLOCK_N) + offs, cache_modifier=".cg")
                _finish(acc, acc_up, rm, rn, m_mask, n_mask, res_ptr, out_ptr, N, GATED, RESIDUAL)
                tl.atomic_xchg(count_ptr + pid_n, 0)

    _INTERPRETED = interpreted(_linear_kernel)
else:
    _INTERPRETED = False


class Config(NamedTuple):
    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 4


# (N, K, gated, block_m) -> launch, for LocDiT/LocEnc's shapes (hidden 1024, 16 + 2 x 2 heads of 128,
# FFN 4096) on an H100, from benchmarks/kernel_fused_layer.py; other shapes take `default_config`.
TUNED: dict = {
    (2560, 1024, False, 64): Config(32, 256, 1, 4, 3), (2560, 1024, False, 32): Config(32, 256, 1, 4, 3),
    (2560, 1024, False, 16): Config(32, 256, 1, 4, 3),
    (1024, 2048, False, 64): Config(16, 128, 2, 4, 4), (1024, 2048, False, 32): Config(16, 128, 2, 4, 4),
    (1024, 2048, False, 16): Config(32, 128, 4, 4, 4),
    (4096, 1024, True, 64): Config(32, 256, 1, 4, 3), (4096, 1024, True, 32): Config(32, 256, 1, 4, 3),
    (4096, 1024, True, 16): Config(32, 256, 1, 4, 3),
    (1024, 4096, False, 64): Config(32, 128, 4, 4, 4), (1024, 4096, False, 32): Config(32, 128, 4, 4, 4),
    (1024, 4096, False, 16): Config(32, 128, 8, 4, 4),
}


def default_config(N: int, K: int, gated: bool) -> Config:
    """About one program per SM: narrow column tiles, and a split K where the columns are few."""
    block_n = 32 if N >= 2048 else 16
    tiles = -(-N // block_n)
    split = 1
    while not gated and tiles * split * 2 <= 160 and K // (split * 2) >= 512:
        split *= 2
    return Config(block_n, 128, split)


def config(M: int, N: int, K: int, gated: bool) -> Config:
    block_m = max(16, _next_pow2(M))
    return TUNED.get((N, K, gated, block_m)) or default_config(N, K, gated)


def linear(x: torch.Tensor, w: torch.Tensor, norm: torch.Tensor | None = None, eps: float = 0.0,
           residual: torch.Tensor | None = None, gated: bool = False, cfg: Config | None = None) -> torch.Tensor:
    """x [M, K] -> y [M, N] with y = x' W^T, x' = rms_norm(x, norm, eps) if `norm` is given, else x;
    gated: W is [2N, K] (gate rows, then up rows) and y = silu(x' Wg^T) * (x' Wu^T);
    residual [M, N]: y + residual. M <= MAX_TOKENS."""
    if not HAVE_TRITON:
        raise RuntimeError("triton is not installed")
    M, K = x.shape
    N = w.size(0) // 2 if gated else w.size(0)
    assert 1 <= M <= MAX_TOKENS, f"five_kernel_layer.linear over {M} tokens (1..{MAX_TOKENS})"
    assert w.shape == ((2 * N) if gated else N, K) and w.dtype == x.dtype, (x.shape, w.shape, w.dtype, x.dtype)
    assert norm is None or norm.shape == (K,), norm.shape
    assert residual is None or residual.shape == (M, N), (None if residual is None else residual.shape, M, N)
    cfg = cfg or config(M, N, K, gated)
    if x.element_size() > 2:  # fp32 tiles take twice the shared memory
        cfg = cfg._replace(block_k=min(cfg.block_k, 64), num_stages=min(cfg.num_stages, 3))
    assert not (gated and cfg.split_k > 1), "a gated launch has no split K"
    x, w = x.contiguous(), w.contiguous()
    out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    block_m = max(16, _next_pow2(M))
    tiles = -(-N // cfg.block_n)
    k_split = -(-K // (cfg.split_k * cfg.block_k)) * cfg.block_k
    if cfg.split_k > 1:
        assert tiles <= _MAX_TILES, tiles
        part = torch.empty(tiles * cfg.split_k * block_m * cfg.block_n, dtype=torch.float32, device=x.device)
        counts = _counters(x.device)
    else:
        part = counts = out  # unused
    upcast = _INTERPRETED or x.dtype == torch.float32  # the interpreter's tl.dot takes no bf16
    _linear_kernel[(tiles, cfg.split_k)](
        x, norm if norm is not None else x, w, residual.contiguous() if residual is not None else x, out,
        part, counts, M, N, K, k_split, eps,
        NORM=norm is not None, GATED=gated, RESIDUAL=residual is not None, SPLIT_K=cfg.split_k,
        BLOCK_M=block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, UPCAST=upcast,
        PRECISION="ieee" if upcast else "tf32",
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out


def layer(x, norm1_w, qkv_w, cos, sin, seq_len: int, heads: tuple, o_w, norm2_w, gate_up_w, down_w,
          eps: float) -> torch.Tensor:
    """One decoder layer (see the module's docstring) over x [T, hidden], T = sequences x seq_len
    tokens; cos, sin: [seq_len, head_dim] fp32 RoPE tables, or None; heads: (Hq, Hkv, head_dim)."""
    n_heads, n_kv, head_dim = heads
    qkv = linear(x, qkv_w, norm=norm1_w, eps=eps)
    attn = local_attention.local_attention_op(qkv, cos, sin, seq_len, n_heads, n_kv, head_dim)
    x1 = linear(attn, o_w, residual=x)
    act = linear(x1, gate_up_w, norm=norm2_w, eps=eps, gated=True)
    return linear(act, down_w, residual=x1)
