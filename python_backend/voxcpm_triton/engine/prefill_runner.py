"""A lone prompt's prefill replayed as a CUDA graph per length bucket (GPU).

Eager prefill launches several hundred small kernels from Python (36 LM layers
plus LocEnc): far more CPU time than GPU work, and most of a lone request's time
to first audio.
A prompt of T positions runs in the graph of the smallest bucket L >= T, padded
at the end: prefill attention is causal, so the real positions never see the
padding, and the padding's K/V goes to the scratch block. Several prompts
admitted together (a burst under load) and prompts longer than the largest
bucket take the eager packed path.
"""

from __future__ import annotations

import logging
import time

import torch

from .buckets import smallest_at_least
from .cuda_graph import capture_graph
from .attention import PagedAttention, PrefillMetadata
from .kv_cache import PagedKVCache

log = logging.getLogger("voxcpm_triton.engine")

PREFILL_BUCKETS = (32, 64, 128, 256, 512)


class PrefillGraphs:
    def __init__(self, model, kv: PagedKVCache, device, buckets=PREFILL_BUCKETS, pool=None):
        self.model, self.kv, self.device = model, kv, torch.device(device)
        self.buckets = sorted(buckets)
        L, cfg = self.buckets[-1], model.cfg
        H, P, D = cfg.lm_config.hidden_size, cfg.patch_size, cfg.feat_dim
        dev = self.device
        self.tokens = torch.zeros(1, L, dtype=torch.int64, device=dev)
        self.text_mask = torch.zeros(1, L, device=dev)
        self.audio_mask = torch.zeros(1, L, device=dev)
        self.feats = torch.zeros(L, P, D, device=dev)  # [:n][None] is contiguous (compiled LocEnc's guards)
        self.positions = torch.arange(L, device=dev)[None]
        self.slots = torch.zeros(L, dtype=torch.int64, device=dev)
        self.last = torch.zeros(1, dtype=torch.int64, device=dev)
        dtype = model.fusion_concat_proj.weight.dtype
        self.lm_out = torch.zeros(1, H, dtype=dtype, device=dev)
        self.res_out = torch.zeros(1, H, dtype=dtype, device=dev)
        bs = kv.block_size
        # Padding positions write round-robin into the scratch block.
        self.scratch = PagedKVCache.SCRATCH_BLOCK * bs + torch.arange(L, device=dev) % bs
        self.graphs: dict = {}
        self.pool = pool

    def _body(self, n: int):
        meta = PrefillMetadata(self.slots[:n], [0, n])
        lm, res = self.model.prefill(
            self.tokens[:, :n], self.text_mask[:, :n], self.audio_mask[:, :n], self.feats[:n][None],
            self.positions[:, :n], self.last, PagedAttention(self.kv.base_k, self.kv.base_v, meta),
            PagedAttention(self.kv.res_k, self.kv.res_v, meta))
        self.lm_out.copy_(lm)
        self.res_out.copy_(res)

    def capture_all(self):
        t0 = time.monotonic()
        self.slots.copy_(self.scratch)  # capture and its warm-up touch only the scratch block
        for n in self.buckets:
            try:
                graph = capture_graph(lambda n=n: self._body(n), self.device, self.pool)
                self.pool = graph.pool()
                self.graphs[n] = graph
            except Exception as e:  # noqa: BLE001 - that length runs eagerly
                log.warning("prefill graph capture failed for %d positions (%s); eager for that length", n, e)
                torch.cuda.synchronize(self.device)
        log.warning("captured %d prefill graphs in %.1f s", len(self.graphs), time.monotonic() - t0)

    def fits(self, n_positions: int) -> bool:
        return n_positions <= self.buckets[-1]

    def run(self, prompt, slots: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """prompt: a Prompt of T positions; slots: its T KV slots -> (lm_hidden [1, H], residual_hidden [1, H]).
        Replays the bucket's graph; runs the same padded body eagerly where there is none (CPU tests,
        a failed capture)."""
        T = len(prompt)
        n = smallest_at_least(self.buckets, T)
        dev = self.device
        self.tokens[0, :T] = prompt.tokens.to(dev, non_blocking=True)
        self.text_mask[0, :T] = prompt.text_mask.to(dev, non_blocking=True)
        self.audio_mask[0, :T] = prompt.audio_mask.to(dev, non_blocking=True)
        self.feats[:T] = prompt.feats.to(dev, non_blocking=True)
        for buf in (self.tokens, self.text_mask, self.audio_mask):
            buf[0, T:n] = 0
        self.feats[T:n] = 0
        self.slots[:T] = torch.tensor(slots, dtype=torch.int64).to(dev, non_blocking=True)
        self.slots[T:n] = self.scratch[T:n]
        self.last.fill_(T - 1)
        graph = self.graphs.get(n)
        if graph is not None:
            graph.replay()
        else:
            self._body(n)
        return self.lm_out.clone(), self.res_out.clone()
