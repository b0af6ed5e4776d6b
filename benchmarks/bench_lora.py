"""Decode step time with LoRA adapters, every row on a different one, against the plain network.

    python3 scripts/make_tiny_checkpoint.py --config benchmarks/voxcpm2_config.json --out /tmp/full --device cuda
    python3 benchmarks/bench_lora.py --checkpoint /tmp/full --out $OUT/lora.json

One VoxCPM2, compiled as served, with LoRA slot tables of --max-loras slots of rank --rank over the
official default targets (base and residual LM, LocDiT: q/k/v/o), filled with random values (speed
depends on shapes, not values). Engines in turn, each capturing its decode graphs (--variants):
`base`, the tables left out (exactly the plain graphs); `kernel`, with them, every decode op in the
Triton kernel (kernels.lora, what the GPU runs); and `lora:N`, the torch formulations, LocDiT's LoRA
"token" up to N rows and "group" above (model.lora.DIT_TOKEN_MAX_ROWS). For each batch size (default 1 and 64):

- step: the decode step alone, its CUDA graph replayed --reps times back to back (rows at KV
  position --context), GPU time per step; with LoRA, row i runs on adapter i;
- e2e: --steps-step requests submitted together (prefill included), steps per second.

And a check on the LoRA engine: a graph replay of rows on different adapters against the same
step run eagerly, and each row alone (eagerly) against its row of the batch.

With `kernel`, the same engine also runs every row on one adapter, which it merges into the weights
(EngineConfig.lora_merge, model.lora_merge) and runs through the plain graphs: `merged_step_ms_b*`
(the step, adapter 1 merged), `e2e_one_adapter_b*` (requests all on adapter a1: the engine merges
by itself), `merge_ms` (GPU time of merging an adapter and restoring the weights, and the host time
of the calls), and `check_merged` (the merged plain graph against the LoRA-op graph, same rows).
The target (issue 18): the LoRA step at most 10% slower than the plain one; `best_*` says which
variant gets closest at each batch.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python_backend"))

import torch  # noqa: E402

from voxcpm_triton import VoxCPM2  # noqa: E402
from voxcpm_triton.engine import Engine, EngineConfig, EngineRequest, Finished  # noqa: E402
from voxcpm_triton.model import lora as lora_model  # noqa: E402

from bench import TEXT, log, sync  # noqa: E402  (benchmarks/bench.py: the offline benchmark's text and helpers)


@torch.no_grad()
def fill_random(loras, seed: int = 0):
    """Random adapters in slots 1..max_loras, named a1, a2, ... (A ~ 1/sqrt(in), B small: stable)."""
    t = loras.tables
    g = torch.Generator(device=t.device).manual_seed(seed)
    for name in t.sites:
        a, b = t.a[name], t.b[name]
        a[1:].normal_(0, 1 / math.sqrt(a.size(-1)), generator=g)
        b[1:].normal_(0, 0.3 / math.sqrt(b.size(-1)), generator=g)
    loras.slots = {f"a{i}": i for i in range(1, t.max_loras + 1)}


def _rows(eng, vox, b: int, context: int, lora: bool, one: bool = False):
    """b rows with state of their own, KV blocks for `context` positions, row i on adapter i + 1
    (one: every row on adapter 1)."""
    r, bs, H = eng.runner, eng.cfg.block_size, vox.cfg.lm_config.hidden_size
    dev = eng.device
    g = torch.Generator(device=dev).manual_seed(b)
    n_blocks = context // bs + 1
    rows = []
    for i in range(b):
        eng.kv.allocator.admit(n_blocks)
        blocks = [eng.kv.allocator.take_reserved() for _ in range(n_blocks)]
        r.write_state(i, torch.randn(H, device=dev, generator=g) * 0.1, torch.randn(H, device=dev, generator=g) * 0.1,
                      torch.randn(vox.patch_size, vox.feat_dim, device=dev, generator=g))
        slot = (0 if one else i % r.lora.max_loras) + 1 if lora else 0
        rows.append((i, 1000 + i, i, context, blocks[context // bs] * bs + context % bs, context + 1, blocks, 2.0, 10,
                     slot))
    return rows


def step_ms(eng, rows, reps: int, plain: bool = False) -> float:
    """GPU time per decode step: `reps` graph replays launched back to back, then collected."""
    r = eng.runner
    for _ in range(3):
        r.collect(r.launch(rows, plain=plain))
    sync()
    t0 = time.perf_counter()
    launched = [r.launch(rows, plain=plain) for _ in range(reps)]
    for s in launched:
        r.collect(s)
    sync()
    return (time.perf_counter() - t0) * 1000 / reps


def e2e(eng, prompt, batch: int, steps: int, lora: bool, tag: str, one: bool = False) -> dict:
    done = threading.Semaphore(0)
    errors = []

    def sink(ev):
        if isinstance(ev, Finished):
            if ev.error:
                errors.append(ev.error)
            done.release()

    t0 = time.perf_counter()
    for i in range(batch):
        name = f"a{(0 if one else i % eng.loras.registry.max_loras) + 1}" if lora else None
        eng.submit(EngineRequest(f"{tag}-{batch}-{i}", prompt, seed=i, min_len=steps, max_len=steps, lora=name),
                   sink=sink)
    for _ in range(batch):
        done.acquire(timeout=3600)
    wall = time.perf_counter() - t0
    assert not errors, errors[:3]
    return {"wall_s": wall, "steps_per_s": steps / wall}


def _state_snapshot(r):
    """The runner's per-slot decode state now -> a function that puts it back (a check's runs of
    the same rows each start from it)."""
    bufs = (r.lm_state, r.res_state, r.prev_state)
    snap = [t.clone() for t in bufs]

    def restore():
        for t, s in zip(bufs, snap):
            t.copy_(s)

    return restore


@torch.no_grad()
def check(eng, vox, context: int) -> dict:
    """Rows on different adapters: graph replay == eager step of the batch; each row alone == its row."""
    r = eng.runner
    rows = _rows(eng, vox, 4, context, lora=True)
    restore = _state_snapshot(r)
    graph, _ = r.collect(r.launch(rows))
    restore()
    r.use_graphs = False
    try:
        eager, _ = r.collect(r.launch(rows, r.bucket(4)))
        solo = []
        for row in rows:
            restore()
            solo.append(r.collect(r.launch([row], 2))[0])
    finally:
        r.use_graphs = True
    restore()
    for row in rows:
        eng.kv.allocator.release(row[6], 0)
    solo = torch.cat(solo)
    cos = torch.nn.functional.cosine_similarity(solo.flatten(1), eager.flatten(1), dim=1).min().item()
    scale = eager.abs().max().item()
    out = {"graph_vs_eager_max_abs": (graph - eager).abs().max().item(),
           "solo_vs_batched_cosine_min": cos, "solo_vs_batched_max_abs": (solo - eager).abs().max().item(),
           "eager_max_abs": scale}
    out["pass"] = out["graph_vs_eager_max_abs"] <= 1e-2 * scale and cos >= 0.99
    return out


@torch.no_grad()
def merge_ms(eng, reps: int = 5) -> dict:
    """Merging adapter 1 into the weights and restoring them: GPU ms (events), host ms of the calls."""
    m = eng.merged
    out = {"sites": len(m.sites), "copy_mib": m.nbytes() / 2**20}
    for what, slot in (("merge", 1), ("restore", 0)):
        gpu, host = [], []
        for _ in range(reps):
            m.hold(0 if slot else 1)
            sync()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            t0 = time.perf_counter()
            m.hold(slot)
            host.append((time.perf_counter() - t0) * 1000)
            e1.record()
            sync()
            gpu.append(e0.elapsed_time(e1))
        out[f"{what}_gpu_ms"], out[f"{what}_host_ms"] = sorted(gpu)[reps // 2], sorted(host)[reps // 2]
    m.hold(0)
    return out


@torch.no_grad()
def check_merged(eng, vox, context: int) -> dict:
    """Rows all on adapter 1: its LoRA ops over the weights as loaded (graph) against the plain graph
    over the merged weights, and against the plain graph over the weights as loaded (the base model:
    how far the adapter moves the step, which the merged step must follow)."""
    r = eng.runner
    rows = _rows(eng, vox, 4, context, lora=True, one=True)
    restore = _state_snapshot(r)
    out = {}
    for name, slot, plain in (("ops", 0, False), ("merged", 1, True), ("base", 0, True)):
        restore()
        eng.merged.hold(slot)
        out[name], _ = r.collect(r.launch(rows, plain=plain))
    eng.merged.hold(0)
    for row in rows:
        eng.kv.allocator.release(row[6], 0)
    ops, merged, base = out["ops"], out["merged"], out["base"]
    cos = torch.nn.functional.cosine_similarity(ops.flatten(1), merged.flatten(1), dim=1).min().item()
    res = {"max_abs": (ops - merged).abs().max().item(), "cosine_min": cos, "ops_max_abs": ops.abs().max().item(),
           "base_vs_ops_max_abs": (ops - base).abs().max().item()}
    res["pass"] = cos >= 0.99 and res["max_abs"] < res["base_vs_ops_max_abs"] / 4
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--max-loras", type=int, default=64)
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--context", type=int, default=200, help="KV position of the timed steps' rows")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--kv-gb", type=float, default=8.0)
    ap.add_argument("--out", default=os.path.join(REPO, "benchmarks", "lora.json"))
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke run on the tiny checkpoint")
    ap.add_argument("--variants", default="base,kernel",
                    help="base; kernel (kernels.lora, what the GPU runs); lora:N (the torch formulations: "
                         "LocDiT's LoRA per token up to N rows, batched matmuls above)")
    args = ap.parse_args()
    batches = [int(x) for x in args.batches.split(",")]

    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as empty:  # the tables are filled here, not from files
        gpu = args.device == "cuda"
        vox = VoxCPM2.from_pretrained(args.checkpoint, device=args.device, dtype="bfloat16" if gpu else "float32",
                                      compile=gpu, lora_dir=empty, max_loras=args.max_loras, max_lora_rank=args.rank,
                                      reserve_lora_targets="default")
    fill_random(vox.loras)
    tables = vox.loras
    log(f"loaded in {time.monotonic() - t0:.1f} s; LoRA tables {tables.tables.nbytes() / 2**30:.2f} GiB over "
        f"{len(tables.tables.sites)} layers")
    prompt = vox.prepare_prompt(TEXT)
    result = {"config": vars(args), "gpu": torch.cuda.get_device_name() if gpu else "cpu", "torch": torch.__version__,
              "lora_tables_gib": tables.tables.nbytes() / 2**30, "lora_sites": len(tables.tables.sites)}
    cfg = EngineConfig(max_num_seqs=max(max(batches), 4), kv_memory_bytes=int(args.kv_gb * 2**30),  # check(): 4 rows
                       timestep_buckets=(10, 100), enable_prefix_caching=False)
    variants = args.variants.split(",")
    for variant in variants:
        lora = variant != "base"
        tables.tables.kernel = variant == "kernel"
        if variant.startswith("lora"):
            lora_model.DIT_TOKEN_MAX_ROWS = int(variant.split(":")[1]) if ":" in variant else 8
        vox.loras = tables if lora else None  # the engine takes the tables (or none) at start
        t1 = time.monotonic()
        eng = Engine(vox, cfg)
        vox.loras = tables
        res = {"startup_s": time.monotonic() - t1, "graphs": eng.capture_summary}
        log(f"[{variant}] engine ready in {res['startup_s']:.1f} s ({eng.capture_summary})")
        with torch.no_grad():
            for b in batches:
                rows = _rows(eng, vox, b, args.context, lora)
                res[f"step_ms_b{b}"] = step_ms(eng, rows, args.reps)
                for row in rows:
                    eng.kv.allocator.release(row[6], 0)
                log(f"[{variant}] batch {b}: {res[f'step_ms_b{b}']:.2f} ms per step")
                if eng.merged is not None:
                    rows = _rows(eng, vox, b, args.context, lora, one=True)
                    eng.merged.hold(1)
                    res[f"merged_step_ms_b{b}"] = step_ms(eng, rows, args.reps, plain=True)
                    eng.merged.hold(0)
                    for row in rows:
                        eng.kv.allocator.release(row[6], 0)
                    log(f"[{variant}] batch {b}, one adapter merged: {res[f'merged_step_ms_b{b}']:.2f} ms per step")
        for b in batches:
            res[f"e2e_b{b}"] = e2e(eng, prompt, b, args.steps, lora, variant)
            log(f"[{variant}] batch {b}: {res[f'e2e_b{b}']['steps_per_s']:.1f} steps/s end to end")
            if eng.merged is not None:
                res[f"e2e_one_adapter_b{b}"] = e2e(eng, prompt, b, args.steps, lora, variant + "-one", one=True)
                log(f"[{variant}] batch {b}, one adapter: {res[f'e2e_one_adapter_b{b}']['steps_per_s']:.1f} steps/s")
        if lora:
            res["check"] = check(eng, vox, args.context)
            log(f"[{variant}] check: {res['check']}")
        if eng.merged is not None:
            res["check_merged"] = check_merged(eng, vox, args.context)
            res["merge_ms"] = merge_ms(eng) if gpu else None
            log(f"[{variant}] merged check: {res['check_merged']}; merge: {res['merge_ms']}")
        eng.shutdown()
        del eng
        if gpu:
            torch.cuda.empty_cache()
        result[variant] = res
    if "base" in result:
        for b in batches:
            base = result["base"][f"step_ms_b{b}"]
            ratios = {}
            for v in (v for v in variants if v != "base"):
                ratios[v] = result[v][f"step_ms_b{b}"] / base
                e2e_ratio = result["base"][f"e2e_b{b}"]["steps_per_s"] / result[v][f"e2e_b{b}"]["steps_per_s"]
                result[f"{v}_over_base_step_b{b}"], result[f"{v}_over_base_e2e_b{b}"] = ratios[v], e2e_ratio
                log(f"batch {b}: {v} step {result[v][f'step_ms_b{b}']:.2f} ms vs {base:.2f} ms plain: "
                    f"x{ratios[v]:.3f} (target <= 1.10); end to end x{e2e_ratio:.3f}")
                if f"merged_step_ms_b{b}" in result[v]:
                    m = result[v][f"merged_step_ms_b{b}"] / base
                    m_e2e = result["base"][f"e2e_b{b}"]["steps_per_s"] / result[v][f"e2e_one_adapter_b{b}"]["steps_per_s"]
                    result[f"{v}_merged_over_base_step_b{b}"], result[f"{v}_merged_over_base_e2e_b{b}"] = m, m_e2e
                    log(f"batch {b}: {v}, one adapter merged: x{m:.3f} step, x{m_e2e:.3f} end to end")
            if ratios:
                best = min(ratios, key=ratios.get)
                result[f"best_b{b}"] = {"variant": best, "step_ratio": ratios[best], "target_met": ratios[best] <= 1.10}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
