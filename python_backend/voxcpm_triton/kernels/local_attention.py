"""LocDiT/LocEnc attention as one Triton kernel: RoPE, grouped-query attention over a handful of
tokens, and the head layout, straight from the fused QKV projection's output.

The PyTorch path (`model.minicpm.local_attention` after `LayerMath.attention_inputs`) spends four or
five kernels per layer on this: RoPE on q and k, folding query heads into the sequence, flash
attention, unfolding. LocDiT runs its 12 layers 9 times per decode step, so at batch 1 those small
kernels are a large share of the step. Here it is one launch:

    qkv  [B * S, (Hq + 2 * Hkv) * D]   tokens of B sequences of S tokens each (S <= 64)
    cos, sin [S, D] fp32 or None       RoPE tables for positions 0..S-1 (every sequence starts at 0)
    ->   [B * S, Hq * D]               ready for the output projection

The tables are in rotate-half form, whose two halves repeat the same D/2 frequencies (as
`minicpm.LongRoPE` builds them): the kernel reads their first half only.

Same arithmetic as the PyTorch path: RoPE in fp32 rounded to the input dtype, scores and softmax in
fp32, probabilities rounded to the input dtype for the value product (as flash attention does),
non-causal, scale 1/sqrt(D). One program per (sequence, block of query heads sharing a KV head);
the query heads are stacked as rows so that one tl.dot covers them all.

It is registered as the custom op `voxcpm::local_attention`, so torch.compile keeps it as one opaque
call inside the compiled LocDiT/LocEnc graphs, and CUDA graphs capture it (the grid depends on
shapes only).
"""

from __future__ import annotations

import math

import torch

from ._triton import HAVE_TRITON as _HAVE_TRITON
from ._triton import available, interpreted, tl, triton  # noqa: F401 - available: callers ask it here
from ._triton import next_pow2 as _next_pow2

MAX_SEQ = 64  # whole sequences sit in registers; LocDiT has 11 tokens, LocEnc 5


if _HAVE_TRITON:

    @triton.jit
    def _local_attention_kernel(
        qkv_ptr, cos_ptr, sin_ptr, out_ptr,
        stride_tok, stride_out, S, qk_scale,  # qk_scale = log2(e) / sqrt(D)
        HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, HALF: tl.constexpr, HALF_PAD: tl.constexpr,
        S_PAD: tl.constexpr, HEADS: tl.constexpr, HAS_ROPE: tl.constexpr, DOT_UPCAST: tl.constexpr,
        PRECISION: tl.constexpr,
    ):
        attend(qkv_ptr, cos_ptr, sin_ptr, out_ptr, stride_tok, stride_out, S, qk_scale,
               tl.program_id(0), tl.program_id(1) * HEADS, HQ, HKV, D, HALF, HALF_PAD, S_PAD, HEADS, HAS_ROPE,
               DOT_UPCAST, PRECISION, "")

    @triton.jit
    def attend(qkv_ptr, cos_ptr, sin_ptr, out_ptr, stride_tok, stride_out, S, qk_scale, b, h0,
               HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, HALF: tl.constexpr, HALF_PAD: tl.constexpr,
               S_PAD: tl.constexpr, HEADS: tl.constexpr, HAS_ROPE: tl.constexpr, DOT_UPCAST: tl.constexpr,
               PRECISION: tl.constexpr, CACHE: tl.constexpr):
        """Sequence b's query heads h0 .. h0 + HEADS - 1 (the kernel's program; also a phase of
        `kernels.persistent_layer`'s, which reads qkv that other programs wrote: CACHE ".cg", past L1)."""
        kvh = h0 // (HQ // HKV)
        dtype = qkv_ptr.dtype.element_ty

        d = tl.arange(0, HALF_PAD)
        tok = tl.arange(0, S_PAD)
        mask = (tok < S)[:, None] & (d < HALF)[None, :]  # [S_PAD, HALF_PAD]: tokens x half a head
        rows = qkv_ptr + (b * S + tok)[:, None] * stride_tok + d[None, :]
        k_col = (HQ + kvh) * D
        v_col = (HQ + HKV + kvh) * D
        k1 = tl.load(rows + k_col, mask=mask, other=0.0, cache_modifier=CACHE).to(tl.float32)
        k2 = tl.load(rows + k_col + HALF, mask=mask, other=0.0, cache_modifier=CACHE).to(tl.float32)
        v1 = tl.load(rows + v_col, mask=mask, other=0.0, cache_modifier=CACHE)
        v2 = tl.load(rows + v_col + HALF, mask=mask, other=0.0, cache_modifier=CACHE)

        # RoPE in rotate-half form, in fp32: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin), rounded to the
        # input dtype as the PyTorch path stores roped q and k; cos, sin: the tables' first half.
        if HAS_ROPE:
            tab = tok[:, None] * D + d[None, :]
            cos = tl.load(cos_ptr + tab, mask=mask, other=0.0)
            sin = tl.load(sin_ptr + tab, mask=mask, other=0.0)
            k1, k2 = k1 * cos - k2 * sin, k2 * cos + k1 * sin
        k1, k2 = k1.to(dtype), k2.to(dtype)

        # Query heads as [HEADS, S_PAD, HALF_PAD], so that one load of the tables serves them all (a
        # table row per query row took registers enough to halve the programs an SM holds).
        hh = tl.arange(0, HEADS)
        q_ptrs = rows[None, :, :] + (h0 + hh)[:, None, None] * D
        q1 = tl.load(q_ptrs, mask=mask[None, :, :], other=0.0, cache_modifier=CACHE).to(tl.float32)
        q2 = tl.load(q_ptrs + HALF, mask=mask[None, :, :], other=0.0, cache_modifier=CACHE).to(tl.float32)
        if HAS_ROPE:
            cos, sin = cos[None, :, :], sin[None, :, :]
            q1, q2 = q1 * cos - q2 * sin, q2 * cos + q1 * sin
        # Row r of the stacked queries: head h0 + r // S_PAD, token r % S_PAD.
        q1 = tl.reshape(q1.to(dtype), (HEADS * S_PAD, HALF_PAD))
        q2 = tl.reshape(q2.to(dtype), (HEADS * S_PAD, HALF_PAD))
        if DOT_UPCAST:  # interpreter: its tl.dot multiplies bf16 (kept as uint16) as integers
            q1, q2, k1, k2 = q1.to(tl.float32), q2.to(tl.float32), k1.to(tl.float32), k2.to(tl.float32)
            v1, v2 = v1.to(tl.float32), v2.to(tl.float32)

        s = tl.dot(q1, tl.trans(k1), input_precision=PRECISION)
        s += tl.dot(q2, tl.trans(k2), input_precision=PRECISION)
        s = tl.where((tok < S)[None, :], s * qk_scale, float("-inf"))  # [rows, S_PAD]
        p = tl.exp2(s - tl.max(s, axis=1)[:, None])
        l = tl.sum(p, axis=1)
        p = p.to(dtype)
        if DOT_UPCAST:
            p = p.to(tl.float32)
        o1 = tl.dot(p, v1, input_precision=PRECISION) / l[:, None]
        o2 = tl.dot(p, v2, input_precision=PRECISION) / l[:, None]

        r = tl.arange(0, HEADS * S_PAD)
        q_tok = r % S_PAD
        q_head = h0 + r // S_PAD
        o_mask = (q_tok < S)[:, None] & (d < HALF)[None, :]
        o_ptrs = out_ptr + (b * S + q_tok)[:, None] * stride_out + q_head[:, None] * D + d[None, :]
        tl.store(o_ptrs, o1.to(out_ptr.dtype.element_ty), mask=o_mask)
        tl.store(o_ptrs + HALF, o2.to(out_ptr.dtype.element_ty), mask=o_mask)

    _INTERPRETED = interpreted(_local_attention_kernel)
else:
    _INTERPRETED = False


def heads_per_program(n_heads: int, n_kv: int) -> int:
    """Query heads stacked in one program (64 rows for LocDiT): 4, or the largest power of 2 (for
    tl.arange) that divides the group: 4 is the fastest at a few requests and within a few percent
    of the fastest at many, for both LocDiT and LocEnc (benchmarks/README.md)."""
    group = n_heads // n_kv
    return min(4, group & -group)


def _launch(qkv, cos, sin, seq_len: int, n_heads: int, n_kv: int, head_dim: int,
            heads: int | None = None, num_warps: int | None = None) -> torch.Tensor:
    if not _HAVE_TRITON:
        raise RuntimeError("triton is not installed")
    N, width = qkv.shape
    assert width == (n_heads + 2 * n_kv) * head_dim, (qkv.shape, n_heads, n_kv, head_dim)
    assert n_heads % n_kv == 0 and head_dim % 2 == 0 and N % seq_len == 0, (n_heads, n_kv, head_dim, N, seq_len)
    assert 1 <= seq_len <= MAX_SEQ, f"local attention over {seq_len} tokens (at most {MAX_SEQ})"
    assert qkv.stride(1) == 1
    has_rope = cos is not None
    if has_rope:
        assert cos.shape == sin.shape == (seq_len, head_dim) and cos.dtype == sin.dtype == torch.float32, \
            (cos.shape, cos.dtype, seq_len, head_dim)
        cos, sin = cos.contiguous(), sin.contiguous()
    n_seq = N // seq_len
    out = torch.empty((N, n_heads * head_dim), dtype=qkv.dtype, device=qkv.device)
    if N == 0:
        return out
    heads = heads or heads_per_program(n_heads, n_kv)
    s_pad = max(16, _next_pow2(seq_len))
    half = head_dim // 2
    dot_upcast = _INTERPRETED and qkv.dtype != torch.float32
    precision = "ieee" if qkv.dtype == torch.float32 or dot_upcast else "tf32"
    rows = heads * s_pad
    _local_attention_kernel[(n_seq, n_heads // heads)](
        qkv, cos if has_rope else qkv, sin if has_rope else qkv, out,
        qkv.stride(0), out.stride(0), seq_len, 1.4426950408889634 / math.sqrt(head_dim),
        HQ=n_heads, HKV=n_kv, D=head_dim, HALF=half, HALF_PAD=max(16, _next_pow2(half)), S_PAD=s_pad,
        HEADS=heads, HAS_ROPE=has_rope, DOT_UPCAST=dot_upcast, PRECISION=precision,
        num_warps=num_warps or (4 if rows >= 64 else 2),
    )
    return out


@torch.library.custom_op("voxcpm::local_attention", mutates_args=())
def local_attention_op(qkv: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None, seq_len: int,
                       n_heads: int, n_kv: int, head_dim: int) -> torch.Tensor:
    return _launch(qkv, cos, sin, seq_len, n_heads, n_kv, head_dim)


@local_attention_op.register_fake
def _(qkv, cos, sin, seq_len, n_heads, n_kv, head_dim):
    return qkv.new_empty((qkv.shape[0], n_heads * head_dim))


class FusedLocalAttention:
    """Attention backend for LocEnc/LocDiT that takes the packed QKV projection and RoPE tables
    (see `minicpm.DecoderLayer.forward`): `backend(layer_idx, qkv, seq_len, rope, heads)`."""

    packed_qkv = True

    def __call__(self, layer_idx, qkv, seq_len, rope, heads):
        n_heads, n_kv, head_dim = heads
        cos, sin = rope if rope is not None else (None, None)
        return local_attention_op(qkv, cos, sin, seq_len, n_heads, n_kv, head_dim)


