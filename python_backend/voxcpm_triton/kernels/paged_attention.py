"""Paged decode attention as a Triton kernel: the GPU twin of `engine.attention.paged_decode_attention`.

Same inputs and result as the PyTorch version:
    q            [B, 1, Hq, D]
    k/v pools    [num_blocks, block_size, Hkv, D]   (one layer)
    block_tables [B, max_blocks] int (padding never read: only the entries covering each context)
    context_lens [B]             tokens incl. the new one
    -> [B, 1, Hq, D] in q's dtype; query head h attends with kv head h // (Hq // Hkv), scale 1/sqrt(D),
       softmax in fp32.

One program per (request, kv head, split): it takes the whole query group (Hq/Hkv heads, padded to 16
rows for tl.dot) against BLOCK_N tokens at a time, gathered through the block table (so any block size
works, including 4 and 8, which are below tl.dot's minimum), with an online softmax in fp32. Tokens
at or past the context are never loaded. When B * Hkv is too small to fill the GPU the context is
split over several programs (split-K) and a second small kernel merges their partial softmaxes.

new_kv=(k, v, slot_mapping) ([B, 1, Hkv, D] twice, [B] flat slots): the step's new token, written
into the pools here (by each (request, kv head)'s first split) and used in place of the pool's slot
for position context_len - 1 (so no program waits for the write): `engine.attention.write_kv` and the
attention in one launch, where they were two scatters and the kernel. Only for rows that attend to no
other row's new token (decode: one token per request; not a packed prefill's rows).

The kernels' bodies are jit functions (`write_new_kv`, `attend_split`, `merge_split_row`, and
`qkv_row_attend`, which also applies RoPE from a packed QKV row) that `kernels.persistent_layer` runs
as the attention phases of an LM decode layer.

CUDA graphs: the launch grid and every allocation depend only on shapes (B, Hq, Hkv, D, the block
table's width) and the split count, which is chosen on the host from those shapes alone; loop bounds
come from context_lens, read inside the kernel. No host sync. Compile once (call it eagerly with the
same shapes and dtypes) before capturing.

`benchmarks/kernel_paged_attention.py` (on a CUDA machine) times it against the PyTorch version.
"""

from __future__ import annotations

import math

import torch

from ._triton import HAVE_TRITON as _HAVE_TRITON
from ._triton import available, interpreted, sm_count, tl, triton
from ._triton import next_pow2 as _next_pow2

__all__ = ["available", "paged_decode_attention_triton", "choose_num_splits"]

_MAX_SPLITS = 16


def choose_num_splits(batch: int, kv_heads: int, max_tokens: int, block_n: int, device: torch.device) -> int:
    """Split-K count from shapes only (so it is fixed for a captured graph): enough programs to give
    every SM one, never more splits than BLOCK_N tiles in the table's width, a power of 2 <= 16.
    (Tuned at VoxCPM2's shapes, bf16, Hq 16 / Hkv 2 / D 128, against the best split count for
    every batch: benchmarks/kernel_paged_attention.py.)"""
    if device.type != "cuda":
        return 1
    programs = batch * kv_heads
    sms = sm_count(device)
    if programs >= sms:
        return 1
    max_tiles = max(1, -(-max_tokens // block_n))
    return max(1, min(_MAX_SPLITS, _next_pow2(-(-sms // programs)), _next_pow2(max_tiles)))


if _HAVE_TRITON:

    @triton.jit
    def write_new_kv(k_new, v_new, k_ptr, v_ptr, slot_ptr, b, kvh, offs_d, d_mask,
                     stride_kb, stride_kt, stride_kh, stride_kd, stride_vb, stride_vt, stride_vh, stride_vd,
                     BLOCK_SIZE: tl.constexpr):
        """Row b's new K/V ([D_PAD] each) of kv head kvh into its flat slot slot_ptr[b]."""
        slot = tl.load(slot_ptr + b).to(tl.int64)
        blk, off = slot // BLOCK_SIZE, slot % BLOCK_SIZE
        tl.store(k_ptr + blk * stride_kb + off * stride_kt + kvh * stride_kh + offs_d * stride_kd,
                 k_new.to(k_ptr.dtype.element_ty), mask=d_mask)
        tl.store(v_ptr + blk * stride_vb + off * stride_vt + kvh * stride_vh + offs_d * stride_vd,
                 v_new.to(v_ptr.dtype.element_ty), mask=d_mask)

    @triton.jit
    def attend_split(q, k_new, v_new, k_ptr, v_ptr, bt_ptr, ctx_ptr, out_ptr, m_ptr, l_ptr, acc_ptr,
                     b, kvh, split, stride_kb, stride_kt, stride_kh, stride_kd, stride_vb, stride_vt, stride_vh,
                     stride_vd, stride_btb, stride_btn, stride_ob, stride_oh, stride_od, max_blocks, qk_scale,
                     Hq: tl.constexpr, G: tl.constexpr, D: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                     G_PAD: tl.constexpr, D_PAD: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr,
                     PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr, NEW_KV: tl.constexpr,
                     CACHE: tl.constexpr):
        """Request b's query group of kv head kvh (q: [G_PAD, D_PAD]) over its split of the context:
        the output (one split), or the split's partial softmax (m, l, acc) for `merge_split_row`.
        NEW_KV: position context_len - 1 is k_new/v_new ([D_PAD]), whatever its slot holds. Also a
        phase of `kernels.persistent_layer`'s, where the pools were written by the same launch:
        CACHE ".cg", past L1."""
        offs_g = tl.arange(0, G_PAD)
        offs_d = tl.arange(0, D_PAD)
        offs_n = tl.arange(0, BLOCK_N)
        g_mask = offs_g < G
        d_mask = offs_d < D
        heads = kvh * G + offs_g  # query heads of this group

        ctx_in = tl.load(ctx_ptr + b).to(tl.int32)
        # Tokens past the table's width do not exist in the reference either.
        ctx = tl.minimum(ctx_in, max_blocks * BLOCK_SIZE)
        n_tiles = tl.cdiv(ctx, BLOCK_N)
        tiles_per_split = tl.cdiv(n_tiles, NUM_SPLITS)
        tile_lo = split * tiles_per_split
        tile_hi = tl.minimum(tile_lo + tiles_per_split, n_tiles)

        m_i = tl.full([G_PAD], float("-inf"), tl.float32)
        l_i = tl.zeros([G_PAD], tl.float32)
        acc = tl.zeros([G_PAD, D_PAD], tl.float32)

        bt_row = bt_ptr + b * stride_btb
        k_head = k_ptr + kvh * stride_kh
        v_head = v_ptr + kvh * stride_vh
        for tile in range(tile_lo, tile_hi):
            tok = tile * BLOCK_N + offs_n
            t_mask = tok < ctx
            blk = tl.load(bt_row + (tok // BLOCK_SIZE) * stride_btn, mask=t_mask, other=0).to(tl.int64)
            slot = tok % BLOCK_SIZE
            kv_mask = t_mask[:, None] & d_mask[None, :]
            k = tl.load(k_head + blk[:, None] * stride_kb + slot[:, None] * stride_kt + offs_d[None, :] * stride_kd,
                        mask=kv_mask, other=0.0, cache_modifier=CACHE)
            v = tl.load(v_head + blk[:, None] * stride_vb + slot[:, None] * stride_vt + offs_d[None, :] * stride_vd,
                        mask=kv_mask, other=0.0, cache_modifier=CACHE)
            if NEW_KV:  # its slot may not be written yet: the value itself
                is_new = (tok == ctx_in - 1)[:, None]
                k = tl.where(is_new, k_new[None, :].to(k.dtype), k)
                v = tl.where(is_new, v_new[None, :].to(v.dtype), v)

            qd = q.to(k.dtype)
            if DOT_UPCAST:  # interpreter: its tl.dot multiplies bf16 as raw uint16, so go through fp32
                qd = qd.to(tl.float32)
                k = k.to(tl.float32)
                v = v.to(tl.float32)
            s = tl.dot(qd, tl.trans(k), input_precision=PRECISION) * qk_scale  # [G_PAD, BLOCK_N]
            s = tl.where(t_mask[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))  # finite: every tile has a live token
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            if DOT_UPCAST:
                pd = p.to(v_ptr.dtype.element_ty).to(tl.float32)  # same rounding as the compiled path
            else:
                pd = p.to(v.dtype)
            acc = acc * alpha[:, None] + tl.dot(pd, v, input_precision=PRECISION)
            m_i = m_new

        if NUM_SPLITS == 1:
            out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # empty context -> 0, like SDPA's safe softmax
            tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :] * stride_od,
                     out.to(out_ptr.dtype.element_ty), mask=g_mask[:, None] & d_mask[None, :])
        else:
            # partials: m/l [B, Hq, NUM_SPLITS], acc [B, Hq, NUM_SPLITS, D_PAD] (contiguous fp32)
            row = (b * Hq + heads) * NUM_SPLITS + split
            tl.store(m_ptr + row, m_i, mask=g_mask)
            tl.store(l_ptr + row, l_i, mask=g_mask)
            tl.store(acc_ptr + row[:, None] * D_PAD + offs_d[None, :], acc, mask=g_mask[:, None])

    @triton.jit
    def merge_split_row(m_ptr, l_ptr, acc_ptr, out_ptr, bh, stride_ob, stride_oh, stride_od,
                        Hq: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr, NUM_SPLITS: tl.constexpr,
                        CACHE: tl.constexpr):
        """Query head bh % Hq of request bh // Hq: its splits' partial softmaxes merged, to out."""
        b = bh // Hq
        h = bh % Hq
        offs_s = tl.arange(0, NUM_SPLITS)
        offs_d = tl.arange(0, D_PAD)
        m = tl.load(m_ptr + bh * NUM_SPLITS + offs_s, cache_modifier=CACHE)
        l = tl.load(l_ptr + bh * NUM_SPLITS + offs_s, cache_modifier=CACHE)
        acc = tl.load(acc_ptr + (bh * NUM_SPLITS + offs_s)[:, None] * D_PAD + offs_d[None, :], cache_modifier=CACHE)
        m_max = tl.max(m, axis=0)
        m_max = tl.where(m_max == float("-inf"), 0.0, m_max)  # all splits empty (context 0)
        w = tl.exp2(m - m_max)  # empty splits: exp2(-inf) = 0
        l_tot = tl.sum(l * w, axis=0)
        out = tl.sum(acc * w[:, None], axis=0) / tl.where(l_tot > 0, l_tot, 1.0)
        tl.store(out_ptr + b * stride_ob + h * stride_oh + offs_d * stride_od,
                 out.to(out_ptr.dtype.element_ty), mask=offs_d < D)

    @triton.jit
    def qkv_row_attend(qkv_ptr, cos_ptr, sin_ptr, k_ptr, v_ptr, bt_ptr, ctx_ptr, slot_ptr, out_ptr, m_ptr, l_ptr,
                       acc_ptr, b, kvh, split, stride_kb, stride_kt, stride_kh, stride_btb, max_blocks, qk_scale,
                       Hq: tl.constexpr, Hkv: tl.constexpr, D: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                       G_PAD: tl.constexpr, D_PAD: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr,
                       HAS_ROPE: tl.constexpr, PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr):
        """`attend_split` for decode row b straight from its packed QKV projection ([Hq + 2 Hkv] x D,
        contiguous): RoPE on the query group and the new key (cos/sin: [rows, D] fp32, row b's
        position; fp32, rounded to the input dtype, as `minicpm.apply_rope`), the new K/V written
        into their slot (first split), out [rows, Hq * D]. The pools' last dimension is contiguous
        and V's strides are K's. A phase of `kernels.persistent_layer`'s: loads skip L1 (".cg")."""
        G: tl.constexpr = Hq // Hkv
        HALF: tl.constexpr = D // 2
        dtype = qkv_ptr.dtype.element_ty
        offs_g = tl.arange(0, G_PAD)
        offs_d = tl.arange(0, D_PAD)
        d_mask = offs_d < D
        q_mask = (offs_g < G)[:, None] & d_mask[None, :]
        row = qkv_ptr + b * ((Hq + 2 * Hkv) * D)
        q_cols = (kvh * G + offs_g)[:, None] * D
        k_col = (Hq + kvh) * D
        q = tl.load(row + q_cols + offs_d[None, :], mask=q_mask, other=0.0, cache_modifier=".cg").to(tl.float32)
        k = tl.load(row + k_col + offs_d, mask=d_mask, other=0.0, cache_modifier=".cg").to(tl.float32)
        v = tl.load(row + (Hq + Hkv + kvh) * D + offs_d, mask=d_mask, other=0.0, cache_modifier=".cg")
        if HAS_ROPE:  # x * cos + rotate_half(x) * sin, rotate_half(x) = (-x2, x1)
            partner = tl.where(offs_d < HALF, offs_d + HALF, offs_d - HALF)
            sign = tl.where(offs_d < HALF, -1.0, 1.0)
            cos = tl.load(cos_ptr + b * D + offs_d, mask=d_mask, other=0.0)
            sin = tl.load(sin_ptr + b * D + offs_d, mask=d_mask, other=0.0)
            qp = tl.load(row + q_cols + partner[None, :], mask=q_mask, other=0.0, cache_modifier=".cg")
            kp = tl.load(row + k_col + partner, mask=d_mask, other=0.0, cache_modifier=".cg")
            q = q * cos[None, :] + (qp.to(tl.float32) * sign[None, :]) * sin[None, :]
            k = k * cos + (kp.to(tl.float32) * sign) * sin
        q, k = q.to(dtype), k.to(dtype)
        if split == 0:
            write_new_kv(k, v, k_ptr, v_ptr, slot_ptr, b, kvh, offs_d, d_mask, stride_kb, stride_kt, stride_kh, 1,
                         stride_kb, stride_kt, stride_kh, 1, BLOCK_SIZE)
        attend_split(q, k, v, k_ptr, v_ptr, bt_ptr, ctx_ptr, out_ptr, m_ptr, l_ptr, acc_ptr, b, kvh, split,
                     stride_kb, stride_kt, stride_kh, 1, stride_kb, stride_kt, stride_kh, 1, stride_btb, 1,
                     Hq * D, D, 1, max_blocks, qk_scale, Hq, G, D, BLOCK_SIZE, G_PAD, D_PAD, BLOCK_N, NUM_SPLITS,
                     PRECISION, DOT_UPCAST, True, ".cg")

    # The table's width is not specialized (== 1, divisible by 16): a packed prefill's rows meet
    # widths no start-up shape had, and each new class would compile under load.
    @triton.jit(do_not_specialize=["stride_btb", "max_blocks"])
    def _paged_decode_kernel(
        q_ptr, k_ptr, v_ptr, bt_ptr, ctx_ptr, out_ptr, m_ptr, l_ptr, acc_ptr, kn_ptr, vn_ptr, slot_ptr,
        stride_qb, stride_qh, stride_qd, stride_knb, stride_knh, stride_vnb, stride_vnh,
        stride_kb, stride_kt, stride_kh, stride_kd,
        stride_vb, stride_vt, stride_vh, stride_vd,
        stride_btb, stride_btn,
        stride_ob, stride_oh, stride_od,
        max_blocks, qk_scale,  # qk_scale = log2(e) / sqrt(D)
        Hq: tl.constexpr, G: tl.constexpr, D: tl.constexpr, BLOCK_SIZE: tl.constexpr,
        G_PAD: tl.constexpr, D_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
        NUM_SPLITS: tl.constexpr, PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr, NEW_KV: tl.constexpr,
    ):
        b = tl.program_id(0)
        kvh = tl.program_id(1)
        split = tl.program_id(2)
        offs_g = tl.arange(0, G_PAD)
        offs_d = tl.arange(0, D_PAD)
        d_mask = offs_d < D
        heads = kvh * G + offs_g
        q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :] * stride_qd,
                    mask=(offs_g < G)[:, None] & d_mask[None, :], other=0.0)
        k_new = tl.zeros([D_PAD], dtype=q.dtype)  # unused without NEW_KV
        v_new = tl.zeros([D_PAD], dtype=q.dtype)
        if NEW_KV:  # the new token (its last dimension contiguous), written once: by the first split
            k_new = tl.load(kn_ptr + b * stride_knb + kvh * stride_knh + offs_d, mask=d_mask, other=0.0)
            v_new = tl.load(vn_ptr + b * stride_vnb + kvh * stride_vnh + offs_d, mask=d_mask, other=0.0)
            if split == 0:
                write_new_kv(k_new, v_new, k_ptr, v_ptr, slot_ptr, b, kvh, offs_d, d_mask, stride_kb, stride_kt,
                             stride_kh, stride_kd, stride_vb, stride_vt, stride_vh, stride_vd, BLOCK_SIZE)
        attend_split(q, k_new, v_new, k_ptr, v_ptr, bt_ptr, ctx_ptr, out_ptr, m_ptr, l_ptr, acc_ptr, b, kvh, split,
                     stride_kb, stride_kt, stride_kh, stride_kd, stride_vb, stride_vt, stride_vh, stride_vd,
                     stride_btb, stride_btn, stride_ob, stride_oh, stride_od, max_blocks, qk_scale,
                     Hq, G, D, BLOCK_SIZE, G_PAD, D_PAD, BLOCK_N, NUM_SPLITS, PRECISION, DOT_UPCAST, NEW_KV, "")

    @triton.jit
    def _merge_splits_kernel(
        m_ptr, l_ptr, acc_ptr, out_ptr,
        stride_ob, stride_oh, stride_od,
        Hq: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr, NUM_SPLITS: tl.constexpr,
    ):
        merge_split_row(m_ptr, l_ptr, acc_ptr, out_ptr, tl.program_id(0), stride_ob, stride_oh, stride_od,
                        Hq, D, D_PAD, NUM_SPLITS, "")

    _INTERPRETED = interpreted(_paged_decode_kernel)
else:
    _INTERPRETED = False


def paged_decode_attention_triton(q, k_pool_layer, v_pool_layer, block_tables, context_lens, *,
                                  num_splits: int | None = None, block_n: int | None = None,
                                  num_warps: int = 4, out: torch.Tensor | None = None, new_kv: tuple | None = None):
    """q: [B, 1, Hq, D]; pools: [blocks, block_size, Hkv, D] -> [B, 1, Hq, D] (see the module doc).

    num_splits: split-K count (power of 2); None picks it from the shapes (1 off CUDA).
    block_n: tokens per inner step (power of 2 >= 16); None = 64 (32 for D > 128).
    out: optional preallocated [B, 1, Hq, D] result (any strides).
    new_kv: (k, v, slot_mapping), the new token's [B, 1, Hkv, D] K and V and [B] flat slots, written into
    the pools by the kernel (see the module doc); None: they are in the pools already."""
    if not _HAVE_TRITON:
        raise RuntimeError("triton is not installed")
    B, one, Hq, D = q.shape
    assert one == 1, "decode: one query token per request"
    nblk, bs, Hkv, Dk = k_pool_layer.shape
    assert v_pool_layer.shape == k_pool_layer.shape and Dk == D, (k_pool_layer.shape, v_pool_layer.shape, D)
    assert Hq % Hkv == 0, (Hq, Hkv)
    assert block_tables.dim() == 2 and block_tables.size(0) == B and context_lens.shape == (B,)
    G = Hq // Hkv
    max_blocks = block_tables.size(1)
    if block_n is None:
        block_n = 64 if D <= 128 else 32
    assert block_n >= 16 and block_n & (block_n - 1) == 0
    if num_splits is None:
        num_splits = choose_num_splits(B, Hkv, max_blocks * bs, block_n, q.device)
    assert num_splits >= 1 and num_splits & (num_splits - 1) == 0
    if out is None:
        out = torch.empty((B, 1, Hq, D), dtype=q.dtype, device=q.device)
    if B == 0:
        return out
    G_PAD = max(16, _next_pow2(G))
    D_PAD = max(16, _next_pow2(D))
    # Triton's CPU interpreter (TRITON_INTERPRET=1, 3.4-3.8) runs tl.dot on bf16 (kept as uint16) as integers: upcast there.
    dot_upcast = _INTERPRETED and k_pool_layer.dtype != torch.float32
    precision = "ieee" if k_pool_layer.dtype == torch.float32 or dot_upcast else "tf32"
    qk_scale = (1.0 / math.sqrt(D)) * 1.4426950408889634  # log2(e): softmax via exp2

    if num_splits > 1:
        m_part = torch.empty((B, Hq, num_splits), dtype=torch.float32, device=q.device)
        l_part = torch.empty_like(m_part)
        acc_part = torch.empty((B, Hq, num_splits, D_PAD), dtype=torch.float32, device=q.device)
    else:
        m_part = l_part = acc_part = out  # unused

    if new_kv is not None:
        k_new, v_new, slots = new_kv
        assert k_new.shape == v_new.shape == (B, 1, Hkv, D) and slots.shape == (B,), (k_new.shape, slots.shape)
        assert k_new.dtype == v_new.dtype == q.dtype and k_new.stride(3) == v_new.stride(3) == 1
        new_args = (k_new, v_new, slots, k_new.stride(0), k_new.stride(2), v_new.stride(0), v_new.stride(2))
    else:
        new_args = (q, q, context_lens, 0, 0, 0, 0)
    _paged_decode_kernel[(B, Hkv, num_splits)](
        q, k_pool_layer, v_pool_layer, block_tables, context_lens, out, m_part, l_part, acc_part, *new_args[:3],
        q.stride(0), q.stride(2), q.stride(3), *new_args[3:],
        *k_pool_layer.stride(), *v_pool_layer.stride(),
        block_tables.stride(0), block_tables.stride(1),
        out.stride(0), out.stride(2), out.stride(3),
        max_blocks, qk_scale,
        Hq=Hq, G=G, D=D, BLOCK_SIZE=bs, G_PAD=G_PAD, D_PAD=D_PAD, BLOCK_N=block_n,
        NUM_SPLITS=num_splits, PRECISION=precision, DOT_UPCAST=dot_upcast, NEW_KV=new_kv is not None,
        num_warps=num_warps,
    )
    if num_splits > 1:
        _merge_splits_kernel[(B * Hq,)](
            m_part, l_part, acc_part, out, out.stride(0), out.stride(2), out.stride(3),
            Hq=Hq, D=D, D_PAD=D_PAD, NUM_SPLITS=num_splits, num_warps=4 if D_PAD >= 128 else 1,
        )
    return out

