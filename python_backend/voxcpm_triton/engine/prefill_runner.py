"""A lone prompt's prefill replayed as a CUDA graph per length bucket (GPU).

Eager prefill launches several hundred small kernels from Python (36 LM layers
plus LocEnc): far more CPU time than GPU work, and most of a lone request's time
to first audio.
A prompt of T positions runs in the graph of the smallest bucket L >= T, padded
at the end: prefill attention is causal, so the real positions never see the
padding, and the padding's K/V goes to the scratch block. Several prompts
admitted together (a burst under load) and prompts longer than the largest
bucket take the eager packed path.

A prompt whose first c positions come from the prefix cache runs positions c..T-1 in the
context graph of the smallest bucket >= T - c: the same body, its positions offset by a device
scalar and its attention reading the cached prefix through a block-table buffer, so one graph
per bucket serves every offset.
"""

from __future__ import annotations

import logging
import time

import torch

from ..gpu.buckets import smallest_at_least
from ..gpu.host_copies import to_device
from ..model.lora import LoraTables
from .attention import PrefillMetadata
from .kv_cache import PagedKVCache
from .prefill_body import PrefillBody

log = logging.getLogger("voxcpm_triton.engine")

PREFILL_BUCKETS = (32, 64, 128, 256, 512)


class PrefillGraphs(PrefillBody):
    def __init__(self, model, kv: PagedKVCache, device, buckets=PREFILL_BUCKETS, pool=None,
                 max_blocks: int | None = None, use_triton: bool = False, lora: LoraTables | None = None):
        """max_blocks: the widest block table (the engine's max_blocks_per_seq); with it, context
        graphs (a prompt after a cached prefix) are captured too. use_triton: their attention on
        the paged decode kernel (the engine's decode attention choice). lora: the adapters' slot
        tables; a prompt then runs on its adapter's slot, a device scalar the graphs read."""
        self.buckets = sorted(buckets)
        super().__init__(model, kv, device, self.buckets[-1], 1, use_triton, lora, pool)
        dev = self.device
        self.positions = torch.arange(self.buckets[-1], device=dev)[None]
        self.graphs: dict = {}
        # Context graphs: the prompt's blocks from position 0 (the rest scratch) and its first new position.
        self.block_table = torch.zeros(max_blocks, dtype=torch.int64, device=dev) if max_blocks else None
        self.start = torch.zeros(1, dtype=torch.int64, device=dev)
        self.rope_positions = model.cfg.lm_config.max_position_embeddings  # padded positions must index RoPE tables
        self.context_graphs: dict = {}

    def _body(self, n: int, context: bool = False):
        positions = self.positions[:, :n]
        contexts = None
        if context:
            positions = positions + self.start
            contexts = [(self.start, self.block_table)]
        self._prefill(n, positions, PrefillMetadata(self.slots[:n], [0, n], contexts))

    def capture_all(self):
        t0 = time.monotonic()
        self._pad(0, self.buckets[-1])  # capture and its warm-up touch only the scratch block
        self.start.zero_()
        kinds = [(False, self.graphs)] + ([(True, self.context_graphs)] if self.block_table is not None else [])
        for context, graphs in kinds:
            for n in self.buckets:
                what = f"prefill of {n} positions" + (" after a cached prefix" if context else "")
                graph = self._capture(lambda n=n, c=context: self._body(n, c), what)
                if graph is not None:
                    graphs[n] = graph
        log.warning("captured %d prefill graphs (%d after a cached prefix) in %.1f s",
                    len(self.graphs) + len(self.context_graphs), len(self.context_graphs), time.monotonic() - t0)

    def fits(self, n_positions: int, start: int = 0) -> bool:
        """Whether a prompt of n_positions, its first `start` cached, has a graph body (the padded
        positions of a context graph stay within the RoPE tables)."""
        n = smallest_at_least(self.buckets, n_positions - start)
        if n is None:
            return False
        return start == 0 or (self.block_table is not None and start + n <= self.rope_positions)

    def run(self, prompt, slots: list[int], start: int = 0, block_table: list[int] | None = None,
            lora_slot: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """prompt: a Prompt of T positions whose first `start` are cached (their K/V in
        block_table's blocks); slots: the KV slots of positions start..T-1 -> (lm_hidden [1, H],
        residual_hidden [1, H]). lora_slot: its adapter's slot (0: the base model). Replays the
        bucket's graph; runs the same padded body eagerly where there is none (CPU tests, a failed
        capture)."""
        n = smallest_at_least(self.buckets, len(prompt) - start)
        dev = self.device
        L = self._load([prompt], [start], slots, n)
        self.last.fill_(L - 1)
        if self.lora is not None:
            self.lora_slot.fill_(lora_slot)
        if start:
            self.start.fill_(start)
            table = torch.zeros_like(self.block_table, device="cpu")  # past the prompt: the scratch block
            table[:len(block_table)] = torch.tensor(block_table, dtype=torch.int64)
            self.block_table.copy_(to_device(table, dev))
        graph = (self.context_graphs if start else self.graphs).get(n)
        if graph is not None:
            graph.replay()
        else:
            self._body(n, context=bool(start))
        return self.lm_out.clone(), self.res_out.clone()
