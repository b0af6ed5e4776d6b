"""Where a lone request's step time goes in the engine loop: host work against GPU work, step by step.

The engine launches step N+1 before it waits for step N, so the GPU should never wait for the host.
This times each step of one long request (CUDA graphs, torch.compile, as served) from both sides:

- on the host (perf_counter): `runner.launch` (fill the inputs, replay the graph, queue the copy out),
  `runner.collect` (the wait for the step), and the rest of the loop between them;
- on the GPU (CUDA events around each launch): the step's own time, and the gap before the next one
  (the GPU idle, waiting for the host).

    python3 benchmarks/engine_loop.py --checkpoint /tmp/full --out $OUT/engine_loop.json

Medians over the steady steps (the first WARM steps left out).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python_backend"))
from voxcpm_triton import VoxCPM2  # noqa: E402
from voxcpm_triton.engine import Engine, EngineConfig, EngineRequest, Finished  # noqa: E402
from cli import batch_buckets, launch_field, timestep_buckets  # noqa: E402

TEXT = "The quick brown fox jumps over the lazy dog, and then it keeps on running through the field."
WARM = 20


def trace(engine: Engine, prompt, steps: int) -> dict:
    runner = engine.runner
    launch, collect = runner.launch, runner.collect
    rec: list = []  # per launch: host start, host end, GPU events before and after
    waits: dict = {}  # id(step) -> (collect start, collect end)

    def timed_launch(rows, *a, **k):
        before, after = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        before.record()
        step = launch(rows, *a, **k)
        after.record()
        rec.append((t0, time.perf_counter(), before, after, step))
        return step

    def timed_collect(step):
        t0 = time.perf_counter()
        out = collect(step)
        waits[id(step)] = (t0, time.perf_counter())
        return out

    done = threading.Event()
    runner.launch, runner.collect = timed_launch, timed_collect
    try:
        t0 = time.perf_counter()
        engine.submit(EngineRequest("loop", prompt, seed=1, min_len=steps, max_len=steps),
                      sink=lambda ev: isinstance(ev, Finished) and done.set())
        assert done.wait(600), "the request did not finish"
        wall = time.perf_counter() - t0
    finally:
        runner.launch, runner.collect = launch, collect
    torch.cuda.synchronize()
    rows = []
    for i in range(WARM, len(rec) - 2):
        h0, h1, b, a, step = rec[i]
        n0, _, nb, _, _ = rec[i + 1]
        c0, c1 = waits.get(id(step), (float("nan"), float("nan")))
        rows.append({"interval_ms": (n0 - h0) * 1e3, "launch_ms": (h1 - h0) * 1e3, "wait_ms": (c1 - c0) * 1e3,
                     "gpu_step_ms": b.elapsed_time(a), "gpu_gap_ms": a.elapsed_time(nb)})
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    mean = {k: statistics.fmean(r[k] for r in rows) for k in rows[0]}
    return {"steps": steps, "launches": len(rec), "wall_s": wall, "steps_per_s_whole_request": steps / wall,
            "median": med, "mean": mean,
            "gpu_busy_frac": mean["gpu_step_ms"] / (mean["gpu_step_ms"] + mean["gpu_gap_ms"]),
            "slowest_intervals_ms": sorted((r["interval_ms"] for r in rows), reverse=True)[:10]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--steps", default="100,400")
    ap.add_argument("--attention", default="triton")
    ap.add_argument("--out", default="engine_loop.json")
    ap.add_argument("--launch", type=launch_field, action="append", default=[], metavar="FIELD=VALUE",
                    help="persistent layers with this persistent_layer.Launch field changed (an A/B), repeatable")
    ap.add_argument("--local-launch", type=launch_field, action="append", default=[], metavar="FIELD=VALUE",
                    help="as --launch, LocDiT's and LocEnc's layers only (hidden below the LM's)")
    ap.add_argument("--lm-launch", type=launch_field, action="append", default=[], metavar="FIELD=VALUE",
                    help="as --launch, the LMs' layers only")
    ap.add_argument("--max-batch", type=int, default=1,
                    help="the engine's max_num_seqs: 1 runs the lone request in a bucket of 1, more in the "
                         "smallest of --batch-buckets")
    ap.add_argument("--batch-buckets", type=batch_buckets, default=None,
                    help="the batch buckets with graphs (2,4: a lone request padded to 2 rows); default: the engine's")
    ap.add_argument("--timestep-buckets", type=timestep_buckets, default=None,
                    help="the CFM loop buckets to capture (as served: 10,100); default: the engine's")
    ap.add_argument("--precision", default="bf16", choices=["bf16", "fp8"], help="linear weights (model.precision)")
    ap.add_argument("--no-chain", action="store_true",
                    help="stacked persistent layers each compute their own input norm (an A/B of the hand-on)")
    args = ap.parse_args()
    if args.no_chain:
        from voxcpm_triton.model import minicpm
        forward = minicpm.DecoderLayer.forward
        minicpm.DecoderLayer.forward = lambda self, *a, next_norm=None, **k: forward(self, *a, **k)
    # every persistent layer launch the engine resolves (with the --launch options' changes), for the record
    from voxcpm_triton.kernels import persistent_layer as pl
    with open(os.path.join(args.checkpoint, "config.json")) as f:
        lm_hidden = json.load(f)["lm_config"]["hidden_size"]
    chosen, launches = pl.choose_launch, {}

    def choose_launch(H, HO, I, tokens, device, elem, fp8=False):
        launch = chosen(H, HO, I, tokens, device, elem, fp8)
        changes = dict(args.launch) | dict(args.lm_launch if H >= lm_hidden else args.local_launch)
        launch = launch and launch._replace(**changes)
        launches[f"hidden {H}, {tokens} tokens{', e4m3' if fp8 else ''}"] = launch and launch._asdict()
        return launch

    pl.choose_launch = choose_launch
    t0 = time.perf_counter()
    vox = VoxCPM2.from_pretrained(args.checkpoint, device="cuda", dtype="bfloat16", attention=args.attention,
                                  compile=True, precision=args.precision)
    buckets = {} if args.timestep_buckets is None else {"timestep_buckets": args.timestep_buckets}
    if args.batch_buckets is not None:
        buckets["batch_buckets"] = args.batch_buckets
    eng = Engine(vox, EngineConfig(max_num_seqs=args.max_batch, cuda_graphs=True, **buckets))
    ready_s = time.perf_counter() - t0
    print(f"[engine_loop] ready after {ready_s:.1f} s; capture seconds per batch bucket "
          f"{eng.runner.capture_seconds}", flush=True)
    prompt = vox.prepare_prompt(TEXT)
    res = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
           "env": {k: v for k, v in os.environ.items() if k.startswith("VOXCPM_")}, "launch": args.launch,
           "local_launch": args.local_launch, "lm_launch": args.lm_launch,
           "precision": args.precision, "max_batch": args.max_batch, "timestep_buckets": args.timestep_buckets,
           "batch_buckets": eng.runner.buckets, "ready_s": ready_s, "startup_s": eng.startup_s,
           "capture_seconds": eng.runner.capture_seconds,
           "no_chain": args.no_chain, "launches": launches, "runs": []}
    try:
        trace(eng, prompt, 40)  # warm
        for steps in (int(s) for s in args.steps.split(",")):
            r = trace(eng, prompt, steps)
            res["runs"].append(r)
            m = r["median"]
            print(f"[engine_loop] {steps} steps: {r['steps_per_s_whole_request']:.1f} steps/s over the request; "
                  f"median interval {m['interval_ms']:.3f} ms = GPU step {m['gpu_step_ms']:.3f} + gap "
                  f"{m['gpu_gap_ms']:.3f}; host: launch {m['launch_ms']:.3f}, wait {m['wait_ms']:.3f}; "
                  f"GPU busy {r['gpu_busy_frac']:.3f}", flush=True)
    finally:
        eng.shutdown()
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
