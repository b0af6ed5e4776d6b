"""What a prefill CUDA graph reads and writes: device buffers for up to `length` prompt positions
and `outputs` prompts' results, and the body that runs the model's prefill over the first n of
them (`prefill_runner`: a lone prompt; `prefill_packs`: several admitted together)."""

from __future__ import annotations

import torch

from ..model.lora import LoraBatch, LoraTables
from .attention import PagedAttention
from .kv_cache import PagedKVCache


class PrefillBody:
    def __init__(self, model, kv: PagedKVCache, device, length: int, outputs: int, use_triton: bool,
                 lora: LoraTables | None, pool):
        """use_triton: attention on the paged decode kernel (the engine's decode attention choice).
        lora: the adapters' slot tables; a prefill then runs on one adapter's slot, a device scalar
        the graphs read. pool: the CUDA graph memory pool to capture into."""
        self.model, self.kv, self.device = model, kv, torch.device(device)
        self.use_triton, self.lora, self.pool = use_triton, lora, pool
        cfg, dev = model.cfg, self.device
        H, P, D = cfg.lm_config.hidden_size, cfg.patch_size, cfg.feat_dim
        self.tokens = torch.zeros(1, length, dtype=torch.int64, device=dev)
        self.text_mask = torch.zeros(1, length, device=dev)
        self.audio_mask = torch.zeros(1, length, device=dev)
        self.feats = torch.zeros(length, P, D, device=dev)  # [:n][None] is contiguous (compiled LocEnc's guards)
        self.slots = torch.zeros(length, dtype=torch.int64, device=dev)
        self.last = torch.zeros(outputs, dtype=torch.int64, device=dev)  # each prompt's last position
        dtype = model.fusion_concat_proj.weight.dtype
        self.lm_out = torch.zeros(outputs, H, dtype=dtype, device=dev)
        self.res_out = torch.zeros(outputs, H, dtype=dtype, device=dev)
        # Padding positions write round-robin into the scratch block.
        self.scratch = PagedKVCache.SCRATCH_BLOCK * kv.block_size + torch.arange(length, device=dev) % kv.block_size
        self.lora_slot = torch.zeros(1, dtype=torch.int64, device=dev)

    def _prefill(self, n: int, positions: torch.Tensor, meta):
        """The model's prefill over the first n positions (at `positions`, attention by `meta`),
        into lm_out and res_out."""
        lm, res = self.model.prefill(
            self.tokens[:, :n], self.text_mask[:, :n], self.audio_mask[:, :n], self.feats[:n][None], positions,
            self.last, PagedAttention(self.kv.base_k, self.kv.base_v, meta, self.use_triton),
            PagedAttention(self.kv.res_k, self.kv.res_v, meta, self.use_triton),
            lora=None if self.lora is None else LoraBatch(self.lora, self.lora_slot, single=True))
        self.lm_out.copy_(lm)
        self.res_out.copy_(res)
