"""Which adapter the network's weights hold while the engine runs (`model.lora_merge`): the policy,
and the moments the weights change. Only the engine thread calls in, between GPU work, so every
change falls in stream order between the steps and prefills around it.

Policy (`merge_target`): a decode step whose rows all use one adapter runs it merged, through the
plain graphs; a step of base rows runs the plain graphs over the weights as loaded; a mix runs each
row's LoRA ops over the weights as loaded. A prefill never merges (the next step decides, for all
its rows), but runs on a merged adapter that is its own.
"""

from __future__ import annotations

import logging

from ..model.lora_merge import MergedWeights

log = logging.getLogger("voxcpm_triton.engine")


def merge_target(slots) -> int | None:
    """The one LoRA slot a step's rows share (0: the base model, the weights as loaded), or None
    for a mix."""
    distinct = set(slots)
    return distinct.pop() if len(distinct) == 1 else None


class LoraMerging:
    def __init__(self, merged: MergedWeights | None, tables: bool):
        """merged: the network's mergeable weights (None: never merge); tables: whether the
        network has LoRA slot tables (LoRA ops) at all."""
        self.merged, self.tables = merged, tables

    @property
    def merges(self) -> int:
        return self.merged.merges if self.merged is not None else 0

    def for_step(self, slots) -> bool:
        """Before a decode step's launches for rows on LoRA `slots`: the weights as they need them
        -> whether the step runs the plain network (no LoRA ops)."""
        if not self.tables:
            return True
        if self.merged is None:
            return False
        target = merge_target(slots)
        self.merged.hold(target or 0)
        return target is not None

    def for_prefill(self, slot: int) -> int:
        """Before a prefill of prompts on adapter `slot`: any other adapter merged is taken out ->
        the LoRA slot whose ops the prefill runs (0 where the weights hold `slot` merged)."""
        if self.merged is None:
            return slot
        if self.merged.slot != slot:
            self.merged.hold(0)
        return slot if self.merged.slot == 0 else 0

    def unmerge(self, slot: int | None = None):
        """The weights as loaded (given `slot`: only if that adapter is merged, as before its slot
        table is written)."""
        if self.merged is not None and (slot is None or self.merged.slot == slot):
            self.merged.hold(0)

    def unmerge_safely(self):
        """`unmerge` where a failure must not stop what follows (a request's end, the thread's exit)."""
        try:
            self.unmerge()
        except Exception:  # noqa: BLE001 - a dead GPU context: nothing runs on these weights again
            log.exception("restoring the weights after a LoRA merge failed")
