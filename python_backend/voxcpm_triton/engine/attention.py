"""Paged attention in plain PyTorch: the CPU path and the reference for GPU kernels.

A backend is bound to one pool (K and V tensors of one LM) and one batch's
metadata, and is called per layer as ``backend(layer, q, k, v)`` by MiniCPM:
it writes the new tokens' K/V into their slots, then attends.
"""

from __future__ import annotations

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
    """Several prompts packed into one sequence, each starting at position 0.
    slot_mapping: [S_total]; seq_starts: host list of offsets, len = n_prompts + 1."""

    slot_mapping: torch.Tensor
    seq_starts: list


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


class PagedAttention:
    def __init__(self, k_pool, v_pool, meta, use_triton: bool = False):
        """use_triton: decode with the Triton-language kernel (GPU) instead of the PyTorch gather."""
        self.k_pool, self.v_pool, self.meta = k_pool, v_pool, meta
        self.decode = paged_decode_attention
        if use_triton:
            from ..kernels.paged_attention import paged_decode_attention_triton

            self.decode = paged_decode_attention_triton

    def __call__(self, layer, q, k, v):
        m = self.meta
        write_kv(self.k_pool, self.v_pool, layer, m.slot_mapping, k, v)
        if isinstance(m, DecodeMetadata):
            return self.decode(q, self.k_pool[layer], self.v_pool[layer], m.block_tables, m.context_lens)
        # Prefill: fresh prompts, so each attends causally to its own new tokens only.
        outs = []
        for s, e in zip(m.seq_starts[:-1], m.seq_starts[1:]):
            o = F.scaled_dot_product_attention(q[:, s:e].transpose(1, 2), k[:, s:e].transpose(1, 2),
                                               v[:, s:e].transpose(1, 2), is_causal=True, enable_gqa=True)
            outs.append(o.transpose(1, 2))
        return torch.cat(outs, dim=1)
