"""The garbage collector of a model process: start-up's objects frozen, collections timed.

A collection of the oldest generation walks every object the process tracks, holding the GIL:
every thread of the process waits for it. In the decoder those are the engine's steps and the
audio thread's deliveries, so every stream stalls at once; in an orchestrator, every stream's
chunks. After start-up a process tracks hundreds of thousands of objects (torch, triton,
inductor's compiled code, the engine's graphs) that serving never frees. `freeze` moves them to
the permanent generation, which collections skip (`gc.freeze`): a full collection then walks only
what serving made since. The price: a frozen object that later becomes part of unreachable
cycles (say, an adapter loaded at start-up and removed later) is never collected; memory freed by
reference counting is freed as before. `Pauses` counts the collections by generation and times
them (`gc.callbacks`), for the metrics.
"""

from __future__ import annotations

import gc
import logging
import os
import time

log = logging.getLogger("voxcpm_triton.gc")


def freeze_enabled() -> bool:
    """VOXCPM_GC_FREEZE=0 leaves start-up's objects to the collector (benchmarks' A/B)."""
    return os.environ.get("VOXCPM_GC_FREEZE", "1") != "0"


def freeze(process: str) -> dict:
    """Last in a model's start-up: collect what start-up left, then freeze what is still alive.
    Times a full collection before the freeze and one after it (what a full collection costs
    this process while serving, with and without), logs them -> those figures."""
    t0 = time.perf_counter()
    gc.collect()
    before_s = time.perf_counter() - t0
    tracked = len(gc.get_objects())
    out = {"objects": tracked, "full_collection_s": before_s, "frozen": freeze_enabled()}
    if out["frozen"]:
        gc.freeze()
        t0 = time.perf_counter()
        gc.collect()
        out["full_collection_frozen_s"] = time.perf_counter() - t0
    log.warning("%s: a full garbage collection takes %.0f ms (%d objects tracked after it)%s", process,
                1e3 * before_s, tracked,
                f"; with them frozen, {1e3 * out['full_collection_frozen_s']:.1f} ms" if out["frozen"]
                else " (not frozen: VOXCPM_GC_FREEZE=0)")
    return out


class Pauses:
    """Collections in this process since it was made, by generation: `count`, `seconds`, and the
    longest one, `longest_s`. Plain numbers, read by the metrics' thread."""

    def __init__(self):
        self.count, self.seconds, self.longest_s = [0, 0, 0], [0.0, 0.0, 0.0], 0.0
        self._start = None
        gc.callbacks.append(self._timed)

    def _timed(self, phase: str, info: dict):
        # Collections do not nest, and run under the GIL: one at a time, whatever thread.
        if phase == "start":
            self._start = time.perf_counter()
        elif self._start is not None:
            took, self._start = time.perf_counter() - self._start, None
            g = info["generation"]
            self.count[g] += 1
            self.seconds[g] += took
            self.longest_s = max(self.longest_s, took)

    def close(self):
        if self._timed in gc.callbacks:
            gc.callbacks.remove(self._timed)
