"""EXPERIMENT, not used by the server: a linear layer and its LoRA delta in one Triton kernel, for
the few tokens of a small batch. Measured on an H100 (benchmarks/results.md, "Eleventh session"):
as a plain GEMM it is within a few percent of cuBLAS at the decode shapes (both are bound by
per-kernel latency there, not by bandwidth), and with the LoRA inside it is no faster than cuBLAS
followed by `voxcpm_triton.kernels.lora`, at batch 1 slower in the engine (1.58x the plain step
against 1.23x). Kept with its sweep (benchmarks/kernel_skinny_gemm.py) and its tests so that the
result can be re-measured.

    x      [M, K]        the layer's input (M tokens), bf16 on the GPU
    w      [N, K]        its weight, as a Linear stores it
    a, b, slots, splits, halves: the site's LoRA, as `kernels.lora` takes it (A and B slot tables,
                         each row's slot, the fused targets' widths, the CFG blocks)
    -> x W^T + (x A[slot]^T) B[slot]^T, fp32 accumulation, the shrink rounded to the tables' dtype
       before the expand (as the reference's LoRALinear), the output rounded once (the served path
       rounds cuBLAS's output, then again after `kernels.lora` adds the delta)

Each program multiplies its rows by a BLOCK_N x K slice of W and, in the same K loop, by its
target's rows of A for each batch row's slot; the expand is the epilogue. A program covers all of
its tokens' rows, so this is for calls with few rows (`MAX_ROWS`); `linear_lora` leaves larger ones
to cuBLAS plus `kernels.lora`. What costs: every program re-reads A (as many programs as column
tiles), where `kernels.lora` reads it once per chunk of 128-512 columns.

Grid: (column tiles, row tiles, K splits). With SPLIT_K > 1 the splits' fp32 partial sums (and
shrinks) go to a workspace and the last program of a tile to arrive (a per-tile counter) adds them
in split order, finishes and resets the counter: one kernel per call, deterministic, and a CUDA
graph can replay it. Registered as the custom op `voxcpm_experiments::linear_lora`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from voxcpm_triton.kernels import lora as lora_kernel
from voxcpm_triton.kernels._triton import HAVE_TRITON, interpreted, tl, triton
from voxcpm_triton.kernels._triton import next_pow2 as _next_pow2

if HAVE_TRITON:

    @triton.jit
    def _expand_store(acc, u, rm, rn, m_mask, n_mask, tok_row, slots, g_idx, r_off, r_mask, b_ptr, out_ptr,
                      N, B_SLOT, LORA: tl.constexpr, G_PAD: tl.constexpr, R: tl.constexpr, UPCAST: tl.constexpr):
        if LORA:
            ub = u.to(b_ptr.dtype.element_ty)  # the shrink rounded, as the reference's bf16 LoRALinear
            if UPCAST:
                ub = ub.to(tl.float32)
            for g in tl.static_range(G_PAD):
                slot = tl.sum(tl.where(g_idx == g, slots, 0))
                live = slot != 0
                bt = tl.load(b_ptr + slot * B_SLOT + rn[:, None] * R + r_off[None, :],
                             mask=n_mask[:, None] & r_mask[None, :] & live, other=0.0)
                if UPCAST:
                    bt = bt.to(tl.float32)
                ug = tl.where((tok_row == g)[:, None], ub, 0.0).to(bt.dtype)
                acc += tl.dot(ug, tl.trans(bt), input_precision="ieee" if UPCAST else "tf32")
        out_offs = rm.to(tl.int64)[:, None] * N + rn[None, :]
        tl.store(out_ptr + out_offs, acc.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])

    @triton.jit
    def _skinny_kernel(x_ptr, w_ptr, out_ptr, part_ptr, count_ptr, a_ptr, b_ptr, slot_ptr,
                       M, N, K, K_SPLIT, G, T, A_SLOT, B_SLOT, BOUND1, BOUND2,
                       SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, LORA: tl.constexpr, G_PAD: tl.constexpr, R: tl.constexpr,
                       R_PAD: tl.constexpr, PART: tl.constexpr, UPCAST: tl.constexpr):
        pid_n, pid_m, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        m_mask, n_mask = rm < M, rn < N
        x_rows = x_ptr + rm.to(tl.int64)[:, None] * K
        w_rows = w_ptr + rn.to(tl.int64)[:, None] * K
        # LoRA: token i belongs to batch row (i // T) % G; this tile's columns to one target.
        g_idx = tl.arange(0, G_PAD)
        if LORA:
            slots = tl.load(slot_ptr + g_idx, mask=g_idx < G, other=0).to(tl.int64)
        else:
            slots = g_idx.to(tl.int64)
        tok_row = (rm // T) % G
        target = (pid_n * BLOCK_N >= BOUND1).to(tl.int64) + (pid_n * BLOCK_N >= BOUND2).to(tl.int64)
        r_off = tl.arange(0, R_PAD)
        r_mask = r_off < R
        a_rows = a_ptr + (target * R + r_off).to(tl.int64)[:, None] * K
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        u = tl.zeros((BLOCK_M, R_PAD), dtype=tl.float32)
        k_lo = pid_k * K_SPLIT
        for k0 in range(k_lo, k_lo + K_SPLIT, BLOCK_K):
            kk = k0 + tl.arange(0, BLOCK_K)
            k_mask = kk < K
            xt = tl.load(x_rows + kk[None, :], mask=m_mask[:, None] & k_mask[None, :], other=0.0)
            wt = tl.load(w_rows + kk[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)
            if UPCAST:  # the CPU interpreter has no bf16 dot
                xt, wt = xt.to(tl.float32), wt.to(tl.float32)
            acc += tl.dot(xt, tl.trans(wt), input_precision="ieee" if UPCAST else "tf32")
            if LORA:
                for g in tl.static_range(G_PAD):
                    slot = tl.sum(tl.where(g_idx == g, slots, 0))
                    at = tl.load(a_rows + slot * A_SLOT + kk[None, :],
                                 mask=r_mask[:, None] & k_mask[None, :] & (slot != 0), other=0.0)
                    if UPCAST:
                        at = at.to(tl.float32)
                    xg = tl.where((tok_row == g)[:, None], xt, 0.0).to(at.dtype)
                    u += tl.dot(xg, tl.trans(at), input_precision="ieee" if UPCAST else "tf32")
        if SPLIT_K == 1:
            _expand_store(acc, u, rm, rn, m_mask, n_mask, tok_row, slots, g_idx, r_off, r_mask, b_ptr, out_ptr,
                          N, B_SLOT, LORA, G_PAD, R, UPCAST)
        else:
            tile = pid_m * tl.num_programs(0) + pid_n
            acc_offs = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
            u_offs = BLOCK_M * BLOCK_N + tl.arange(0, BLOCK_M)[:, None] * R_PAD + r_off[None, :]
            tile_part = part_ptr + tile.to(tl.int64) * (SPLIT_K * PART)
            tl.store(tile_part + pid_k * PART + acc_offs, acc)
            if LORA:
                tl.store(tile_part + pid_k * PART + u_offs, u)
            tl.debug_barrier()  # every thread's partial is written before the count says so
            arrived = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu")
            if arrived == SPLIT_K - 1:  # the tile's last program: sum in split order, finish
                acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                u = tl.zeros((BLOCK_M, R_PAD), dtype=tl.float32)
                for s in tl.static_range(SPLIT_K):
                    acc += tl.load(tile_part + s * PART + acc_offs, cache_modifier=".cg")
                    if LORA:
                        u += tl.load(tile_part + s * PART + u_offs, cache_modifier=".cg")
                _expand_store(acc, u, rm, rn, m_mask, n_mask, tok_row, slots, g_idx, r_off, r_mask, b_ptr,
                              out_ptr, N, B_SLOT, LORA, G_PAD, R, UPCAST)
                tl.atomic_xchg(count_ptr + tile, 0)  # ready for the next launch

    _INTERPRETED = interpreted(_skinny_kernel)
else:
    _INTERPRETED = False


class Config(NamedTuple):
    block_m: int
    block_n: int
    block_k: int
    split_k: int
    num_warps: int = 4
    num_stages: int = 4


class Lora(NamedTuple):
    """A site's LoRA for one call (`kernels.lora`'s arguments)."""

    a: torch.Tensor  # [S, n*R, K]
    b: torch.Tensor  # [S, N, R]
    slots: torch.Tensor  # [G]
    splits: tuple
    halves: int


MAX_M = 64  # tokens per call the kernel takes (the sweep measured up to 64)
MAX_ROWS = 2  # batch rows with their own slot: each costs every program a pass over its A rows
_MAX_TILES = 1 << 16  # split-K counters kept per device

# (N, K, block_m) -> the plain GEMM's launch at VoxCPM2's decode shapes, picked by hand from the rows of
# benchmarks/kernel_skinny_gemm.py on an H100; other shapes take `_DEFAULT`.
TUNED: dict = {
    (2560, 2048, 16): Config(16, 32, 128, 1, 4, 5), (2560, 2048, 32): Config(32, 32, 256, 1, 2, 4),
    (2560, 2048, 64): Config(64, 32, 128, 1, 4, 5),
    (2048, 2048, 16): Config(16, 16, 128, 1, 4, 5), (2048, 2048, 32): Config(32, 16, 256, 1, 2, 4),
    (2048, 2048, 64): Config(64, 16, 128, 1, 4, 5),
    (12288, 2048, 16): Config(16, 32, 128, 1, 4, 5), (12288, 2048, 32): Config(32, 32, 128, 1, 4, 3),
    (12288, 2048, 64): Config(64, 128, 128, 1, 8, 3),
    (2048, 6144, 16): Config(16, 32, 128, 4, 4, 5), (2048, 6144, 32): Config(32, 32, 128, 4, 2, 4),
    (2048, 6144, 64): Config(64, 16, 256, 1, 4, 5),
    (2560, 1024, 16): Config(16, 16, 128, 1, 2, 4), (2560, 1024, 32): Config(32, 32, 128, 1, 4, 4),
    (2560, 1024, 64): Config(64, 32, 128, 1, 4, 5), (1024, 2048, 16): Config(16, 32, 128, 4, 4, 4),
}
_DEFAULT = (32, 128, 1, 4, 4)  # block_n, block_k, split_k, warps, stages


def config(M: int, N: int, K: int) -> Config | None:
    """The launch for an [M, K] x [K, N] product, None beyond MAX_M. Depends on M only through
    BLOCK_M, so a row's result does not depend on how many rows share the call (eager runs and
    graph buckets pad differently)."""
    if not 1 <= M <= MAX_M:
        return None
    block_m = max(16, _next_pow2(M))
    return TUNED.get((N, K, block_m)) or Config(block_m, *_DEFAULT)


def fused_config(M: int, N: int, K: int, lora: Lora) -> Config | None:
    """The launch for the fused call, or None: cuBLAS plus `kernels.lora`."""
    cfg = config(M, N, K)
    G, R = lora.slots.size(0), lora.b.size(-1)
    if cfg is None or G > MAX_ROWS or not lora_kernel.supports(lora.splits, R) or M % (lora.halves * G):
        return None
    block_n = cfg.block_n  # a column tile must lie inside one target
    while block_n > 16 and any(w % block_n for w in lora.splits):
        block_n //= 2
    if any(w % block_n for w in lora.splits):
        return None
    return cfg._replace(block_n=block_n)


_COUNTERS: dict = {}


def _counters(device: torch.device) -> torch.Tensor:
    """Split-K arrival counters, zero at rest: each tile's last program resets its counter. Launches
    on one device share them (this experiment's and five_kernel_layer's), so split-K launches must not
    run concurrently (one stream, as a decoder's steps)."""
    key = torch.device(device.type, device.index if device.index is not None or device.type != "cuda"
                       else torch.cuda.current_device())
    if key not in _COUNTERS:
        if key.type == "cuda" and torch.cuda.is_current_stream_capturing():
            # zeros made during a capture are filled only when the graph replays
            raise RuntimeError("split-K counters: make a split-K call once before capturing a CUDA graph")
        _COUNTERS[key] = torch.zeros(_MAX_TILES, dtype=torch.int32, device=key)
    return _COUNTERS[key]


def launch(x: torch.Tensor, w: torch.Tensor, cfg: Config, lora: Lora | None = None) -> torch.Tensor:
    """x [M, K] @ w[N, K]^T, plus `lora`'s delta, with launch `cfg`."""
    if not HAVE_TRITON:
        raise RuntimeError("triton is not installed")
    M, K = x.shape
    N = w.size(0)
    assert w.shape == (N, K) and x.dtype == w.dtype, (x.shape, w.shape, x.dtype, w.dtype)
    x, w = x.contiguous(), w.contiguous()
    out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M == 0:
        return out
    grid = (-(-N // cfg.block_n), -(-M // cfg.block_m), cfg.split_k)
    tiles = grid[0] * grid[1]
    k_split = -(-K // (cfg.split_k * cfg.block_k)) * cfg.block_k
    if lora is not None:
        a, b, slots = lora.a.contiguous(), lora.b.contiguous(), lora.slots
        G, R = slots.size(0), b.size(-1)
        assert a.shape[1:] == (len(lora.splits) * R, K) and b.shape[1:] == (N, R) and sum(lora.splits) == N
        assert 1 <= len(lora.splits) <= 3 and not any(w % cfg.block_n for w in lora.splits), \
            (lora.splits, cfg.block_n)  # a column tile inside one target
        assert slots.device == x.device and slots.dim() == 1, (slots.device, slots.shape)
        assert M % (lora.halves * G) == 0, (M, lora.halves, G)
        T = M // (lora.halves * G)
        bounds = [sum(lora.splits[:i + 1]) for i in range(len(lora.splits))] + [N, N]
        lora_args = (a, b, slots, G, T, a.stride(0), b.stride(0), bounds[0], bounds[1])
        r_pad, g_pad = max(16, _next_pow2(R)), _next_pow2(G)
    else:
        R, r_pad, g_pad = 1, 16, 1
        lora_args = (out, out, out, 1, 1, 0, 0, N, N)
    per_split = cfg.block_m * cfg.block_n + (cfg.block_m * r_pad if lora is not None else 0)
    if cfg.split_k > 1:
        assert tiles <= _MAX_TILES, tiles
        part = torch.empty(tiles * cfg.split_k * per_split, dtype=torch.float32, device=x.device)
        counts = _counters(x.device)
    else:
        part = counts = out  # unused
    a_, b_, slots_, *sizes = lora_args
    _skinny_kernel[grid](
        x, w, out, part, counts, a_, b_, slots_, M, N, K, k_split, *sizes,
        SPLIT_K=cfg.split_k, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        LORA=lora is not None, G_PAD=g_pad, R=R, R_PAD=r_pad, PART=per_split, UPCAST=_INTERPRETED,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out


def _runs_here(x: torch.Tensor) -> bool:
    return HAVE_TRITON and (x.is_cuda or _INTERPRETED)


@torch.library.custom_op("voxcpm_experiments::linear_lora", mutates_args=())
def _linear_lora_op(x: torch.Tensor, w: torch.Tensor, a: torch.Tensor, b: torch.Tensor, slots: torch.Tensor,
                    splits: list[int], halves: int) -> torch.Tensor:
    lora = Lora(a, b, slots, tuple(splits), halves)
    cfg = fused_config(x.size(0), w.size(0), x.size(1), lora) if _runs_here(x) else None
    if cfg is None:
        return lora_kernel.lora_add(F.linear(x, w), x, a, b, slots, splits, halves)
    return launch(x, w, cfg, lora)


@_linear_lora_op.register_fake
def _(x, w, a, b, slots, splits, halves):
    return x.new_empty((x.size(0), w.size(0)))


def linear_lora(x: torch.Tensor, w: torch.Tensor, a: torch.Tensor, b: torch.Tensor, slots: torch.Tensor,
                splits: tuple, halves: int = 1) -> torch.Tensor:
    """F.linear(x, w) plus each row's LoRA delta, for x [..., K] -> [..., N]: one kernel for a call
    of few tokens and rows, else cuBLAS and `kernels.lora`."""
    lead = x.shape[:-1]
    out = _linear_lora_op(x.reshape(-1, x.size(-1)), w, a, b, slots, list(splits), halves)
    return out.view(*lead, w.size(0))
