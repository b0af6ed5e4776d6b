"""Bursts against the engine with and without packed prefill graphs (decoder parameter
`prefill_pack_graphs`), one process, one GPU:

    python benchmarks/prefill_burst.py --checkpoint /tmp/full --out $OUT/prefill_burst.json

For each setting an engine as served (bf16, compile, CUDA graphs, chunks 1,4,16) takes waves of
requests submitted at once, each after the last has finished: every request with a text of its
own (its first tokens differ, so no prefix is cached) and, separately, all with one text (a wave
is matched against the cache as it was before it: the text's first wave prefills every prompt
whole, the later ones start every prompt from the text's cached blocks). Per wave: ms from the
submit to each request's first latent patch (p50, max), and the engine thread's time in `_prefill`
(host time: eager prefills are launch-bound, graph replays are not). Each figure is the median
over --reps waves per size, taken column by column.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python_backend"))

import torch  # noqa: E402

from voxcpm_triton import VoxCPM2  # noqa: E402
from voxcpm_triton.engine import Engine, EngineConfig, EngineRequest, Finished, LatentChunk  # noqa: E402

from bench import TEXT  # noqa: E402
from cli import int_list, timestep_buckets  # noqa: E402


def wave(eng, prompts: list, steps: int, tag: str) -> dict:
    t0 = time.perf_counter()
    first, done = {}, threading.Semaphore(0)

    def sink(ev):  # on the engine thread
        if isinstance(ev, LatentChunk) and ev.first_step == 0:
            first[ev.request_id] = time.perf_counter() - t0
        elif isinstance(ev, Finished):
            done.release()

    eng.prefill_host_s = 0.0
    with eng._lock:  # one admission
        for i, p in enumerate(prompts):
            eng.submit(EngineRequest(f"{tag}-{i}", p, seed=i, min_len=steps, max_len=steps), sink=sink)
    for _ in prompts:
        if not done.acquire(timeout=600):
            raise RuntimeError(f"{tag}: a request did not finish")
    prefill_s = eng.prefill_host_s
    ms = sorted(1000 * v for v in first.values())
    return {"first_patch_ms_p50": ms[len(ms) // 2], "first_patch_ms_max": ms[-1], "prefill_host_ms": 1000 * prefill_s}


def timed_prefill(eng):
    """Count the engine thread's host time in `_prefill` (eng.prefill_host_s)."""
    inner = eng._prefill

    def run(states):
        t = time.perf_counter()
        try:
            return inner(states)
        finally:
            eng.prefill_host_s += time.perf_counter() - t

    eng.prefill_host_s = 0.0
    eng._prefill = run


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--sizes", type=int_list, default=(4, 8, 32, 64, 128))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--max-batch", type=int, default=128)
    ap.add_argument("--timestep-buckets", type=timestep_buckets, default=(10, 100))
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run on the tiny checkpoint (no graphs)")
    ap.add_argument("--out")
    a = ap.parse_args()
    gpu = a.device == "cuda"
    sizes = a.sizes
    vox = VoxCPM2.from_pretrained(a.checkpoint, device=a.device, dtype="bfloat16" if gpu else "float32", compile=gpu)
    distinct = [vox.prepare_prompt(f"Request {i}: {TEXT}") for i in range(max(sizes))]
    shared = vox.prepare_prompt(TEXT)
    res = {"device": torch.cuda.get_device_name() if gpu else "cpu", "sizes": sizes, "reps": a.reps, "steps": a.steps,
           "prompt_positions": len(distinct[0]), "runs": {}}
    for packed in (True, False):
        t0 = time.monotonic()
        eng = Engine(vox, EngineConfig(max_num_seqs=a.max_batch, chunk_schedule=(1, 4, 16),
                                       timestep_buckets=a.timestep_buckets,
                                       prefill_pack_graphs=packed))
        print(f"[burst] engine (pack graphs {packed}) ready in {time.monotonic() - t0:.0f} s", flush=True)
        timed_prefill(eng)
        wave(eng, distinct[:8], a.steps, "warm")  # first-call effects out of the way
        out = res["runs"][str(packed).lower()] = {}
        for kind, prompts_for in (("distinct", lambda n: distinct[:n]), ("shared", lambda n: [shared] * n)):
            for n in sizes:
                waves = [wave(eng, prompts_for(n), a.steps, f"{kind}{n}r{r}") for r in range(a.reps)]
                row = {k: statistics.median(w[k] for w in waves) for k in waves[0]}
                out[f"{kind}_{n}"] = row
                print(f"[burst] packs {packed}: {kind} x{n}: first patch p50 {row['first_patch_ms_p50']:.1f} ms, "
                      f"max {row['first_patch_ms_max']:.1f} ms, prefill host {row['prefill_host_ms']:.1f} ms",
                      flush=True)
        eng.shutdown()
        del eng
        if gpu:
            torch.cuda.empty_cache()
    print(json.dumps(res, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
