"""What a prefill CUDA graph reads and writes: device buffers for up to `length` prompt positions
and `outputs` prompts' results, and the body that runs the model's prefill over the first n of
them (`prefill_runner`: a lone prompt; `prefill_packs`: several admitted together)."""

from __future__ import annotations

import logging

import torch

from ..gpu.cuda_graph import capture_graph
from ..gpu.host_copies import to_device
from ..model.lora import LoraBatch, LoraTables
from .attention import PagedAttention
from .kv_cache import PagedKVCache

log = logging.getLogger("voxcpm_triton.engine")


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

    def _load(self, prompts: list, starts: list[int], slots: list[int], n: int) -> int:
        """The new positions of `prompts` (the first starts[i] of prompt i cached), one after
        another, and their KV `slots` into the buffers; the rest up to n is padding (`_pad`).
        -> the number of new positions."""
        dev = self.device
        cat = lambda name: torch.cat([getattr(p, name)[c:] for p, c in zip(prompts, starts)])  # noqa: E731
        S = len(slots)
        self.tokens[0, :S] = to_device(cat("tokens"), dev)
        self.text_mask[0, :S] = to_device(cat("text_mask"), dev)
        self.audio_mask[0, :S] = to_device(cat("audio_mask"), dev)
        self.feats[:S] = to_device(cat("feats"), dev)
        self.slots[:S] = to_device(torch.tensor(slots, dtype=torch.int64), dev)
        self._pad(S, n)
        return S

    def _pad(self, start: int, end: int):
        """Positions start..end-1 as padding: no input, K/V into the scratch block."""
        for buf in (self.tokens, self.text_mask, self.audio_mask):
            buf[0, start:end] = 0
        self.feats[start:end] = 0
        self.slots[start:end] = self.scratch[start:end]

    def _capture(self, body, what: str):
        """`body` captured as a CUDA graph into this object's pool -> the graph, or None (logged:
        `what` then runs eagerly)."""
        try:
            graph = capture_graph(body, self.device, self.pool)
        except Exception as e:  # noqa: BLE001 - that size runs eagerly
            log.warning("%s: CUDA graph capture failed (%s); eager for that size", what, e)
            torch.cuda.synchronize(self.device)
            return None
        self.pool = graph.pool()
        return graph

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
