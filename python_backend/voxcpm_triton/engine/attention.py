"""Paged attention in plain PyTorch: the CPU path and the reference for GPU kernels.

A backend is bound to one pool (K and V tensors of one LM) and one batch's
metadata, and is called per layer as ``backend(layer, q, k, v)`` by MiniCPM:
it writes the new tokens' K/V into their slots, then attends. On the Triton path
a decode step's layers are first offered whole (``backend.layer``) to the
persistent layer kernel (`kernels.persistent_layer`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class DecodeMetadata:
    """One new token per request. slot_mapping: [B] flat slot (block * block_size + offset) of the
    new token; block_tables: [B, max_blocks] (padded with 0); context_lens: [B] tokens incl. the new one."""

    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    context_lens: torch.Tensor


@dataclass
class PrefillMetadata:
    """Several prompts' new positions packed into one sequence.
    slot_mapping: [S_total]; seq_starts: host list of offsets, len = n_prompts + 1.
    contexts: per prompt, None (it starts at position 0: it attends to its new positions only) or
    (start, block_table): its new positions are start, start+1, ... and attend causally to every
    position before them through block_table ([n_blocks] device, the prompt's blocks from
    position 0; start: an int, or a device tensor [1] inside a CUDA graph). None: all start at 0."""

    slot_mapping: torch.Tensor
    seq_starts: list
    contexts: list | None = None


@dataclass
class PrefillRowsMetadata:
    """Several prompts' new positions, each a query row of the paged decode kernel: its K/V are
    written first, then it attends causally through its prompt's block table. One launch per layer
    for every prompt of a packed prefill, whatever its cached prefix (the GPU path).
    slot_mapping: [N]; block_tables: [N, max_blocks] (padded with 0); context_lens: [N] = position + 1."""

    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    context_lens: torch.Tensor


def write_kv(k_pool, v_pool, layer, slots, k, v):
    """k, v: [B, S, H, D] -> scattered into the pool's flat slots."""
    H, D = k.shape[-2:]
    k_pool[layer].view(-1, H, D)[slots] = k.reshape(-1, H, D)
    v_pool[layer].view(-1, H, D)[slots] = v.reshape(-1, H, D)


def paged_decode_attention(q, k_pool_layer, v_pool_layer, block_tables, context_lens):
    """q: [B, 1, Hq, D]; pools: [blocks, block_size, Hkv, D] -> [B, 1, Hq, D]."""
    B, nb = block_tables.shape
    bs = k_pool_layer.size(1)
    keys = k_pool_layer[block_tables].reshape(B, nb * bs, *k_pool_layer.shape[2:])
    vals = v_pool_layer[block_tables].reshape(B, nb * bs, *v_pool_layer.shape[2:])
    mask = torch.arange(nb * bs, device=q.device)[None] < context_lens[:, None]
    out = F.scaled_dot_product_attention(q.transpose(1, 2), keys.transpose(1, 2), vals.transpose(1, 2),
                                         attn_mask=mask[:, None, None, :], enable_gqa=True)
    return out.transpose(1, 2)


def paged_prefill_attention(q, k_pool_layer, v_pool_layer, block_table, start):
    """q: [1, L, Hq, D], the queries of positions start .. start+L-1, whose K/V are in the pools
    already; block_table: [nb] blocks from position 0 -> [1, L, Hq, D], causal over the table."""
    nb, bs = block_table.numel(), k_pool_layer.size(1)
    keys = k_pool_layer[block_table].reshape(1, nb * bs, *k_pool_layer.shape[2:])
    vals = v_pool_layer[block_table].reshape(1, nb * bs, *v_pool_layer.shape[2:])
    L = q.size(1)
    mask = torch.arange(nb * bs, device=q.device)[None] <= (start + torch.arange(L, device=q.device))[:, None]
    out = F.scaled_dot_product_attention(q.transpose(1, 2), keys.transpose(1, 2), vals.transpose(1, 2),
                                         attn_mask=mask[None, None], enable_gqa=True)
    return out.transpose(1, 2)


def paged_prefill_attention_triton(q, k_pool_layer, v_pool_layer, block_table, start):
    """`paged_prefill_attention` on the paged decode kernel: query i is a decode row of its own
    with context start + i + 1 over the same table. Reads only the keys each query sees, and
    every size is fixed by L and the table's width (CUDA graphs)."""
    from ..kernels.paged_attention import paged_decode_attention_triton

    L = q.size(1)
    ctx = start + torch.arange(1, L + 1, device=q.device)
    out = paged_decode_attention_triton(q[0].unsqueeze(1), k_pool_layer, v_pool_layer,
                                        block_table.view(1, -1).expand(L, -1), ctx)
    return out.view(1, L, *out.shape[2:])


class PagedAttention:
    def __init__(self, k_pool, v_pool, meta, use_triton: bool = False):
        """use_triton: decode (and prefill after a cached prefix) with the Triton-language paged
        decode kernel (GPU) instead of the PyTorch gather."""
        self.k_pool, self.v_pool, self.meta = k_pool, v_pool, meta
        self.decode = self.prefill_rows = paged_decode_attention
        self.prefill_context = paged_prefill_attention
        self.decode_writes_kv = False
        if use_triton:
            from ..kernels.paged_attention import paged_decode_attention_triton

            self.decode, self.decode_writes_kv = paged_decode_attention_triton, True
            # one split whatever the rows: the kernel variant the start-up warm-up compiled
            self.prefill_rows = functools.partial(paged_decode_attention_triton, num_splits=1)
            self.prefill_context = paged_prefill_attention_triton

    def layer(self, layer, x, seq_len, rope, heads, norm1_w, qkv_w, o_w, norm2_w, gate_up_w, down_w, eps,
              h_in=None, next_norm=None):
        """A whole decoder layer of a decode step in one kernel (`kernels.persistent_layer`, which also
        writes the new K/V; h_in, next_norm: as there) -> (output, the next layer's h_in or None); or
        None: the layer runs op by op (`minicpm.DecoderLayer.forward`)."""
        m = self.meta
        if not (self.decode_writes_kv and isinstance(m, DecodeMetadata)):
            return None
        from ..kernels import persistent_layer

        if not persistent_layer.runs(x, seq_len, heads, norm1_w, qkv_w, o_w, norm2_w, gate_up_w, down_w, paged=True):
            return None
        cos, sin = rope if rope is not None else (None, None)
        paged = persistent_layer.Paged(self.k_pool[layer], self.v_pool[layer], m.block_tables, m.context_lens,
                                       m.slot_mapping)
        res = persistent_layer.layer(x, norm1_w, qkv_w, cos, sin, 1, heads, o_w, norm2_w, gate_up_w, down_w, eps,
                                     paged=paged, h_in=h_in, next_norm=next_norm)
        return res if next_norm is not None else (res, None)

    def __call__(self, layer, q, k, v):
        m = self.meta
        if isinstance(m, DecodeMetadata) and self.decode_writes_kv:  # the kernel writes them
            return self.decode(q, self.k_pool[layer], self.v_pool[layer], m.block_tables, m.context_lens,
                               new_kv=(k, v, m.slot_mapping))
        write_kv(self.k_pool, self.v_pool, layer, m.slot_mapping, k, v)
        if isinstance(m, DecodeMetadata):
            return self.decode(q, self.k_pool[layer], self.v_pool[layer], m.block_tables, m.context_lens)
        if isinstance(m, PrefillRowsMetadata):
            out = self.prefill_rows(q[0].unsqueeze(1), self.k_pool[layer], self.v_pool[layer], m.block_tables,
                                    m.context_lens)
            return out.view(1, -1, *out.shape[2:])
        # Prefill: a prompt from position 0 attends causally to its own new tokens only; one after
        # a cached prefix also to the prefix, through its block table (its new K/V are written above).
        outs = []
        for i, (s, e) in enumerate(zip(m.seq_starts[:-1], m.seq_starts[1:])):
            ctx = m.contexts[i] if m.contexts else None
            if ctx is None:
                o = F.scaled_dot_product_attention(q[:, s:e].transpose(1, 2), k[:, s:e].transpose(1, 2),
                                                   v[:, s:e].transpose(1, 2), is_causal=True, enable_gqa=True)
                outs.append(o.transpose(1, 2))
            else:
                start, table = ctx
                outs.append(self.prefill_context(q[:, s:e], self.k_pool[layer], self.v_pool[layer], table, start))
        return torch.cat(outs, dim=1)
