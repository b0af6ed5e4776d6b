"""The LoRA adapters a VoxCPM2 serves: read from a directory (formats/lora.py), written into the GPU
slot tables (model/lora.py), and which name sits in which slot.

The tables cover a fixed set of layers, chosen at load: the targets of the adapters found (those
left out for want of slots included), plus
(for a server that adds adapters at run time, `reserve`) the official default targets (LM and
LocDiT attention) or every layer an adapter may target. An adapter added later must fit in them and
in `max_rank`; anything else would change the captured CUDA graphs.
"""

from __future__ import annotations

import logging
import os

import torch

from .formats.lora import DEFAULT_CONFIG, RESERVE, Adapter, LoraError, check_lora_name, load_adapter, load_dir
from .model.lora import LoraBatch, LoraTables, sites_for

log = logging.getLogger("voxcpm_triton.lora")


class AdapterSet:
    def __init__(self, lora_dir: str, linears: dict, tables: LoraTables, slots: dict, errors: dict):
        self.lora_dir, self.linears, self.tables = lora_dir, linears, tables
        self.slots = slots  # name -> slot of the adapters loaded here (the engine keeps its own registry)
        self.errors = errors  # name -> why it was left out

    @classmethod
    def load(cls, lora_dir: str, linears: dict, dtype, device, max_loras: int | None = None,
             max_rank: int | None = None, reserve: str | None = None, only: list | None = None) -> "AdapterSet":
        """Every adapter under `lora_dir` into slots 1, 2, ... (by name), or those named in `only`, in
        its order (the set a server had loaded before a restart). linears: the network's linear
        layers (`model.lora.linear_shapes`). max_loras / max_rank: the tables' size (default: what the
        adapters found need). reserve: None, or what the tables cover beyond the adapters found
        (`formats.lora.RESERVE`: "default", the official default targets; "all", every linear an
        adapter may target). A broken adapter, or one past max_loras, is logged, recorded in `errors`
        and left out."""
        if reserve is not None and reserve not in RESERVE:
            raise ValueError(f"reserve must be None or one of {', '.join(RESERVE)}, got {reserve!r}")
        adapters, errors = load_dir(lora_dir, linears, max_rank, dtype)
        # The tables cover every good adapter found, loaded or not: one left out (slots full, or not
        # in `only`) can be added once a slot is free.
        found = list(adapters.values())
        names = sorted(adapters)
        if only is not None:
            errors = {n: errors.get(n, "no longer in the LoRA directory") for n in only if n not in adapters}
            adapters = {n: adapters[n] for n in only if n in adapters}
            names = list(adapters)
        if max_loras is not None and len(names) > max_loras:
            for n in names[max_loras:]:
                errors[n] = f"left out: all {max_loras} LoRA slots are taken (parameter max_loras)"
                del adapters[n]
            names = names[:max_loras]
        for n, e in sorted(errors.items()):
            log.warning("LoRA adapter %r not loaded: %s", n, e)
        modules = {m for a in found for m in a.modules}
        if reserve is not None:
            modules |= {m for m in linears if RESERVE[reserve](m)}
        if not modules:
            modules = {m for m in linears if DEFAULT_CONFIG.targets(m)}
        max_loras = max_loras or max(1, len(names))
        max_rank = max_rank or max([a.rank for a in found], default=1)
        tables = LoraTables(sites_for(linears, modules), max_loras, max_rank, dtype, device)
        slots = {}
        for slot, n in enumerate(names, start=1):
            tables.write(slot, adapters[n].weights, adapters[n].scale)
            slots[n] = slot
        log.warning("LoRA: %d adapter(s) loaded from %s (%d slots of rank <= %d over %d layers, %.0f MiB)",
                    len(slots), lora_dir, max_loras, max_rank, len(tables.sites), tables.nbytes() / 2**20)
        return cls(lora_dir, linears, tables, slots, errors)

    def read(self, name: str) -> Adapter:
        """Adapter `name` from the directory, checked against these tables (rank, covered layers)."""
        check_lora_name(name)
        ad = load_adapter(os.path.join(self.lora_dir, name), self.linears, self.tables.max_rank, name,
                          self.tables.dtype)
        missing = self.tables.uncovered(ad.modules)
        if missing:
            raise LoraError(f"adapter {name!r} targets {', '.join(missing[:4])}"
                            f"{f' ... ({len(missing)} in all)' if len(missing) > 4 else ''}, which this "
                            "server's LoRA tables do not cover (they cover the targets of the adapters present "
                            "at start-up, loaded or not, and the official defaults, or every target with the decoder parameter "
                            "lora_targets=all); restart the server with it in the directory")
        return ad

    def slot(self, name: str) -> int:
        """The slot of adapter `name` (the offline API's lookup); ValueError naming what is loaded."""
        if name in self.slots:
            return self.slots[name]
        if name in self.errors:
            raise ValueError(f"LoRA adapter {name!r} was not loaded: {self.errors[name]}")
        raise ValueError(f"unknown LoRA adapter {name!r} (loaded: {', '.join(sorted(self.slots)) or 'none'})")

    def batch(self, slots, single: bool = False) -> LoraBatch:
        """A `LoraBatch` over `slots` (a device tensor, or a list of ints)."""
        if not torch.is_tensor(slots):
            slots = torch.tensor(slots, dtype=torch.int64, device=self.tables.device)
        return LoraBatch(self.tables, slots, single)
