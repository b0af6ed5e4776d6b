"""One adapter merged into the network's weights: W + B A (alpha / r in B), in place.

A step whose rows all run on one adapter then needs no LoRA op at all: it runs the plain network
(the plain decode graphs) over the merged weights, at the plain network's speed. The per-row LoRA
ops (`model.lora`) cost a kernel per adapted projection, and at small batches the step is bound by
kernel count.

`MergedWeights` keeps a copy of every adapted site's weight as loaded, so `restore` is a copy back,
exact, whatever was merged before. A site's weight is its fused tensor (q/k/v, gate/up: the
targets' weights are views of it, `minicpm.fuse_projections`); its delta is one matmul, B laid out
block-diagonally by target against the site's stacked A. Merge and restore read the slot tables
and write the weights on the current stream, so they fall in order between the steps around them.
The merge reads its slot from a device buffer, so it can be captured once as a CUDA graph
(`merge` is what runs it: the engine swaps in the graph's replay), costing the engine thread one
launch instead of one per layer.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from .lora import FUSED, LoraTables


def site_weight(model: nn.Module, site) -> torch.Tensor | None:
    """The tensor holding a site's weight [out, in] (the fused one for several targets), or None
    where it is not one plain tensor (FP8 weights, unfused projections)."""
    weights = [getattr(model.get_submodule(t), "weight", None) for t in site.targets]
    if not all(isinstance(w, torch.Tensor) and w.is_floating_point() and w.element_size() >= 2 for w in weights):
        return None
    if len(weights) == 1:
        return weights[0].data
    parent = site.targets[0].rpartition(".")[0]
    fused = getattr(model.get_submodule(parent), FUSED[parent.rpartition(".")[2]][1], None)
    if not isinstance(fused, torch.Tensor) or fused.shape != (sum(site.splits), site.in_features):
        return None
    row = fused.stride(0) * fused.element_size()
    offsets = [sum(site.splits[:i]) * row for i in range(len(weights))]
    if any(w.data_ptr() != fused.data_ptr() + o for w, o in zip(weights, offsets)):
        return None  # the targets' weights are not views of it
    return fused


class MergeSite(NamedTuple):
    name: str  # the LoRA site (model.lora.LoraSite.name)
    weight: torch.Tensor  # the network's weight [out, in], written in place
    loaded: torch.Tensor  # its copy as loaded
    layout: torch.Tensor | None  # fused sites: [out, n] one-hot, the target of each output row


class MergedWeights:
    def __init__(self, model: nn.Module, tables: LoraTables):
        """Copies of the weights of every site `tables` covers (GPU memory: their size). ValueError
        where a site's weight cannot take a merge (FP8, unfused, another dtype or device)."""
        self.tables = tables
        self.sites: list[MergeSite] = []
        for name, s in tables.sites.items():
            w, table = site_weight(model, s), tables.a[name]
            if w is None or w.dtype != table.dtype or w.device != table.device:
                raise ValueError(f"{name} has no plain {table.dtype} weight tensor on {table.device} "
                                 "(FP8 or unfused weights)")
            layout = None
            if len(s.targets) > 1:  # the tables' own map of output row -> target
                layout = nn.functional.one_hot(tables.seg[name].detach(), len(s.targets)).to(dtype=w.dtype)
            self.sites.append(MergeSite(name, w, w.detach().clone(), layout))
        # the adapter merged now: 0 none (the weights as loaded), -1 unknown (a merge that failed)
        self.slot = 0
        self.slot_id = torch.zeros(1, dtype=torch.int64, device=tables.device)  # what `merge_body` merges
        self.merge = self.merge_body
        self.merges = 0  # merges made (a count for the engine's stats)

    def nbytes(self) -> int:
        return sum(c.loaded.numel() * c.loaded.element_size() for c in self.sites)

    @torch.no_grad()
    def hold(self, slot: int):
        """The weights <- as loaded plus adapter `slot`'s delta (0: as loaded)."""
        if slot == self.slot:
            return
        self.restore()
        if slot == 0:
            return
        self.slot = -1  # until it has all gone through: a restore then copies every weight back
        self.slot_id.fill_(slot)
        self.merge()
        self.slot = slot
        self.merges += 1

    @torch.no_grad()
    def merge_body(self):
        """The weights <- as loaded plus the delta of the adapter in slot `slot_id` (a device read:
        capturable)."""
        t = self.tables
        for name, w, loaded, layout in self.sites:
            a = t.a[name].index_select(0, self.slot_id)[0]  # [n * r, in]
            b = t.b[name].index_select(0, self.slot_id)[0]  # [out, r]
            if layout is not None:  # [out, n * r]: row j's B in its target's rank block, zeros elsewhere
                b = (layout[:, :, None] * b[:, None, :]).reshape(b.size(0), -1)
            torch.addmm(loaded, b, a, out=w)  # one GEMM: fp32 accumulation, the sum rounded once

    @torch.no_grad()
    def restore(self):
        """The weights as loaded."""
        if self.slot == 0:
            return
        torch._foreach_copy_([c.weight for c in self.sites], [c.loaded for c in self.sites])
        self.slot = 0
