"""Paged KV cache: fixed-size blocks in two pools (base LM, residual LM) that share one block table per request.

Both LMs see the same positions, so a request's block i holds positions
[i*block_size, (i+1)*block_size) in every layer of both pools.

Which blocks are free, held or cached is `block_manager.BlockManager`'s business (no torch);
this module holds the tensors.
"""

from __future__ import annotations

import torch

from .block_manager import BlockManager


class PagedKVCache:
    """K/V pools shaped [layers, 1 + blocks, block_size, kv_heads, head_dim].

    Block 0 is scratch, never handed out: padding rows of a captured batch write
    there and read from there, so they can never touch a live request's cache.
    """

    SCRATCH_BLOCK = 0

    def __init__(self, base_layers: int, residual_layers: int, kv_heads: int, head_dim: int,
                 num_blocks: int, block_size: int, dtype: torch.dtype, device):
        shape = (num_blocks + 1, block_size, kv_heads, head_dim)
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.base_k = torch.zeros(base_layers, *shape, dtype=dtype, device=device)
        self.base_v = torch.zeros_like(self.base_k)
        self.res_k = torch.zeros(residual_layers, *shape, dtype=dtype, device=device)
        self.res_v = torch.zeros_like(self.res_k)
        self.allocator = BlockManager(num_blocks, first=1)

    @staticmethod
    def bytes_per_block(base_layers, residual_layers, kv_heads, head_dim, block_size, dtype) -> int:
        elem = torch.empty(0, dtype=dtype).element_size()
        return 2 * (base_layers + residual_layers) * block_size * kv_heads * head_dim * elem

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.base_k, self.base_v, self.res_k, self.res_v))
