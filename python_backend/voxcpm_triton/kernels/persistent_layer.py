"""A decoder layer over a few tokens as one persistent kernel: LocDiT/LocEnc's (local attention), and
an LM's in a decode step (paged attention over each row's cache).

The layer's kernels at batch 1 are each latency-bound (launch, ramp, tail), even with every weight
already in L2 (benchmarks/kernel_fused_layer.py). Here one launch of about one
program per SM runs the layer's phases, with a grid-wide barrier between them:

    0  h    = rms_norm(x)                          rows over programs
    1  qkv  = h Wqkv^T                             column tiles over programs
    2  attn = attention over qkv                   local: (sequence, head block); paged: (row, kv head,
                                                   context split), RoPE at the row's position, the new
                                                   K/V written into the cache (`paged_attention`)
    3  attn = the context splits merged            (row, head); paged with several splits only
    4  part = attn Wo^T, in K splits (fp32)        (column tile, split) over programs
    5  x1   = x + sum(part);  h = rms_norm(x1)     rows
    6  act  = silu(h Wg^T) * (h Wu^T)              column tiles
    7  part = act Wd^T, in K splits                (column tile, split)
    8  out  = x1 + sum(part)                       rows
             (next_norm: also h' = rms_norm(out), the next layer's phase 0 done here)

A layer given h_in (the previous layer's h') starts at phase 1: stacked layers save a phase and a
barrier each. `stack` runs a whole stack in one launch instead (LocDiT's, LocEnc's): after phase 8
a barrier, then the next layer from phase 1, its weights at offsets from the first layer's; the
last layer's h' is the stack's final norm.

The gate/up phase's items are column tiles; with `Launch.balance` an item fills only as many of its
tile's rows as spread the columns over every program (`_columns`): the LM's 96 gate/up tiles would
leave a quarter of its 128 programs idle through the layer's largest phase.

The output and down projections split K because every program of a column tile reads all of its
input rows: unsplit, 64 tiles would read the [T, 4096] activations 64 times over from L2.

The barrier spins on a counter in global memory, so every program must be resident at once: the
grid is at most the SM count, one program per SM. Under Triton's CPU interpreter (tests), which
runs programs one after another, each phase is a launch of its own instead (same code).

Same roundings as `model.minicpm.LayerMath` run eagerly: each GEMM's output rounded to the
activation dtype before it is used (split-K partials summed in fp32, in split order, then rounded),
the norm as `rms_norm`, SiLU rounded before the product. Every work item covers all tokens.

With e4m3 weights (`precision` fp8, `kernels.fp8.FP8Weight`) the kernel reads half the weight
bytes. It multiplies in fp16: e4m3 widens to fp16 in one instruction per pair (to bf16 it takes
several, which made the phases slower than bf16's), and a bf16 activation rounds to fp16 exactly
within fp16's normal range (clamped to its finite one); each output column's fp32 sum is then
scaled by its weight row's scale. The activations are not quantised (weight-only), where the
compiled layers of larger batches quantise them per token (`kernels.fp8.fp8_linear`): at these few
tokens a step is bound by its weight reads, not by the GEMMs' arithmetic.

Below 64 token rows, on Hopper, the 16-bit products are swapped (`Launch.swap`): out^T = W x^T,
the weight tile on the product's M side. Hopper's warpgroup MMA (wgmma) takes M from 64 rows, which
a few tokens' rows never reach, and reads both operands from the pipeline's shared memory buffers
where the older MMA waits on loads into registers. A gated tile stacks its gate and up rows into
one product; tiles of 64 weight rows or more (gate/up's 2 x 32 in LocDiT/LocEnc; the LM's output,
gate/up and down tiles) then take wgmma, narrower ones (QKV's 32) stay on the older MMA.
The output, gate/up and down phases (and QKV after a computed norm) start from weights already on
their way: in the phase before, every program asks L2 for the first K tiles of its item there
(`Launch.prefetch`, a `prefetch.global.L2` hint per line). A chained layer starts at QKV, so its
QKV weights are not asked for.

Registered as the custom ops `voxcpm::local_layer` and `voxcpm::local_stack`: torch.compile keeps
each as one opaque call in the compiled LocDiT/LocEnc, and CUDA graphs capture them (the barrier's
counters are zero at rest, made on the first call, before any capture, as is a stack's offsets
table). `FusedLocalLayers` is the LocDiT/LocEnc attention backend that offers them whole stacks
and whole layers; `engine.attention.PagedAttention.layer` offers it an LM's decode-step
layers (called directly: the LM's layer loop is not compiled). VOXCPM_FUSED_LOCAL_LAYERS=0 and
VOXCPM_FUSED_LM_LAYERS=0 turn them off (VOXCPM_FUSED_FP8_LAYERS=0: only those of e4m3 weights;
VOXCPM_FUSED_STACKS=0: a launch per layer, not per stack): do that where other kernels could hold
SMs indefinitely (persistent kernels of two processes under CUDA MPS, or of two engines on two
streams of one process).
"""

from __future__ import annotations

import math
import os
import threading
from typing import NamedTuple

import torch

from . import local_attention, paged_attention
from ._triton import HAVE_TRITON, interpreted, shared_memory, sm_count, tl, triton, warpgroup_mma
from ._triton import next_pow2 as _next_pow2
from .fp8 import FP8, FP8Weight

MAX_TOKENS = 96  # every program holds all tokens' rows: LocDiT at batch bucket 4 (88) is the last it wins
WIDE_TOKENS = 64  # past this, 8 warps to a program (benchmarks/kernel_fused_layer.py)
PHASES = 9  # the fourth (merging a paged attention's context splits) runs only for those
TIM_COLS, TIM_START, TIM_END = 18, 16, 17  # timings: per program, 2 per barrier (at most 8), start, end
STACK_COLS = 10  # a stack's offsets per layer: QKV, output, gate/up, down, the two norms, the four e4m3 scales
ENABLED = os.environ.get("VOXCPM_FUSED_LOCAL_LAYERS", "1") != "0"
MAX_ROWS = 16  # LM decode rows: batch buckets up to 16 (larger batches keep cuBLAS's GEMMs)
ENABLED_LM = os.environ.get("VOXCPM_FUSED_LM_LAYERS", "1") != "0"
ENABLED_FP8 = os.environ.get("VOXCPM_FUSED_FP8_LAYERS", "1") != "0"  # layers of e4m3 weights (precision fp8)
ENABLED_STACKS = os.environ.get("VOXCPM_FUSED_STACKS", "1") != "0"  # LocDiT's/LocEnc's layers in one launch

if HAVE_TRITON:
    _TIM_COLS, _TIM_START, _TIM_END = tl.constexpr(TIM_COLS), tl.constexpr(TIM_START), tl.constexpr(TIM_END)
    _STACK_COLS = tl.constexpr(STACK_COLS)
    _FP16_MAX = tl.constexpr(65504.0)

    @triton.jit
    def _clock():
        return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False,
                                         pack=1)

    @triton.jit
    def _prefetch(w_ptr, row0, n_rows, K: tl.constexpr, k0, ROWS: tl.constexpr, LINES: tl.constexpr,
                  LINE: tl.constexpr, COLS: tl.constexpr):
        """Ask L2 for LINES lines of LINE elements (128 bytes) from column k0 of weight rows row0 ..
        row0 + COLS (of n_rows, K long; ROWS, the tile's, a power of two >= COLS: the rows past COLS
        repeat the last): the start of a program's next GEMM item, before the barrier in front of it.
        A hint: nothing waits for it."""
        r = tl.minimum(row0 + tl.minimum(tl.arange(0, ROWS), COLS - 1), n_rows - 1)
        ptrs = w_ptr + r.to(tl.int64)[:, None] * K + k0 + tl.arange(0, LINES)[None, :] * LINE
        tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                                  is_pure=False, pack=1)

    @triton.jit
    def _grid_sync(sync_ptr, target, tim_ptr, slot, TIMING: tl.constexpr):
        """Wait until `target` arrivals have been counted, this program's included. TIMING: record the
        arrival and the exit (ns) at tim_ptr[2 * slot], [2 * slot + 1] (a profile of the phases)."""
        tl.debug_barrier()  # every thread's writes before the arrival
        if TIMING:
            tl.store(tim_ptr + 2 * slot, _clock())
        tl.atomic_add(sync_ptr, 1, sem="release", scope="gpu")
        seen = tl.atomic_add(sync_ptr, 0, sem="acquire", scope="gpu")
        while seen < target:
            seen = tl.atomic_add(sync_ptr, 0, sem="acquire", scope="gpu")
        tl.debug_barrier()
        if TIMING:
            tl.store(tim_ptr + 2 * slot + 1, _clock())

    @triton.jit
    def _rms_norm_row(x, w, eps, dst_ptr, H: tl.constexpr):
        """One row (fp32, padding zero) as `minicpm.rms_norm`, in dst_ptr's dtype: fp32 variance,
        rounded, then times w."""
        dtype = dst_ptr.dtype.element_ty
        scale = tl.rsqrt(tl.sum(x * x, axis=0) / H + eps)
        return ((x * scale).to(dtype).to(tl.float32) * w).to(dtype)

    @triton.jit
    def _norm_rows(src_ptr, w_ptr, dst_ptr, M, eps, pid, P, H: tl.constexpr, H_PAD: tl.constexpr):
        cols = tl.arange(0, H_PAD)
        cm = cols < H
        w = tl.load(w_ptr + cols, mask=cm, other=0.0).to(tl.float32)
        for r in range(pid, M, P):
            x = tl.load(src_ptr + r * H + cols, mask=cm, other=0.0, cache_modifier=".cg").to(tl.float32)
            tl.store(dst_ptr + r * H + cols, _rms_norm_row(x, w, eps, dst_ptr, H), mask=cm)

    @triton.jit
    def _k_loop(a_rows, w_rows, up_rows, m_mask, n_mask, K_LEN: tl.constexpr, GATED: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr,
                UPCAST: tl.constexpr, PRECISION: tl.constexpr, W_FP8: tl.constexpr, SWAP: tl.constexpr):
        """fp32 sums over K_LEN columns of [BLOCK_M] activation rows times [BLOCK_N] weight rows (and,
        GATED, times the up rows too, sharing the activation loads) -> (acc, acc_up), [BLOCK_M, BLOCK_N].
        SWAP (never GATED: `_tile` stacks a gated tile's rows instead): the weight rows are the product's
        M side, acc is [BLOCK_N, BLOCK_M] and acc_up unused. STAGES: shared memory buffers of the loop's
        software pipeline (STAGES - 1 K tiles in flight). W_FP8: e4m3 weights, multiplied in fp16 (see
        the module doc)."""
        tl.static_assert(not (SWAP and GATED), "a swapped gated tile is one stacked product (_tile)")
        if SWAP:
            acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        else:
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in tl.range(0, K_LEN, BLOCK_K, num_stages=STAGES):
            kk = k0 + tl.arange(0, BLOCK_K)
            a = tl.load(a_rows + kk[None, :], mask=m_mask[:, None], other=0.0, cache_modifier=".cg")
            w = tl.load(w_rows + kk[None, :], mask=n_mask[:, None], other=0.0)
            if UPCAST:
                a, w = a.to(tl.float32), w.to(tl.float32)
            elif W_FP8:
                a = tl.clamp(a.to(tl.float32), -_FP16_MAX, _FP16_MAX).to(tl.float16)
                w = w.to(tl.float16)
            if SWAP:
                acc += tl.dot(w, tl.trans(a), input_precision=PRECISION)
            else:
                acc += tl.dot(a, tl.trans(w), input_precision=PRECISION)
            if GATED:
                u = tl.load(up_rows + kk[None, :], mask=n_mask[:, None], other=0.0)
                if UPCAST:
                    u = u.to(tl.float32)
                elif W_FP8:
                    u = u.to(tl.float16)
                acc_up += tl.dot(a, tl.trans(u), input_precision=PRECISION)
        return acc, acc_up

    @triton.jit
    def _scaled_rows(acc, ws_ptr, rn, n_mask, W_FP8: tl.constexpr, SWAP: tl.constexpr):
        """A product's fp32 sums as [BLOCK_M, BLOCK_N] (SWAP: given [BLOCK_N, BLOCK_M], transposed),
        each column rn times its weight row's scale (W_FP8)."""
        if W_FP8:
            if SWAP:
                acc = acc * tl.load(ws_ptr + rn, mask=n_mask, other=0.0)[:, None]
            else:
                acc = acc * tl.load(ws_ptr + rn, mask=n_mask, other=0.0)[None, :]
        if SWAP:
            acc = tl.trans(acc)
        return acc

    @triton.jit
    def _tile(a_ptr, w_ptr, ws_ptr, out_ptr, M, N, n0, K: tl.constexpr, GATED: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr,
              UPCAST: tl.constexpr, PRECISION: tl.constexpr, W_FP8: tl.constexpr, SWAP: tl.constexpr,
              COLS: tl.constexpr):
        """out[:, n0 : n0 + COLS] of a [M, K] x [K, N] product, rounded (gated: W is [2N, K], gate rows
        then up rows, and out = silu(gate) * up, SiLU rounded before the product). W_FP8: each column's
        fp32 sum times its weight row's scale (ws_ptr, one per row of W) before the rounding. COLS <=
        BLOCK_N: the tile's rows past COLS are masked, neither read nor written (unmasked, they would
        only repeat the next item's columns: the tests cannot tell, the weight reads can).

        SWAP: multiply W's rows by the activations' (out^T = W a^T): the weight tile is the product's
        M side, which Hopper's warpgroup MMA takes from 64 rows, where a few tokens' rows would be
        too few. Gated, the tile stacks its gate rows over its up rows (2 x BLOCK_N), one product."""
        dtype = out_ptr.dtype.element_ty
        rm = tl.arange(0, BLOCK_M)
        rn = n0 + tl.arange(0, BLOCK_N)
        m_mask, n_mask = rm < M, (rn < N) & (tl.arange(0, BLOCK_N) < COLS)
        a_rows = a_ptr + rm[:, None] * K
        if SWAP and GATED:
            r2 = tl.arange(0, 2 * BLOCK_N)
            col = n0 + r2 % BLOCK_N
            row = col + (r2 // BLOCK_N) * N  # gate rows, then the same columns' up rows
            c_mask = (col < N) & (r2 % BLOCK_N < COLS)
            both, _ = _k_loop(a_rows, w_ptr + row.to(tl.int64)[:, None] * K, w_ptr, m_mask, c_mask, K, False,
                              BLOCK_M, 2 * BLOCK_N, BLOCK_K, STAGES, UPCAST, PRECISION, W_FP8, True)
            if W_FP8:
                both = both * tl.load(ws_ptr + row, mask=c_mask, other=0.0)[:, None]
            gate, up = tl.split(tl.permute(tl.reshape(both, (2, BLOCK_N, BLOCK_M)), (1, 2, 0)))
            acc, acc_up = tl.trans(gate), tl.trans(up)
        else:
            w_rows = w_ptr + rn.to(tl.int64)[:, None] * K
            acc, acc_up = _k_loop(a_rows, w_rows, w_rows + N * K, m_mask, n_mask, K, GATED, BLOCK_M, BLOCK_N,
                                  BLOCK_K, STAGES, UPCAST, PRECISION, W_FP8, SWAP)
            acc = _scaled_rows(acc, ws_ptr, rn, n_mask, W_FP8, SWAP)
            if GATED:
                acc_up = _scaled_rows(acc_up, ws_ptr + N, rn, n_mask, W_FP8, False)
        y = acc.to(dtype).to(tl.float32)
        if GATED:
            y = (y * tl.sigmoid(y)).to(dtype).to(tl.float32) * acc_up.to(dtype).to(tl.float32)
        tl.store(out_ptr + rm[:, None] * N + rn[None, :], y.to(dtype), mask=m_mask[:, None] & n_mask[None, :])

    @triton.jit
    def _split_k(a_ptr, w_ptr, ws_ptr, part_ptr, M, N, pid, P, K: tl.constexpr, SPLIT: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr,
                 UPCAST: tl.constexpr, PRECISION: tl.constexpr, W_FP8: tl.constexpr, SWAP: tl.constexpr):
        """A [M, K] x [K, N] product's (column tile, K split) items over programs, each to its split's
        fp32 partials, part[split] (W_FP8: scaled as in `_tile`; SWAP: multiplied as there)."""
        n_tiles: tl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
        K_SPLIT: tl.constexpr = K // SPLIT
        rm = tl.arange(0, BLOCK_M)
        m_mask = rm < M
        for u in range(pid, n_tiles * SPLIT, P):
            split = u // n_tiles
            rn = (u % n_tiles) * BLOCK_N + tl.arange(0, BLOCK_N)
            n_mask = rn < N
            acc, _ = _k_loop(a_ptr + rm[:, None] * K + split * K_SPLIT,
                             w_ptr + rn.to(tl.int64)[:, None] * K + split * K_SPLIT, w_ptr, m_mask, n_mask,
                             K_SPLIT, False, BLOCK_M, BLOCK_N, BLOCK_K, STAGES, UPCAST, PRECISION, W_FP8, SWAP)
            acc = _scaled_rows(acc, ws_ptr, rn, n_mask, W_FP8, SWAP)
            tl.store(part_ptr + split * M * N + rm[:, None] * N + rn[None, :], acc,
                     mask=m_mask[:, None] & n_mask[None, :])

    @triton.jit
    def _finish_rows(part_ptr, res_ptr, dst_ptr, nw_ptr, h_ptr, M, eps, pid, P, SPLIT: tl.constexpr,
                     NORM: tl.constexpr, H: tl.constexpr, H_PAD: tl.constexpr):
        """Rows over programs: dst = res + (the split partials summed in order, rounded); NORM: also
        h = rms_norm(dst) (the next phase's input)."""
        dtype = dst_ptr.dtype.element_ty
        cols = tl.arange(0, H_PAD)
        cm = cols < H
        if NORM:
            w = tl.load(nw_ptr + cols, mask=cm, other=0.0).to(tl.float32)
        for r in range(pid, M, P):
            acc = tl.zeros((H_PAD,), dtype=tl.float32)
            for s in tl.static_range(SPLIT):
                acc += tl.load(part_ptr + (s * M + r) * H + cols, mask=cm, other=0.0, cache_modifier=".cg")
            y = acc.to(dtype).to(tl.float32) + tl.load(res_ptr + r * H + cols, mask=cm, other=0.0,
                                                        cache_modifier=".cg").to(tl.float32)
            y = y.to(dtype)
            tl.store(dst_ptr + r * H + cols, y, mask=cm)
            if NORM:
                tl.store(h_ptr + r * H + cols, _rms_norm_row(y.to(tl.float32), w, eps, h_ptr, H), mask=cm)

    @triton.jit
    def _layer_phases(
        res_ptr, qkv_w, cos_ptr, sin_ptr, o_w, n2_ptr, gu_w, d_w, qkv_s, o_s, gu_s, d_s, out_ptr,
        h_ptr, qkv_ptr, attn_ptr, x1_ptr, act_ptr, part_ptr, sync_ptr, tim, h2_ptr, nn_ptr, hn_ptr,
        kp_ptr, vp_ptr, bt_ptr, ctx_ptr, slot_ptr, pm_ptr, pl_ptr, pacc_ptr, nxt_qkv, more, nb, pid, P,
        M, S, eps, qk_scale, stride_kb, stride_kt, stride_kh, stride_btb, max_blocks,
        H: tl.constexpr, H_PAD: tl.constexpr, I: tl.constexpr,
        HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, HALF: tl.constexpr, HALF_PAD: tl.constexpr,
        S_PAD: tl.constexpr, HEADS: tl.constexpr, HAS_ROPE: tl.constexpr,
        PAGED: tl.constexpr, BLOCK_SIZE: tl.constexpr, ATT_N: tl.constexpr, G_PAD: tl.constexpr,
        D_PAD: tl.constexpr, ATT_SPLITS: tl.constexpr,
        BLOCK_M: tl.constexpr, BN_QKV: tl.constexpr, BN_O: tl.constexpr, BN_GU: tl.constexpr,
        BN_D: tl.constexpr, SPLIT_O: tl.constexpr, SPLIT_D: tl.constexpr, BLOCK_K: tl.constexpr,
        ST_QKV: tl.constexpr, ST_O: tl.constexpr, ST_GU: tl.constexpr, ST_D: tl.constexpr,
        FIRST: tl.constexpr, LAST: tl.constexpr, GRID_SYNC: tl.constexpr, NEXT_NORM: tl.constexpr,
        UPCAST: tl.constexpr, PRECISION: tl.constexpr, TIMING: tl.constexpr, W_FP8: tl.constexpr,
        SWAP: tl.constexpr, PF_QKV: tl.constexpr, PF_O: tl.constexpr, PF_GU: tl.constexpr, PF_D: tl.constexpr,
        C_GU: tl.constexpr,
    ):
        """Phases 1-8 of one layer (module doc), whose input norm is at h_ptr and residual at res_ptr;
        nb: the barriers passed so far -> nb after this layer's. more (a stack's layer with one after
        it): a barrier after phase 8, whose h' at hn_ptr the next layer reads, and nxt_qkv, that
        layer's QKV weights, asked of L2 in phase 8."""
        NQKV: tl.constexpr = (HQ + 2 * HKV) * D
        HO: tl.constexpr = HQ * D
        LINE: tl.constexpr = 1024 // qkv_w.dtype.element_ty.primitive_bitwidth  # weight elements per 128-byte line
        N_O: tl.constexpr = (H + BN_O - 1) // BN_O  # `_split_k`'s column tiles
        N_D: tl.constexpr = (H + BN_D - 1) // BN_D
        if FIRST <= 1 and 1 <= LAST:  # qkv = h Wqkv^T
            for t in range(pid, tl.cdiv(NQKV, BN_QKV), P):
                _tile(h_ptr, qkv_w, qkv_s, qkv_ptr, M, NQKV, t * BN_QKV, H, False, BLOCK_M, BN_QKV, BLOCK_K,
                      ST_QKV, UPCAST, PRECISION, W_FP8, SWAP, BN_QKV)
            if GRID_SYNC:
                nb += 1
                _grid_sync(sync_ptr, nb * P, tim, nb - 1, TIMING)
        if FIRST <= 2 and 2 <= LAST:  # attention
            if PF_O and pid < N_O * SPLIT_O:  # its first item, as `_split_k` numbers them
                _prefetch(o_w, (pid % N_O) * BN_O, H, HO, (pid // N_O) * (HO // SPLIT_O), BN_O, PF_O, LINE, BN_O)
            if PAGED:  # (row, kv head, context split); the new K/V into the cache
                for u in range(pid, M * HKV * ATT_SPLITS, P):
                    bk = u // ATT_SPLITS
                    paged_attention.qkv_row_attend(
                        qkv_ptr, cos_ptr, sin_ptr, kp_ptr, vp_ptr, bt_ptr, ctx_ptr, slot_ptr, attn_ptr, pm_ptr, pl_ptr,
                        pacc_ptr, bk // HKV, bk % HKV, u % ATT_SPLITS, stride_kb, stride_kt, stride_kh, stride_btb,
                        max_blocks, qk_scale, HQ, HKV, D, BLOCK_SIZE, G_PAD, D_PAD, ATT_N, ATT_SPLITS, HAS_ROPE,
                        PRECISION, UPCAST)
            else:  # (sequence, head block)
                blocks = HQ // HEADS
                for u in range(pid, (M // S) * blocks, P):
                    local_attention.attend(qkv_ptr, cos_ptr, sin_ptr, attn_ptr, NQKV, HO, S, qk_scale,
                                           u // blocks, (u % blocks) * HEADS, HQ, HKV, D, HALF, HALF_PAD, S_PAD,
                                           HEADS, HAS_ROPE, UPCAST, PRECISION, ".cg")
            if GRID_SYNC:
                nb += 1
                _grid_sync(sync_ptr, nb * P, tim, nb - 1, TIMING)
        if PAGED and ATT_SPLITS > 1 and FIRST <= 3 and 3 <= LAST:  # the context splits' partial softmaxes
            for bh in range(pid, M * HQ, P):
                paged_attention.merge_split_row(pm_ptr, pl_ptr, pacc_ptr, attn_ptr, bh, HO, D, 1, HQ, D, D_PAD,
                                                ATT_SPLITS, ".cg")
            if GRID_SYNC:
                nb += 1
                _grid_sync(sync_ptr, nb * P, tim, nb - 1, TIMING)
        if FIRST <= 4 and 4 <= LAST:  # attn Wo^T, split K
            _split_k(attn_ptr, o_w, o_s, part_ptr, M, H, pid, P, HO, SPLIT_O, BLOCK_M, BN_O, BLOCK_K, ST_O,
                     UPCAST, PRECISION, W_FP8, SWAP)
            if GRID_SYNC:
                nb += 1
                _grid_sync(sync_ptr, nb * P, tim, nb - 1, TIMING)
        if FIRST <= 5 and 5 <= LAST:  # x1 = x + (sum), h = rms_norm(x1)
            if PF_GU and pid < tl.cdiv(I, C_GU):
                _prefetch(gu_w, pid * C_GU, I, H, 0, BN_GU, PF_GU, LINE, C_GU)
                _prefetch(gu_w, I + pid * C_GU, 2 * I, H, 0, BN_GU, PF_GU, LINE, C_GU)
            _finish_rows(part_ptr, res_ptr, x1_ptr, n2_ptr, h2_ptr, M, eps, pid, P, SPLIT_O, True, H, H_PAD)
            if GRID_SYNC:
                nb += 1
                _grid_sync(sync_ptr, nb * P, tim, nb - 1, TIMING)
        if FIRST <= 6 and 6 <= LAST:  # act = silu(h Wg^T) * (h Wu^T)
            for t in range(pid, tl.cdiv(I, C_GU), P):
                _tile(h2_ptr, gu_w, gu_s, act_ptr, M, I, t * C_GU, H, True, BLOCK_M, BN_GU, BLOCK_K, ST_GU,
                      UPCAST, PRECISION, W_FP8, SWAP, C_GU)
            if PF_D and pid < N_D * SPLIT_D:
                _prefetch(d_w, (pid % N_D) * BN_D, H, I, (pid // N_D) * (I // SPLIT_D), BN_D, PF_D, LINE, BN_D)
            if GRID_SYNC:
                nb += 1
                _grid_sync(sync_ptr, nb * P, tim, nb - 1, TIMING)
        if FIRST <= 7 and 7 <= LAST:  # act Wd^T, split K
            _split_k(act_ptr, d_w, d_s, part_ptr, M, H, pid, P, I, SPLIT_D, BLOCK_M, BN_D, BLOCK_K, ST_D,
                     UPCAST, PRECISION, W_FP8, SWAP)
            if GRID_SYNC:
                nb += 1
                _grid_sync(sync_ptr, nb * P, tim, nb - 1, TIMING)
        if FIRST <= 8 and 8 <= LAST:  # out = x1 + (sum)
            if more and PF_QKV and pid < tl.cdiv(NQKV, BN_QKV):
                _prefetch(nxt_qkv, pid * BN_QKV, NQKV, H, 0, BN_QKV, PF_QKV, LINE, BN_QKV)
            _finish_rows(part_ptr, x1_ptr, out_ptr, nn_ptr, hn_ptr, M, eps, pid, P, SPLIT_D, NEXT_NORM, H, H_PAD)
            if GRID_SYNC:
                if more:
                    nb += 1
                    _grid_sync(sync_ptr, nb * P, tim, nb - 1, TIMING)
        return nb

    @triton.jit
    def _layer_kernel(
        x_ptr, n1_ptr, qkv_w, cos_ptr, sin_ptr, o_w, n2_ptr, gu_w, d_w, qkv_s, o_s, gu_s, d_s, out_ptr,
        h_ptr, qkv_ptr, attn_ptr, x1_ptr, act_ptr, part_ptr, sync_ptr, tim_ptr, h2_ptr, nn_ptr, hn_ptr,
        kp_ptr, vp_ptr, bt_ptr, ctx_ptr, slot_ptr, pm_ptr, pl_ptr, pacc_ptr, off_ptr,
        M, S, eps, qk_scale, stride_kb, stride_kt, stride_kh, stride_btb, max_blocks, layer0, n_layers,
        H: tl.constexpr, H_PAD: tl.constexpr, I: tl.constexpr,
        HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, HALF: tl.constexpr, HALF_PAD: tl.constexpr,
        S_PAD: tl.constexpr, HEADS: tl.constexpr, HAS_ROPE: tl.constexpr,
        PAGED: tl.constexpr, BLOCK_SIZE: tl.constexpr, ATT_N: tl.constexpr, G_PAD: tl.constexpr,
        D_PAD: tl.constexpr, ATT_SPLITS: tl.constexpr,
        BLOCK_M: tl.constexpr, BN_QKV: tl.constexpr, BN_O: tl.constexpr, BN_GU: tl.constexpr,
        BN_D: tl.constexpr, SPLIT_O: tl.constexpr, SPLIT_D: tl.constexpr, BLOCK_K: tl.constexpr,
        ST_QKV: tl.constexpr, ST_O: tl.constexpr, ST_GU: tl.constexpr, ST_D: tl.constexpr,
        FIRST: tl.constexpr, LAST: tl.constexpr, GRID_SYNC: tl.constexpr, NEXT_NORM: tl.constexpr,
        UPCAST: tl.constexpr, PRECISION: tl.constexpr, TIMING: tl.constexpr, W_FP8: tl.constexpr,
        SWAP: tl.constexpr, PF_QKV: tl.constexpr, PF_O: tl.constexpr, PF_GU: tl.constexpr, PF_D: tl.constexpr,
        C_GU: tl.constexpr, LAYERS: tl.constexpr,
    ):
        """One layer (LAYERS 0), or layers layer0 .. layer0 + LAYERS - 1 of a stack of n_layers
        (`stack`): each layer's weights and norms at its row of off_ptr [n_layers + 1, STACK_COLS],
        element offsets from the pointers given (layer 0's) of its QKV, output, gate/up and down
        weights, input and post-attention norms, and (e4m3) the four weights' scales (row n_layers:
        the final norm's, column 4); x in, each layer's output in place at out_ptr, each next input
        norm (after the last: the final norm of its output) at h_ptr."""
        pid, P = tl.program_id(0), tl.num_programs(0)
        tim = tim_ptr + pid * _TIM_COLS
        if TIMING:
            tl.store(tim + _TIM_START, _clock())
        NQKV: tl.constexpr = (HQ + 2 * HKV) * D
        LINE: tl.constexpr = 1024 // qkv_w.dtype.element_ty.primitive_bitwidth
        nb = 0  # barriers passed
        if FIRST <= 0 and 0 <= LAST:  # h = rms_norm(x)
            if PF_QKV and pid < tl.cdiv(NQKV, BN_QKV):
                _prefetch(qkv_w, pid * BN_QKV, NQKV, H, 0, BN_QKV, PF_QKV, LINE, BN_QKV)
            _norm_rows(x_ptr, n1_ptr, h_ptr, M, eps, pid, P, H, H_PAD)
            if GRID_SYNC:
                nb += 1
                _grid_sync(sync_ptr, nb * P, tim, nb - 1, TIMING)
        if LAYERS == 0:
            nb = _layer_phases(
                x_ptr, qkv_w, cos_ptr, sin_ptr, o_w, n2_ptr, gu_w, d_w, qkv_s, o_s, gu_s, d_s, out_ptr,
                h_ptr, qkv_ptr, attn_ptr, x1_ptr, act_ptr, part_ptr, sync_ptr, tim, h2_ptr, nn_ptr, hn_ptr,
                kp_ptr, vp_ptr, bt_ptr, ctx_ptr, slot_ptr, pm_ptr, pl_ptr, pacc_ptr, qkv_w, False, nb, pid, P,
                M, S, eps, qk_scale, stride_kb, stride_kt, stride_kh, stride_btb, max_blocks,
                H, H_PAD, I, HQ, HKV, D, HALF, HALF_PAD, S_PAD, HEADS, HAS_ROPE, PAGED, BLOCK_SIZE, ATT_N, G_PAD,
                D_PAD, ATT_SPLITS, BLOCK_M, BN_QKV, BN_O, BN_GU, BN_D, SPLIT_O, SPLIT_D, BLOCK_K,
                ST_QKV, ST_O, ST_GU, ST_D, FIRST, LAST, GRID_SYNC, NEXT_NORM, UPCAST, PRECISION, TIMING, W_FP8,
                SWAP, PF_QKV, PF_O, PF_GU, PF_D, C_GU)
        else:
            res_ptr = x_ptr
            for l in range(layer0, layer0 + LAYERS):
                if l > 0:  # the residual stream, in place from the second layer on
                    res_ptr = out_ptr
                # offsets of 16 elements' multiples (`stack` checks): the weights stay as aligned as
                # layer 0's, which the K loops' vector loads and pipelining need
                o = off_ptr + l * _STACK_COLS
                more = l + 1 < n_layers
                nb = _layer_phases(
                    res_ptr, qkv_w + tl.multiple_of(tl.load(o), 16), cos_ptr, sin_ptr,
                    o_w + tl.multiple_of(tl.load(o + 1), 16), n2_ptr + tl.multiple_of(tl.load(o + 5), 16),
                    gu_w + tl.multiple_of(tl.load(o + 2), 16), d_w + tl.multiple_of(tl.load(o + 3), 16),
                    qkv_s + tl.load(o + 6), o_s + tl.load(o + 7), gu_s + tl.load(o + 8), d_s + tl.load(o + 9),
                    out_ptr, h_ptr, qkv_ptr, attn_ptr, x1_ptr, act_ptr, part_ptr, sync_ptr, tim, h2_ptr,
                    # the next input norm (row n_layers: the final) and QKV weights
                    n1_ptr + tl.multiple_of(tl.load(o + _STACK_COLS + 4), 16), h_ptr,
                    kp_ptr, vp_ptr, bt_ptr, ctx_ptr, slot_ptr, pm_ptr, pl_ptr, pacc_ptr,
                    qkv_w + tl.multiple_of(tl.load(o + _STACK_COLS), 16), more, nb, pid, P,
                    M, S, eps, qk_scale, stride_kb, stride_kt, stride_kh, stride_btb, max_blocks,
                    H, H_PAD, I, HQ, HKV, D, HALF, HALF_PAD, S_PAD, HEADS, HAS_ROPE, PAGED, BLOCK_SIZE, ATT_N,
                    G_PAD, D_PAD, ATT_SPLITS, BLOCK_M, BN_QKV, BN_O, BN_GU, BN_D, SPLIT_O, SPLIT_D, BLOCK_K,
                    ST_QKV, ST_O, ST_GU, ST_D, FIRST, LAST, GRID_SYNC, True, UPCAST, PRECISION, TIMING, W_FP8,
                    SWAP, PF_QKV, PF_O, PF_GU, PF_D, C_GU)
        if TIMING:
            tl.debug_barrier()
            tl.store(tim + _TIM_END, _clock())
        if GRID_SYNC:  # the last program out resets the counters for the next launch
            gone = tl.atomic_add(sync_ptr + 1, 1, sem="acq_rel", scope="gpu")
            if gone == P - 1:
                tl.atomic_xchg(sync_ptr, 0)
                tl.atomic_xchg(sync_ptr + 1, 0)

    _INTERPRETED = interpreted(_layer_kernel)
else:
    _INTERPRETED = False


_SYNC = threading.local()


def _sync(device: torch.device) -> torch.Tensor:
    """The barrier's two counters, zero at rest (each launch's last program resets them), one pair per
    thread and device: launches that share a pair must not run at once, and a thread launches on one
    stream at a time (an engine's thread: its steps, prefills and graph replays in order; two engines
    in one process each have their own thread). Made on a thread's first call, which must not be
    inside a CUDA-graph capture (zeros made there are filled only when the graph replays)."""
    key = torch.device("cuda", torch.cuda.current_device()) if device.type == "cuda" and device.index is None \
        else device
    pairs = getattr(_SYNC, "pairs", None)
    if pairs is None:
        pairs = _SYNC.pairs = {}
    if key not in pairs:
        if key.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("persistent_layer: make a call on this thread before capturing a CUDA graph")
        pairs[key] = torch.zeros(2, dtype=torch.int32, device=key)
    return pairs[key]


def _programs(device: torch.device, work: int) -> int:
    """Programs for `work` items: at most one per SM, so that all are resident at once."""
    return max(1, min(work, sm_count(device)))


class Launch(NamedTuple):
    blocks: tuple = (32, 32, 32, 32)  # column tiles: QKV, output, gate/up, down projections
    splits: tuple = (4, 4)  # K splits: output, down projections
    block_k: int = 128
    attn_heads: int = 1  # query heads per attention work item
    num_warps: int = 4
    stages: int = 5  # most pipeline buffers per GEMM's K loop (fewer where K or shared memory is short); 0: no cap
    swap: bool = False  # weight rows as the products' M side (`_tile`)
    prefetch: int = 0  # K tiles of its next GEMM item each program asks L2 for before the barrier (0: none)
    balance: bool = False  # gate/up items of `_columns` columns: narrower than a tile where tiles < programs


SMEM_RESERVE = 32 * 1024  # for the rest of the kernel (epilogue layout changes, the barrier's broadcast)
FP8_BLOCK_K = 256  # e4m3 weights: as many weight bytes per K tile as bf16's 128 (the bf16 launch where it does not fit)


def _stages(launch: Launch, smem: int, block_m: int, bn: int, k_len: int, gated: bool, elem: int,
            w_elem: int) -> int:
    """Pipeline buffers for one GEMM's K loop of elem-byte activations and w_elem-byte weights:
    launch.stages (stages - 1 K tiles in flight: a program has one or two tiles per phase, so a deep
    pipeline is what keeps its loads from waiting on each other), fewer where the loop has fewer K
    tiles or shared memory is short."""
    per_stage = launch.block_k * (elem * block_m + w_elem * bn * (2 if gated else 1))
    want = k_len // launch.block_k + 1
    if launch.stages:
        want = min(want, launch.stages)
    return max(2, min(want, (smem - SMEM_RESERVE) // per_stage))


def _prefetch_lines(launch: Launch, k_len: int, w_elem: int) -> int:
    """128-byte lines of each weight row that a program asks L2 for ahead of a GEMM item of k_len
    columns: launch.prefetch K tiles, at most the item's, rounded down to a power of two (0: none)."""
    if not launch.prefetch:
        return 0
    n = max(1, min(launch.prefetch * launch.block_k, k_len) * w_elem // 128)
    return 1 << (n.bit_length() - 1)


def _columns(n: int, block_n: int, programs: int, balance: bool) -> int:
    """Output columns per gate/up work item over n columns: the tile's block_n, or with balance as few
    as spread the items over all programs (a multiple of 8, at most block_n). Tiles alone leave
    programs idle where n / block_n < programs: the LM's gate/up (6144 / 64 = 96 items for 128
    programs). (QKV's 80 tiles were measured narrowed too: LocDiT's layer slower, the LM's no faster.)"""
    if not balance:
        return block_n
    per = -(-n // programs)
    return min(block_n, max(8, -(-per // 8) * 8))


def _smem(device: torch.device) -> int:
    """Shared memory one program may use (bytes); the interpreter's is unbounded."""
    return shared_memory(device) if device.type == "cuda" else 1 << 30


def launch_for(H: int, HO: int, I: int, tokens: int = 1, fp8: bool = False) -> Launch | None:
    """The launch for a layer of hidden size H, attention width HO and FFN width I over `tokens`
    rows: the measured one (LocDiT/LocEnc's 1024 / 2048 / 4096: benchmarks/kernel_fused_layer.py;
    from hidden 2048 on, the LM's 2048 / 2048 / 6144, wider output, gate/up and down tiles:
    benchmarks/kernel_lm_layer.py; past WIDE_TOKENS, 8 warps for the 128-row tiles), with splits
    and K tiles cut down until they divide other sizes; None if none does. fp8 (e4m3 weights): K
    tiles of FP8_BLOCK_K where they divide."""
    split_o = next((s for s in (4, 2, 1) if HO % (16 * s) == 0), None)
    split_d = next((s for s in (4, 2, 1) if I % (16 * s) == 0), None)
    if split_o is None or split_d is None:
        return None
    block_k = next((k for k in (FP8_BLOCK_K if fp8 else 128, 128, 64, 32, 16) if H % k == 0 and HO % (split_o * k) == 0
                    and I % (split_d * k) == 0), None)
    if block_k is None:
        return None
    launch = Launch(splits=(split_o, split_d), block_k=block_k, num_warps=8 if tokens > WIDE_TOKENS else 4)
    return launch._replace(blocks=(32, 64, 64, 64)) if H >= 2048 else launch


class Paged(NamedTuple):
    """A decode step's paged KV cache for `layer`: one layer's pools [blocks, block_size, Hkv, D] (V's
    strides K's, the last dimension contiguous), block_tables [T, max_blocks] (rows contiguous),
    context_lens [T] (the new token included) and slot_mapping [T] (the new token's flat slot)."""
    k_pool: torch.Tensor
    v_pool: torch.Tensor
    block_tables: torch.Tensor
    context_lens: torch.Tensor
    slot_mapping: torch.Tensor
    num_splits: int | None = None  # context splits of the attention; None: `paged_attention.choose_num_splits`


def _e4m3(w, dtype: torch.dtype) -> bool:
    """Whether w is an `FP8Weight` the kernel takes for activations of `dtype`: contiguous e4m3 data
    and one fp32 scale per row."""
    return (isinstance(w, FP8Weight) and w.dtype == dtype and w.data.dtype == FP8 and w.data.is_contiguous()
            and w.scale.dtype == torch.float32 and w.scale.is_contiguous() and w.scale.numel() == w.data.size(0))


def _unwrap_weights(x, qkv_w, o_w, gate_up_w, down_w):
    """The four projections' weight tensors, and their scales: None for plain weights, or the fp32
    [1, N] per-row scales of e4m3 `FP8Weight`s (all four of one kind)."""
    ws = (qkv_w, o_w, gate_up_w, down_w)
    if not any(isinstance(w, FP8Weight) for w in ws):
        return (*ws, None)
    assert all(_e4m3(w, x.dtype) for w in ws), \
        "persistent_layer: e4m3 weights for all four projections or none, scaled for the activations' dtype"
    return (*(w.data for w in ws), tuple(w.scale for w in ws))


def choose_launch(H: int, HO: int, I: int, tokens: int, device: torch.device, elem: int,
                  fp8: bool = False) -> Launch | None:
    """`launch_for` the sizes if its GEMM pipelines fit this device's shared memory (`_fits`); with
    fp8 (e4m3 weights), the bf16 launch where FP8_BLOCK_K's does not fit; else None.

    On Hopper, up to 64 token rows (the sizes measured there: LocDiT and LocEnc at a lone request's
    buckets, the LM's rows; benchmarks/kernel_fused_layer.py, kernel_lm_layer.py, engine_loop.py):
    each program asks L2 for its next GEMM item's first K tiles before the barrier (`Launch.prefetch`:
    with 16-bit weights two for LocDiT/LocEnc and one for the LM's wider layers, with e4m3 one
    everywhere, measured at the LM's 1 row and 22-44 local tokens). With 16-bit weights, below 64
    rows the products are also swapped (`Launch.swap`: from 64 rows the tokens' own tile takes
    wgmma), and gate/up items are narrowed where their tiles are fewer than the programs
    (`Launch.balance`: the LM's). e4m3 products keep neither: swapped, the LM's layer was slower and
    LocDiT's no faster; balanced, the LM's layer was slower."""
    block_m, smem = max(16, _next_pow2(tokens)), _smem(device)
    for launch in (launch_for(H, HO, I, tokens, fp8=True), launch_for(H, HO, I, tokens)) if fp8 else \
            (launch_for(H, HO, I, tokens),):
        if launch is not None and _fits(launch, smem, block_m, elem, 1 if fp8 else elem):
            if not _hopper_few_rows(device, block_m, 64):
                return launch
            if fp8:
                return launch._replace(prefetch=1)
            return launch._replace(swap=block_m < 64, prefetch=1 if H >= 2048 else 2, balance=True)
    return None


def _hopper_few_rows(device: torch.device, block_m: int, most: int) -> bool:
    """Hopper (warpgroup MMA), at most `most` token rows in the products' tile: where the launches
    were tuned for a few tokens (`choose_launch`) and stacks measured faster (`stacks`)."""
    return warpgroup_mma(device) and block_m <= most


def layer(x, norm1_w, qkv_w, cos, sin, seq_len: int, heads: tuple, o_w, norm2_w, gate_up_w, down_w,
          eps: float, launch: Launch | None = None, timings: torch.Tensor | None = None,
          programs: int | None = None, paged: Paged | None = None, h_in: torch.Tensor | None = None,
          next_norm: torch.Tensor | None = None, _stack: tuple | None = None):
    """One decoder layer over x [T, hidden] (T <= MAX_TOKENS); heads: (Hq, Hkv, head_dim).

    Local (paged None): T tokens are sequences of seq_len, attending within their sequence; cos, sin:
    [seq_len, head_dim] fp32 RoPE tables in rotate-half form, whose first half alone is read
    (`kernels.local_attention`), or None.
    Paged: T decode rows (seq_len 1), each its request's new token, attending to its cache, where
    the layer writes its K/V (`Paged`); cos, sin: [T, head_dim], each row's position (both halves
    read), or None.
    qkv_w, o_w, gate_up_w, down_w: tensors of x's dtype, or all four e4m3 `kernels.fp8.FP8Weight`s
    (weight-only: bf16 activations times the e4m3 weights, each output column's fp32 sum scaled by
    its row's scale, then rounded as a plain weight's).

    launch: tiles and splits (`Launch`), by default `choose_launch`'s for the sizes. timings: an int64 CUDA
    tensor of [programs, TIM_COLS] that gets each program's start (TIM_START), end (TIM_END), and per
    barrier k its arrival (2k) and exit (2k + 1), in ns of the GPU's global timer
    (benchmarks/kernel_fused_layer.py). programs: fewer programs than work items (tests: each program
    then takes several).

    h_in: rms_norm(x) with norm1_w, as a previous call's next_norm made it (phase 0 is skipped).
    next_norm: the next layer's input norm weight: returns (out, rms_norm(out) with it), the next
    call's h_in; otherwise out.
    _stack: (offsets, n_layers) from `stack`, whose layer 0 the weights are."""
    if not HAVE_TRITON:
        raise RuntimeError("triton is not installed")
    n_heads, n_kv, head_dim = heads
    T, H = x.shape
    qkv_w, o_w, gate_up_w, down_w, scales = _unwrap_weights(x, qkv_w, o_w, gate_up_w, down_w)
    I = down_w.size(1)
    HO = n_heads * head_dim
    launch = launch or choose_launch(H, HO, I, T, x.device, x.element_size(), fp8=scales is not None)
    assert launch is not None, f"no persistent_layer launch for hidden {H}, attention {HO}, FFN {I}"
    bn_qkv, bn_o, bn_gu, bn_d = launch.blocks
    split_o, split_d = launch.splits
    block_k, attn_heads = launch.block_k, launch.attn_heads
    assert 1 <= T <= MAX_TOKENS, f"persistent_layer over {T} tokens (1..{MAX_TOKENS})"
    assert head_dim % 2 == 0 and n_heads % n_kv == 0
    nqkv = (n_heads + 2 * n_kv) * head_dim
    assert qkv_w.shape == (nqkv, H) and o_w.shape == (H, HO), (qkv_w.shape, o_w.shape)
    assert gate_up_w.shape == (2 * I, H) and down_w.shape == (H, I), (gate_up_w.shape, down_w.shape)
    assert H % block_k == 0 and HO % (split_o * block_k) == 0 and I % (split_d * block_k) == 0, \
        (H, HO, I, launch)
    x = x.contiguous()
    dev, dt = x.device, x.dtype
    has_rope = cos is not None
    d_pad = max(16, _next_pow2(head_dim))  # D_PAD: the attention's head tiles
    if paged is None:
        assert T % seq_len == 0, f"{T} tokens are not whole sequences of {seq_len}"
        assert seq_len <= local_attention.MAX_SEQ and (n_heads // n_kv) % attn_heads == 0, (seq_len, attn_heads)
        rope_rows, attn_items, splits, block_size, att_n = seq_len, (T // seq_len) * (n_heads // attn_heads), 1, 1, 16
        cache = (x,) * 8 + (0, 0, 0, 0, 1)  # no cache
    else:
        assert seq_len == 1, "paged: one new token per row"
        kp, vp, bt, ctx, slots = paged.k_pool, paged.v_pool, paged.block_tables, paged.context_lens, paged.slot_mapping
        assert kp.shape == vp.shape and kp.dim() == 4 and kp.shape[2:] == (n_kv, head_dim), (kp.shape, vp.shape)
        assert kp.stride() == vp.stride() and kp.stride(3) == 1 and kp.dtype == vp.dtype == dt
        assert bt.shape[0] == ctx.shape[0] == slots.shape[0] == T and bt.stride(1) == 1, (bt.shape, ctx.shape)
        block_size, att_n = kp.size(1), 64 if head_dim <= 128 else 32
        # The standalone kernel's split count (the same work items; measured in benchmarks/kernel_lm_layer.py)
        splits = paged.num_splits or paged_attention.choose_num_splits(T, n_kv, bt.size(1) * block_size, att_n, dev)
        assert splits >= 1 and splits & (splits - 1) == 0, splits
        rope_rows, attn_items = T, T * n_kv * splits
        parts = (x, x, x)  # the splits' partial softmaxes, merged in phase 3
        if splits > 1:
            m = torch.empty(T * n_heads * splits, device=dev, dtype=torch.float32)
            parts = (m, torch.empty_like(m), torch.empty(m.numel() * d_pad, device=dev, dtype=torch.float32))
        cache = (kp, vp, bt, ctx, slots, *parts, *kp.stride()[:3], bt.stride(0), bt.size(1))
    if has_rope:
        assert cos.shape == sin.shape == (rope_rows, head_dim) and cos.dtype == sin.dtype == torch.float32
        cos, sin = cos.contiguous(), sin.contiguous()
    empty = lambda *s: torch.empty(*s, device=dev, dtype=dt)  # noqa: E731
    out, qkv, attn, x1, act = empty(T, H), empty(T, nqkv), empty(T, HO), empty(T, H), empty(T, I)
    h2 = empty(T, H)  # the second norm's (h_in, when given, is only read)
    if h_in is not None:
        assert h_in.shape == x.shape and h_in.dtype == dt, (h_in.shape, x.shape)
        h = h_in.contiguous()
    else:
        h = empty(T, H)
    if next_norm is not None:
        assert next_norm.shape == norm1_w.shape and next_norm.dtype == norm1_w.dtype, next_norm.shape
        next_norm = next_norm.contiguous()
    offsets, n_layers = _stack or (x, 0)
    assert not n_layers or (h_in is None and next_norm is not None and timings is None and paged is None)
    # A stack's layers each write the next one's h' into h: h is read in QKV only, barriers before the next write.
    hn = h if n_layers else empty(T, H) if next_norm is not None else h2
    first = 0 if h_in is None else 1
    part = torch.empty(max(split_o, split_d) * T * H, device=dev, dtype=torch.float32)
    work = max(-(-nqkv // bn_qkv), -(-H // bn_o) * split_o, -(-I // bn_gu), -(-H // bn_d) * split_d, T, attn_items,
               T * n_heads if splits > 1 else 1)
    if programs is not None:
        assert 1 <= programs, programs
        work = min(work, programs)
    grid = work if _INTERPRETED else _programs(dev, work)  # the interpreter runs a program per item
    c_gu = _columns(I, bn_gu, grid, launch.balance)
    upcast = _INTERPRETED or dt == torch.float32
    block_m, smem = max(16, _next_pow2(T)), _smem(dev)
    elem, w_elem = x.element_size(), qkv_w.element_size()
    stages = lambda bn, k_len, gated=False: _stages(launch, smem, block_m, bn, k_len, gated, elem, w_elem)  # noqa: E731
    lines = lambda k_len: 0 if _INTERPRETED else _prefetch_lines(launch, k_len, w_elem)  # noqa: E731
    common = dict(
        H=H, H_PAD=_next_pow2(H), I=I, HQ=n_heads, HKV=n_kv, D=head_dim, HALF=head_dim // 2,
        HALF_PAD=max(16, _next_pow2(head_dim // 2)), S_PAD=max(16, _next_pow2(seq_len)), HEADS=attn_heads,
        HAS_ROPE=has_rope, PAGED=paged is not None, BLOCK_SIZE=block_size, ATT_N=att_n,
        G_PAD=max(16, _next_pow2(n_heads // n_kv)), D_PAD=d_pad, ATT_SPLITS=splits,
        BLOCK_M=block_m, BN_QKV=bn_qkv, BN_O=bn_o, BN_GU=bn_gu, BN_D=bn_d, SPLIT_O=split_o, SPLIT_D=split_d,
        BLOCK_K=block_k, ST_QKV=stages(bn_qkv, H), ST_O=stages(bn_o, HO // split_o), ST_GU=stages(bn_gu, H, True),
        ST_D=stages(bn_d, I // split_d), UPCAST=upcast, PRECISION="ieee" if upcast else "tf32",
        TIMING=timings is not None and not _INTERPRETED, NEXT_NORM=next_norm is not None, W_FP8=scales is not None,
        SWAP=launch.swap, PF_QKV=lines(H), PF_O=lines(HO // split_o), PF_GU=lines(H), PF_D=lines(I // split_d),
        C_GU=c_gu, num_warps=launch.num_warps)
    args = (x, norm1_w, qkv_w, cos if has_rope else x, sin if has_rope else x, o_w, norm2_w, gate_up_w, down_w,
            *(scales or (x,) * 4), out, h, qkv, attn, x1, act, part, _sync(dev),
            timings if timings is not None else x, h2, next_norm if next_norm is not None else norm2_w, hn, *cache[:8],
            offsets, T, seq_len, eps, 1.4426950408889634 / math.sqrt(head_dim), *cache[8:])
    if _INTERPRETED:  # programs run one after another: a launch per phase (and layer)
        for lay in range(max(1, n_layers)):  # a stack's layers one at a time (LAYERS=1 from layer0)
            for phase in range(first if lay == 0 else 1, PHASES):
                _layer_kernel[(grid,)](*args, layer0=lay, n_layers=n_layers, FIRST=phase, LAST=phase,
                                       GRID_SYNC=False, LAYERS=min(1, n_layers), **common)
    else:
        assert timings is None or (timings.dtype == torch.int64 and timings.is_contiguous()
                                   and timings.shape[0] >= grid and timings.shape[1] == TIM_COLS), \
            f"timings must be int64 [>= {grid}, {TIM_COLS}]"
        _layer_kernel[(grid,)](*args, layer0=0, n_layers=n_layers, FIRST=first, LAST=PHASES - 1, GRID_SYNC=True,
                               LAYERS=n_layers, **common)
    return (out, hn) if next_norm is not None else out


# (device, dtype, the stack's pointers) -> its offsets table, or None where they are not aligned for
# it. Never evicted: a captured CUDA graph reads its table at the address it had at capture.
_OFFSETS: dict = {}
ALIGN = 16  # elements: every stack tensor's offset from the first layer's a multiple (`tl.multiple_of`)


def _columns_of(w: tuple) -> list:
    """A stack layer's (n1, qkv, o, n2, gate_up, down) as its table row's tensors (STACK_COLS): the
    QKV, output, gate/up and down weights (e4m3: their data), the two norms, and the four e4m3
    weights' scales (None for 16-bit weights)."""
    mats = (w[1], w[2], w[4], w[5])
    return [*(m.data if isinstance(m, FP8Weight) else m for m in mats), w[0], w[3],
            *(m.scale if isinstance(m, FP8Weight) else None for m in mats)]


def _element_offset(t: torch.Tensor, t0: torch.Tensor, align: int) -> int | None:
    """t's offset from t0 in t's elements, or None where it is not a multiple of `align` of them."""
    d, e = t.data_ptr() - t0.data_ptr(), t.element_size()
    return d // e if d % (align * e) == 0 else None


def _offsets(ws: list, final_norm: torch.Tensor) -> torch.Tensor | None:
    """The stack's table for `_layer_kernel`: per layer (and a last row for the final norm) the
    offsets of its tensors from layer 0's, in each one's elements (`_columns_of`); None if a weight's
    or norm's is not a multiple of ALIGN (the kernel's vector loads and pipelines assume it). A pure
    function of the pointers, so cached by them: made on the first call, outside any CUDA graph
    capture."""
    cols = [_columns_of(w) for w in ws]
    key = (final_norm.device, final_norm.dtype, final_norm.data_ptr(),
           *(t.data_ptr() for row in cols for t in row if t is not None))
    if key in _OFFSETS:
        return _OFFSETS[key]
    # weights and norms ALIGN elements apart (`tl.multiple_of`); the scales, only whole elements
    rows = [[0 if t is None else _element_offset(t, t0, ALIGN if j < 6 else 1)
             for j, (t, t0) in enumerate(zip(row, cols[0]))] for row in cols]
    rows.append([0] * 4 + [_element_offset(final_norm, ws[0][0], ALIGN)] + [0] * (STACK_COLS - 5))  # the final norm
    if any(c is None for row in rows for c in row):
        _OFFSETS[key] = None
        return None
    if final_norm.is_cuda and torch.cuda.is_current_stream_capturing():
        raise RuntimeError("persistent_layer.stack: call it with these weights before capturing a CUDA graph")
    tab = _OFFSETS[key] = torch.tensor(rows, dtype=torch.int64, device=final_norm.device)
    return tab


def _like(t, t0, dtype: torch.dtype) -> bool:
    """t like t0 (a stack's weight against the first layer's): a contiguous tensor of dtype and
    t0's shape, or where t0 is an e4m3 `FP8Weight`, one the kernel takes (`_e4m3`) of its shape."""
    if isinstance(t0, FP8Weight):
        return isinstance(t, FP8Weight) and _e4m3(t, dtype) and t.data.shape == t0.data.shape
    return isinstance(t, torch.Tensor) and t.dtype == dtype and t.is_contiguous() and t.shape == t0.shape


def _uniform(layers: list, final_norm, dtype: torch.dtype) -> bool:
    """Six weights per layer, each like the first layer's, its four projections all 16-bit or all
    e4m3 and its norms tensors, and a final norm like its input norm."""
    if not (len(layers) > 0 and all(len(w) == 6 for w in layers)):
        return False
    first = layers[0]
    fp8 = isinstance(first[1], FP8Weight)
    return (all(isinstance(first[j], FP8Weight) == fp8 for j in (2, 4, 5))
            and isinstance(first[0], torch.Tensor) and isinstance(first[3], torch.Tensor)
            and all(_like(t, t0, dtype) for w in layers for t, t0 in zip(w, first))
            and _like(final_norm, first[0], dtype))


def stack(x, layers: list, final_norm: torch.Tensor, cos, sin, seq_len: int, heads: tuple, eps: float,
          launch: Launch | None = None):
    """Decoder layers one after another over x [T, hidden] in one launch (local attention, as `layer`
    without paged): layers, per layer (norm1_w, qkv_w, o_w, norm2_w, gate_up_w, down_w), all of x's
    dtype (or the four projections e4m3 `FP8Weight`s for it, in every layer), each the shape of the
    first layer's -> (out, rms_norm(out) with final_norm). A grid-wide
    barrier between layers replaces the launch, and each layer's last phase asks L2 for the next
    one's first QKV tiles. Tensors not ALIGN elements apart from the first layer's run as the same
    layers chained, a launch each (the same results)."""
    ws = [tuple(w) for w in layers]
    if not _uniform(ws, final_norm, x.dtype):
        raise ValueError("persistent_layer.stack: six tensors per layer, each contiguous, of x's dtype (or all four "
                         "projections e4m3 in every layer) and the first layer's shape, and a final norm the shape "
                         "of its input norm")
    tab = _offsets(ws, final_norm)
    if tab is None:
        h, normed = x, None
        for i, w in enumerate(ws):
            nxt = ws[i + 1][0] if i + 1 < len(ws) else final_norm
            h, normed = layer(h, w[0], w[1], cos, sin, seq_len, heads, *w[2:], eps, launch=launch, h_in=normed,
                              next_norm=nxt)
        return h, normed
    n1, qkv, o, n2, gu, d = ws[0]
    return layer(x, n1, qkv, cos, sin, seq_len, heads, o, n2, gu, d, eps, launch=launch, next_norm=final_norm,
                 _stack=(tab, len(ws)))


def phase_times(timings: torch.Tensor) -> tuple[list, list, float]:
    """A `layer(timings=)` buffer read back -> (spans, waits, total), us: per phase its span (the
    previous barrier's first exit, or the first start, to this barrier's last arrival; the last phase
    to the last end), per barrier its wait (last arrival to last exit), and the first start to the last
    end. Only programs that ran count; barriers are those the first of them arrived at."""
    t = timings[timings[:, TIM_START] > 0].double().cpu()
    barriers = int((t[0, :TIM_START:2] > 0).sum())
    spans, waits, prev = [], [], t[:, TIM_START].min()
    for k in range(barriers):
        arrive, leave = t[:, 2 * k], t[:, 2 * k + 1]
        spans.append((arrive.max() - prev).item() / 1e3)
        waits.append((leave.max() - arrive.max()).item() / 1e3)
        prev = leave.min()
    spans.append((t[:, TIM_END].max() - prev).item() / 1e3)
    return spans, waits, (t[:, TIM_END].max() - t[:, TIM_START].min()).item() / 1e3


def runs(x: torch.Tensor, seq_len: int, heads: tuple, *weights, paged: bool = False) -> bool:
    """Whether `layer` takes this call: enabled (local layers, or with paged, LM decode layers),
    triton able to run here (on a GPU: 16-bit activations), few enough tokens, contiguous norm weights
    of the activations' dtype and projections all of that dtype too or all e4m3
    (`kernels.fp8.FP8Weight`s for it), and a launch for the sizes whose GEMM pipelines fit this GPU's
    shared memory."""
    n_heads, n_kv, head_dim = heads
    norm1_w, qkv_w, o_w, norm2_w, gate_up_w, down_w = weights
    plain = lambda w: isinstance(w, torch.Tensor) and w.dtype == x.dtype and w.is_contiguous()  # noqa: E731
    mats = (qkv_w, o_w, gate_up_w, down_w)
    fp8 = ENABLED_FP8 and all(_e4m3(w, x.dtype) for w in mats)
    if not ((ENABLED_LM if paged else ENABLED) and HAVE_TRITON
            and (_INTERPRETED or x.is_cuda and x.element_size() == 2)
            and x.size(0) <= (MAX_ROWS if paged else MAX_TOKENS)
            and (seq_len == 1 if paged else seq_len <= local_attention.MAX_SEQ)
            and plain(norm1_w) and plain(norm2_w) and (fp8 or all(plain(w) for w in mats))):
        return False
    return choose_launch(x.size(1), n_heads * head_dim, down_w.shape[1], x.size(0), x.device, x.element_size(),
                         fp8) is not None


def _fits(launch: Launch, smem: int, block_m: int, elem: int, w_elem: int) -> bool:
    """Whether two pipeline buffers (the fewest `_stages` gives) of the widest GEMM tile fit in shared
    memory beside the reserve: on GPUs with less of it than an H100, a kernel that does not fit
    would fail at its first launch, so `runs` leaves such layers to the compiled path."""
    bn_qkv, bn_o, bn_gu, bn_d = launch.blocks
    widest = max(bn_qkv, bn_o, 2 * bn_gu, bn_d)
    return 2 * launch.block_k * (elem * block_m + w_elem * widest) + SMEM_RESERVE <= smem


def stacks(x: torch.Tensor, seq_len: int, heads: tuple, layers: list, final_norm: torch.Tensor) -> bool:
    """Whether `stack` takes these layers: enabled (VOXCPM_FUSED_STACKS), each layer one that `runs`
    takes as `layer` (16-bit or e4m3 weights), all of the first one's shapes and kinds, where a stack
    was measured faster than the layers chained: on Hopper, at most 32 tokens (tiles under 64 rows:
    the 16-bit products swapped there; at 40 and 44 tokens it was slower, benchmarks/results.md).
    The interpreter (tests) stacks every size. torch.compile traces this, so it reads no pointers
    (their alignment is `stack`'s to check, inside the op) and keeps to what dynamo traces on the
    GPU machine's torch too (`len(layers) > 0`, not `bool(layers)`: torch 2.11 breaks the graph there)."""
    if not (ENABLED_STACKS and len(layers) > 0 and runs(x, seq_len, heads, *layers[0])
            and _uniform(layers, final_norm, x.dtype)):
        return False
    return _INTERPRETED or _hopper_few_rows(x.device, max(16, _next_pow2(x.size(0))), 32)


@torch.library.custom_op("voxcpm::local_stack", mutates_args=())
def local_stack_op(x: torch.Tensor, weights: list[torch.Tensor], final_norm: torch.Tensor, cos: torch.Tensor | None,
                   sin: torch.Tensor | None, seq_len: int, n_heads: int, n_kv: int, head_dim: int,
                   eps: float, scales: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """`stack`: weights, six per layer in `stack`'s order, flat -> (out, rms_norm(out) with final_norm).
    scales: none (16-bit weights), or the e4m3 projections' scales, four per layer (QKV, output,
    gate/up, down), whose weights are then their e4m3 data."""
    layers = [list(weights[i:i + 6]) for i in range(0, len(weights), 6)]
    if len(scales) > 0:
        assert len(scales) == 4 * len(layers), "scales: four per layer"
        for w, sc in zip(layers, (scales[i:i + 4] for i in range(0, len(scales), 4))):
            for j, s in zip((1, 2, 4, 5), sc):
                w[j] = FP8Weight(w[j], s, x.dtype)
    return stack(x, layers, final_norm, cos, sin, seq_len, (n_heads, n_kv, head_dim), eps)


@local_stack_op.register_fake
def _(x, weights, final_norm, cos, sin, seq_len, n_heads, n_kv, head_dim, eps, scales):
    return x.new_empty(x.shape), x.new_empty(x.shape)


@torch.library.custom_op("voxcpm::local_layer", mutates_args=())
def local_layer_op(x: torch.Tensor, norm1_w: torch.Tensor, qkv_w: torch.Tensor, cos: torch.Tensor | None,
                   sin: torch.Tensor | None, seq_len: int, n_heads: int, n_kv: int, head_dim: int,
                   o_w: torch.Tensor, norm2_w: torch.Tensor, gate_up_w: torch.Tensor, down_w: torch.Tensor,
                   eps: float, h_in: torch.Tensor | None = None, next_norm: torch.Tensor | None = None,
                   qkv_s: torch.Tensor | None = None, o_s: torch.Tensor | None = None,
                   gate_up_s: torch.Tensor | None = None,
                   down_s: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, the next layer's h_in; empty without next_norm). qkv_s ... down_s: the projections'
    e4m3 scales, whose weights are then their e4m3 data (all four or none)."""
    mats, scales = (qkv_w, o_w, gate_up_w, down_w), (qkv_s, o_s, gate_up_s, down_s)
    assert all(s is None for s in scales) or all(s is not None for s in scales), "scales: all four or none"
    if qkv_s is not None:
        mats = tuple(FP8Weight(w, s, x.dtype) for w, s in zip(mats, scales))
    res = layer(x, norm1_w, mats[0], cos, sin, seq_len, (n_heads, n_kv, head_dim), mats[1], norm2_w, *mats[2:],
                eps, h_in=h_in, next_norm=next_norm)
    return res if next_norm is not None else (res, x.new_empty(0))


@local_layer_op.register_fake
def _(x, norm1_w, qkv_w, cos, sin, seq_len, n_heads, n_kv, head_dim, o_w, norm2_w, gate_up_w, down_w, eps, h_in=None,
      next_norm=None, qkv_s=None, o_s=None, gate_up_s=None, down_s=None):
    return x.new_empty(x.shape), x.new_empty(x.shape if next_norm is not None else (0,))


class FusedLocalLayers(local_attention.FusedLocalAttention):
    """The fused attention backend (`kernels.local_attention`) that also takes whole layers: a
    `minicpm.DecoderLayer` offers each layer to `layer` first, which runs it here and returns the
    output and the next layer's h_in (or None), or returns None (`runs` says no): the layer then
    runs as before."""

    def layer(self, layer_idx, x, seq_len, rope, heads, norm1_w, qkv_w, o_w, norm2_w, gate_up_w, down_w, eps,
              h_in=None, next_norm=None):
        """(output, the next layer's h_in or None) as `layer` makes them (h_in, next_norm: as there), or None."""
        if not runs(x, seq_len, heads, norm1_w, qkv_w, o_w, norm2_w, gate_up_w, down_w):
            return None
        cos, sin = rope if rope is not None else (None, None)
        *mats, scales = _unwrap_weights(x, qkv_w, o_w, gate_up_w, down_w)  # the op takes e4m3 data and scales apart
        out, hn = local_layer_op(x, norm1_w, mats[0], cos, sin, seq_len, *heads, mats[1], norm2_w, *mats[2:], eps,
                                 h_in, next_norm, *(scales or (None,) * 4))
        return out, (hn if next_norm is not None else None)

    def stack(self, x, seq_len, rope, heads, layers, final_norm, eps):
        """(out, rms_norm(out) with final_norm) of all the layers (`layer`'s six weights each) in
        one launch, as `stack` makes them, or None (`stacks` says no): they then run one by one."""
        if not stacks(x, seq_len, heads, layers, final_norm):
            return None
        cos, sin = rope if rope is not None else (None, None)
        # the op takes e4m3 data and scales apart
        flat = [t.data if isinstance(t, FP8Weight) else t for w in layers for t in w]
        scales = [t.scale for w in layers for t in w if isinstance(t, FP8Weight)]
        return local_stack_op(x, flat, final_norm, cos, sin, seq_len, *heads, eps, scales)


fused_local_layers = FusedLocalLayers()
