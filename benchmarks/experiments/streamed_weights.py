"""EXPERIMENT, not used by the server: does a LocDiT-sized layer of few tokens come near its weights'
DRAM time when the weight stream does not wait for the grid barriers between its phases?

The persistent layer kernel (`kernels/persistent_layer.py`) runs a layer as phases separated by
grid-wide barriers; each GEMM phase starts loading its weights only once its barrier has passed,
so every phase pays its pipeline's ramp, and DRAM idles through the barriers and the short phases.
Here (Gluon: TMA, mbarriers, warp specialization, Hopper's warpgroup MMA) one producer warp per
program streams the program's weight tiles, of every phase of every layer in order, into a ring
of shared-memory slots, waiting only for free slots; the program's other warps run the phases:
a grid-wide barrier, then each of its work items (64 output columns x 256 of K: four [64, 64]
bf16 tiles, 32 KB) multiplied by 32 token rows. `coupled=True` makes the producer wait for each
phase's barrier first, as the persistent kernel's loads do: the same kernel otherwise.

Per layer, four phases of LocDiT's projection shapes (QKV 1024 -> 2560, output 2048 -> 1024,
gate/up 1024 -> 8192, down 4096 -> 1024: 34.6 MB of bf16); attention, norms and SiLU are left out,
and each item's weights lie contiguous (this experiment's layout, not the model's). What ties a
phase to the one before: each item adds, after the barrier, one [64, 32] fp32 tile that an item
of the previous phase wrote, a read from L2 as the real activations are (the values are the
products' and those reads' sums, checked against PyTorch for one layer). Variants that drop the
reads, the barriers, or the products too show what each costs. Measured on an H200 (benchmarks/
results.md, "Fifty-third session"): streamed, the four phases took 22-25 us a layer against 25-28
coupled (19-22 against 22-26 without the reads), and the stream alone (no barriers, no products)
reached at most 2.6 TB/s: no faster, with attention and norms still to add, than the persistent
layer kernel's whole LocDiT layer.

    python3 benchmarks/experiments/streamed_weights.py --layers 12 --slots 16,24 --out streamed.json
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

# LocDiT's projections (K, N); work items of BN output columns x BK of K
PHASES = ((1024, 2560), (2048, 1024), (1024, 8192), (4096, 1024))
BN, BK, TILE_K, ROWS = 64, 256, 64, 32  # ROWS: token rows (LocDiT's 22, padded for the MMA)
TILES = BK // TILE_K


def phase_table() -> tuple[list, int]:
    """[K, N, items, first item] per phase, and the items of a layer."""
    table, first = [], 0
    for k, n in PHASES:
        items = (n // BN) * (k // BK)
        table.append([k, n, items, first])
        first += items
    return table, first


@gluon.jit
def _producer(w_desc, ring, ready, empty, start, tab_ptr, layers, items_per_layer, COUPLED: gl.constexpr):
    pid, nprog = gl.program_id(0), gl.num_programs(0)
    slots: gl.constexpr = ring.type.shape[0]
    c = 0
    q = 0
    for layer in range(layers):
        for p in range(4):
            if COUPLED:  # as the persistent kernel: nothing of this phase is asked for before its barrier
                mbarrier.wait(start, q & 1)
            items = gl.load(tab_ptr + 4 * p + 2)
            first = gl.load(tab_ptr + 4 * p + 3)
            # items dealt round-robin across the phases: program k takes the layer's items k, k + nprog, ...
            for i in range((pid + nprog - first % nprog) % nprog, items, nprog):
                row = (layer * items_per_layer + first + i) * 64
                for t in gl.static_range(4):
                    s = c % slots
                    mbarrier.wait(empty.index(s), ((c // slots) & 1) ^ 1)
                    mbarrier.expect(ready.index(s), w_desc.block_type.nbytes)
                    tma.async_copy_global_to_shared(w_desc, [row, t * 64], ready.index(s), ring.index(s))
                    c += 1
            q += 1


@gluon.jit
def _consumer(ring, ready, empty, start, xs, out_ptr, tab_ptr, bar_ptr, layers, COUPLED: gl.constexpr,
              OUT_STRIDE: gl.constexpr, DEP: gl.constexpr, BARRIERS: gl.constexpr, MMA: gl.constexpr):
    pid, nprog = gl.program_id(0), gl.num_programs(0)
    slots: gl.constexpr = ring.type.shape[0]
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, 32, 16])
    r = gl.arange(0, 64, layout=gl.SliceLayout(1, acc_layout))
    col = gl.arange(0, 32, layout=gl.SliceLayout(0, acc_layout))
    tile = gl.expand_dims(r, 1) * 32 + gl.expand_dims(col, 0)  # a [64, 32] fp32 tile, rows of 32
    xt = xs.permute((1, 0))  # [64 of K, 32 rows]: the token rows as the MMA's B
    c = 0
    q = 0
    for layer in range(layers):
        for p in range(4):
            if BARRIERS and q > 0:  # grid barrier: every program has ended phase q - 1
                seen = gl.load(bar_ptr, volatile=True)
                while seen < q * nprog:
                    seen = gl.load(bar_ptr, volatile=True)
            if COUPLED:
                mbarrier.arrive(start, count=1)
            items = gl.load(tab_ptr + 4 * p + 2)
            first = gl.load(tab_ptr + 4 * p + 3)
            prev_items = gl.load(tab_ptr + 4 * ((p + 3) % 4) + 2)
            dst = out_ptr + (q % 2) * OUT_STRIDE
            src = out_ptr + ((q + 1) % 2) * OUT_STRIDE
            for i in range((pid + nprog - first % nprog) % nprog, items, nprog):  # as the producer deals them
                if DEP and q > 0:  # what the previous phase made, read from L2 after its barrier (issued first)
                    acc = gl.load(src + (i % prev_items) * 2048 + tile, volatile=True)
                else:
                    acc = gl.zeros([64, 32], gl.float32, layout=acc_layout)
                if MMA:
                    for t in gl.static_range(4):  # one product in flight: a slot is freed once the next is issued
                        s = c % slots
                        mbarrier.wait(ready.index(s), (c // slots) & 1)
                        acc = warpgroup_mma(ring.index(s), xt, acc, is_async=True)
                        if t > 0:
                            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))
                            mbarrier.arrive(empty.index((c - 1) % slots), count=1)
                        c += 1
                    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
                    mbarrier.arrive(empty.index((c - 1) % slots), count=1)
                else:  # a probe: the tiles only waited for and freed
                    for t in gl.static_range(4):
                        s = c % slots
                        mbarrier.wait(ready.index(s), (c // slots) & 1)
                        mbarrier.arrive(empty.index(s), count=1)
                        c += 1
                gl.store(dst + i * 2048 + tile, acc)
            gl.thread_barrier()  # every warp's stores issued before the arrival
            gl.atomic_add(bar_ptr, 1, sem="release", scope="gpu")
            q += 1


@gluon.jit
def streamed_layers(w_desc, x_desc, out_ptr, tab_ptr, bar_ptr, layers, items_per_layer, SLOTS: gl.constexpr,
                    COUPLED: gl.constexpr, OUT_STRIDE: gl.constexpr, DEP: gl.constexpr = True,
                    BARRIERS: gl.constexpr = True, MMA: gl.constexpr = True):
    ring = gl.allocate_shared_memory(w_desc.dtype, [SLOTS] + w_desc.block_type.shape, w_desc.layout)
    xs = gl.allocate_shared_memory(x_desc.dtype, x_desc.block_type.shape, x_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
    start = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for s in gl.static_range(SLOTS):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    mbarrier.init(start, count=1)
    # The token rows, once: [32, 64] bf16 (one K tile's worth, reused for every tile).
    mbarrier.expect(start, x_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(x_desc, [0, 0], start, xs)
    mbarrier.wait(start, 0)
    mbarrier.invalidate(start)
    mbarrier.init(start, count=1)
    fence_async_shared()
    gl.warp_specialize([
        (_consumer, (ring, ready, empty, start, xs, out_ptr, tab_ptr, bar_ptr, layers, COUPLED, OUT_STRIDE, DEP,
                      BARRIERS, MMA)),
        (_producer, (w_desc, ring, ready, empty, start, tab_ptr, layers, items_per_layer, COUPLED)),
    ], [1], [40])


class Setup:
    def __init__(self, layers: int, device="cuda", seed=0):
        table, self.items_per_layer = phase_table()
        self.layers = layers
        g = torch.Generator(device=device).manual_seed(seed)
        # every item's [64, 256] weights, item after item, layer after layer
        self.w = (torch.randn(layers * self.items_per_layer * 64, BK, device=device, generator=g) * 0.05
                  ).to(torch.bfloat16)
        self.x = (torch.randn(ROWS, TILE_K, device=device, generator=g) * 0.5).to(torch.bfloat16)
        self.tab = torch.tensor(table, dtype=torch.int32, device=device).flatten()
        self.max_items = max(t[2] for t in table)
        self.out = torch.zeros(2, self.max_items, 64, 32, device=device)
        self.bar = torch.zeros(1, dtype=torch.int32, device=device)
        w_layout = gl.NVMMASharedLayout.get_default_for([64, TILE_K], gl.bfloat16)
        x_layout = gl.NVMMASharedLayout.get_default_for([ROWS, TILE_K], gl.bfloat16)
        self.w_desc = TensorDescriptor.from_tensor(self.w, [64, TILE_K], w_layout)
        self.x_desc = TensorDescriptor.from_tensor(self.x, [ROWS, TILE_K], x_layout)
        self.table = table
        self.programs = torch.cuda.get_device_properties(device).multi_processor_count

    def launch(self, slots: int, coupled: bool, dep: bool = True, barriers: bool = True, mma: bool = True):
        self.bar.zero_()
        streamed_layers[(self.programs, )](self.w_desc, self.x_desc, self.out, self.tab, self.bar, self.layers,
                                           self.items_per_layer, SLOTS=slots, COUPLED=coupled,
                                           OUT_STRIDE=self.max_items * 2048, DEP=dep, BARRIERS=barriers, MMA=mma,
                                           num_warps=4)

    def reference(self) -> torch.Tensor:
        """The last phase's item tiles [items, 64, 32] as PyTorch computes them (fp32)."""
        xt = self.x.float().T  # [64, 32]
        prev, q = None, 0
        for layer in range(self.layers):
            for k, n, items, first in self.table:
                base = (layer * self.items_per_layer + first) * 64
                w = self.w[base:base + items * 64].float().view(items, 64, TILES, TILE_K)
                cur = torch.einsum("ints,sr->inr", w, xt)  # each K tile times the same token rows
                if prev is not None:
                    cur = cur + prev[torch.arange(items, device=cur.device) % len(prev)]
                prev, q = cur, q + 1
        return prev


def compile_sm90(slots: int, coupled: bool, layers: int = 12, **flags):
    """The kernel compiled for sm_90a without a GPU (what the CPU tests check it builds to); flags: DEP,
    BARRIERS, MMA."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import create_function_from_signature

    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    fn = streamed_layers
    items = phase_table()[1]
    w = torch.empty(items * 64, BK, dtype=torch.bfloat16)
    x = torch.empty(ROWS, TILE_K, dtype=torch.bfloat16)
    w_desc = TensorDescriptor.from_tensor(w, [64, TILE_K], gl.NVMMASharedLayout.get_default_for([64, TILE_K],
                                                                                                  gl.bfloat16))
    x_desc = TensorDescriptor.from_tensor(x, [ROWS, TILE_K], gl.NVMMASharedLayout.get_default_for([ROWS, TILE_K],
                                                                                                   gl.bfloat16))
    out, tab, bar = torch.empty(2, 512, 64, 32), torch.empty(16, dtype=torch.int32), torch.empty(1, dtype=torch.int32)
    kw = dict(SLOTS=slots, COUPLED=coupled, OUT_STRIDE=512 * 2048, num_warps=4, **flags)
    bound, spec, options = create_function_from_signature(fn.signature, fn.params, backend)(
        w_desc, x_desc, out, tab, bar, layers, items, **kw)
    options, signature, constexprs, attrs = fn._pack_args(backend, kw, bound, spec, options)
    return triton.compile(GluonASTSource(fn, signature, constexprs, attrs), target=target, options=options.__dict__)


def timed_us(fn, reps: int) -> list:
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1000)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--slots", default="16,24")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    res = {"device": torch.cuda.get_device_name(), "phases": PHASES, "rows": ROWS}
    check = Setup(1)
    for coupled in (False, True):
        check.launch(16, coupled)
        torch.cuda.synchronize()
        want = check.reference()
        items = check.table[-1][2]
        last = (4 - 1) % 2  # the fourth phase (q = 3) wrote buffer 1
        err = (check.out[last, :items] - want).abs().max().item()
        res[f"check_max_abs_{'coupled' if coupled else 'streamed'}"] = err
        print(f"one layer, {'coupled' if coupled else 'streamed'}: max abs vs PyTorch {err:.3e} "
              f"(values up to {want.abs().max().item():.2f})", flush=True)
    del check
    s = Setup(args.layers)
    nbytes = s.w.numel() * 2
    read = timed_us(lambda: s.w.view(torch.float32).sum(), 5)
    res["read_all_weights_us"] = statistics.median(read)  # a plain read of the same bytes (PyTorch's sum)
    print(f"{nbytes / 1e6:.0f} MB of weights; PyTorch reads them in {res['read_all_weights_us']:.0f} us "
          f"({nbytes / res['read_all_weights_us'] / 1e6:.2f} TB/s)", flush=True)
    res["runs"] = []
    # (coupled, dep, barriers, mma): the layer as built, without the reads of the previous phase, without
    # the grid barriers too (probes: the phases no longer wait for each other), without the products too
    variants = [(False, True, True, True), (True, True, True, True), (False, False, True, True),
                (True, False, True, True), (False, False, False, True), (False, False, False, False)]
    for slots in (int(v) for v in args.slots.split(",")):
        for _ in range(2):
            for coupled, dep, barriers, mma in variants:
                kw = dict(dep=dep, barriers=barriers, mma=mma)
                s.launch(slots, coupled, **kw)  # warm
                us = timed_us(lambda: s.launch(slots, coupled, **kw), args.reps)
                med = statistics.median(us)
                res["runs"].append({"slots": slots, "coupled": coupled, **kw, "us": us, "us_per_layer": med / args.layers})
                name = ("coupled " if coupled else "streamed") + (" dep" if dep else "") + ("" if barriers else
                                                                                           " no-barriers") + (
                    "" if mma else " no-mma")
                print(f"slots {slots:2d} {name:32s}: {med:8.1f} us, {med / args.layers:6.2f} us a layer, "
                      f"{nbytes / med / 1e6:.2f} TB/s", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
