"""Prompts admitted together (a burst's wave) prefilled as one CUDA graph per total-length bucket
(GPU with the Triton attention kernels).

Eagerly, a pack of prompts is launch-bound: several hundred kernels launched from Python, and a
causal attention per prompt and layer, so a wave of a few prompts holds the engine thread (and
every running stream's next step) for tens of milliseconds. In these graphs every new prompt
position is a query row of the paged decode kernel (`PrefillRowsMetadata`): its K/V written
first, then attending causally through its prompt's block table. The shapes then depend only on
the bucket, whatever the prompts' count, lengths and cached prefixes.

Each query row reads its prompt's earlier keys on its own (no tiling across queries): cheap for
the prompts of a burst, quadratic for a long one, so a prompt of more than `max_prompt_positions`
new positions is left to the eager path (flash attention), alone.

A pack of S positions runs in the smallest bucket N >= S. Rows S..N-1 are padding: position 0 of
a table that holds only the scratch block, whose K/V they write. Each row's block table is its
prompt's row of a [max_prompts + 1, max_blocks] buffer (the last row: the padding's), gathered
on the device; each prompt's result is read at its last row.
"""

from __future__ import annotations

import logging
import time

import torch

from ..gpu.buckets import smallest_at_least
from ..gpu.host_copies import to_device
from ..model.lora import LoraTables
from .attention import PrefillRowsMetadata
from .kv_cache import PagedKVCache
from .prefill_body import PrefillBody

log = logging.getLogger("voxcpm_triton.engine")

PACK_BUCKETS = (64, 128, 256, 512, 1024, 2048)
MAX_PROMPT_POSITIONS = 512  # new positions of one prompt in a pack at most (the lone-prompt graphs' largest)


class PackedPrefillGraphs(PrefillBody):
    def __init__(self, model, kv: PagedKVCache, device, max_prompts: int, max_blocks: int,
                 buckets=PACK_BUCKETS, pool=None, use_triton: bool = True, lora: LoraTables | None = None,
                 max_prompt_positions: int = MAX_PROMPT_POSITIONS):
        """max_prompts: prompts per pack at most (the engine's rows); max_blocks: the widest block
        table (the engine's max_blocks_per_seq). use_triton: attention on the paged decode kernel
        (on the PyTorch path each row gathers its whole table: for CPU tests)."""
        self.buckets = tuple(sorted(buckets))
        if not self.buckets or self.buckets[0] < 1 or max_prompts < 1:
            raise ValueError(f"packed prefill buckets {buckets} and max_prompts {max_prompts} must be >= 1")
        L = self.buckets[-1]
        super().__init__(model, kv, device, L, max_prompts, use_triton, lora, pool)
        self.max_prompts, self.max_blocks = max_prompts, max_blocks
        self.max_prompt_positions = max_prompt_positions
        self.max_positions = model.cfg.lm_config.max_position_embeddings  # RoPE tables' length
        dev = self.device
        self.positions = torch.zeros(1, L, dtype=torch.int64, device=dev)
        self.row_prompt = torch.full((L,), max_prompts, dtype=torch.int64, device=dev)
        self.context_lens = torch.ones(L, dtype=torch.int64, device=dev)
        self.tables = torch.full((max_prompts + 1, max_blocks), PagedKVCache.SCRATCH_BLOCK, dtype=torch.int64,
                                 device=dev)
        self.graphs: dict = {}

    def fits(self, positions: int, prompts: int, longest: int) -> bool:
        """Whether a pack of `prompts` prompts with `positions` new positions in all, `longest` the
        most of one prompt, has a graph."""
        return (1 <= prompts <= self.max_prompts and 1 <= positions <= self.buckets[-1]
                and longest <= self.max_prompt_positions)

    def _body(self, n: int):
        meta = PrefillRowsMetadata(self.slots[:n], self.tables.index_select(0, self.row_prompt[:n]),
                                   self.context_lens[:n])
        self._prefill(n, self.positions[:, :n], meta)

    def capture_all(self):
        t0 = time.monotonic()
        self._pad(0, self.buckets[-1])  # capture and its warm-up touch only the scratch block
        for n in self.buckets:
            graph = self._capture(lambda n=n: self._body(n), f"packed prefill of {n} positions")
            if graph is not None:
                self.graphs[n] = graph
        log.warning("captured %d packed prefill graphs in %.1f s", len(self.graphs), time.monotonic() - t0)

    def _pad(self, start: int, end: int):
        """Also: padding rows at position 0 of the padding's table, attending to that one key."""
        super()._pad(start, end)
        self.positions[0, start:end] = 0
        self.row_prompt[start:end] = self.max_prompts
        self.context_lens[start:end] = 1

    def run(self, prompts: list, starts: list[int], slots: list[int], tables: list[list[int]],
            lora_slot: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """prompts: Prompts, the first starts[i] positions of prompt i cached (their K/V in its
        blocks); slots: the KV slots of every new position, prompt after prompt; tables: each
        prompt's blocks from position 0 -> (lm_hidden [k, H], residual_hidden [k, H]) at each
        prompt's last position. lora_slot: their adapter's slot (0: the base model). Replays the
        bucket's graph; runs the same padded body eagerly where there is none (CPU tests)."""
        k = len(prompts)
        lens = [len(p) - c for p, c in zip(prompts, starts)]
        S = sum(lens)
        if not self.fits(S, k, max(lens)):
            raise ValueError(f"a pack of {k} prompts and {S} new positions (at most {max(lens)} of one) has no graph")
        if any(len(p) > self.max_positions for p in prompts) or any(len(t) > self.max_blocks for t in tables):
            raise ValueError(f"a prompt of the pack has more positions than the model's {self.max_positions} or "
                             f"more blocks than {self.max_blocks}")
        n, dev = smallest_at_least(self.buckets, S), self.device
        self._load(prompts, starts, slots, n)  # and pads S..n-1
        positions = torch.cat([torch.arange(c, len(p)) for p, c in zip(prompts, starts)])
        self.positions[0, :S] = to_device(positions, dev)
        self.row_prompt[:S] = to_device(torch.repeat_interleave(torch.arange(k), torch.tensor(lens)), dev)
        self.context_lens[:S] = to_device(positions + 1, dev)
        table = torch.full((k, self.max_blocks), PagedKVCache.SCRATCH_BLOCK, dtype=torch.int64)
        for i, t in enumerate(tables):
            table[i, :len(t)] = torch.tensor(t, dtype=torch.int64)
        self.tables[:k] = to_device(table, dev)
        last = torch.zeros(self.max_prompts, dtype=torch.int64)
        last[:k] = torch.tensor(lens).cumsum(0) - 1
        self.last.copy_(to_device(last, dev))
        if self.lora is not None:
            self.lora_slot.fill_(lora_slot)
        graph = self.graphs.get(n)
        if graph is not None:
            graph.replay()
        else:
            self._body(n)
        return self.lm_out[:k].clone(), self.res_out[:k].clone()
