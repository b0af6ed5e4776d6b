"""Start-up of the decoder engine on a GPU, phase by phase, as the served `decoder` builds it:

    TORCH_LOGS=recompiles python benchmarks/startup_check.py --checkpoint /tmp/full

prints load time, each start-up phase (`Engine.startup_s`) and peak GPU memory; with
TORCH_LOGS=recompiles torch also says what made a compiled function compile again (any
recompile after the decode graphs' first compile is start-up time spent twice). --bursts 1,7,16
then submits waves of that many requests at once, each after the last has finished, and prints
each wave's first-patch latency: a wave that meets a shape start-up did not compile stalls.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python_backend"))

import torch  # noqa: E402

from voxcpm_triton import VoxCPM2  # noqa: E402
from voxcpm_triton.engine import Engine, EngineConfig  # noqa: E402

from bench import TEXT, run_batch  # noqa: E402  (benchmarks/bench.py: the offline benchmark's text and waves)


def compiled_kernels() -> set:
    """The Triton kernels compiled so far (their cache entries, Triton's own and inductor's)."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    roots = [os.environ.get("TRITON_CACHE_DIR", os.path.expanduser("~/.triton/cache")), cache_dir()]
    return {p for r in roots for p in glob.glob(os.path.join(r, "**", "*.json"), recursive=True)}


def wave(eng, vox, prompt, n: int, tag: str, steps: int = 20) -> dict:
    """Submit n requests at once (bench.run_batch); ms from the submit to their first latent
    patches, and the kernels compiled meanwhile."""
    before = compiled_kernels()
    r = run_batch(eng, vox, prompt, n, steps, tag)
    new = sorted(os.path.basename(p) for p in compiled_kernels() - before)
    return {"requests": n, "first_patch_ms_p50": r["ttfa_ms_p50"], "first_patch_ms_max": r["ttfa_ms_max"],
            "compiled": new}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--max-batch", type=int, default=128, help="the decoder's max_num_seqs (config.pbtxt: 128)")
    ap.add_argument("--out", help="write the phases as JSON here")
    ap.add_argument("--bursts", default="", help="after start-up, waves of this many requests at once (e.g. 1,7,16)")
    a = ap.parse_args()
    t0 = time.monotonic()
    vox = VoxCPM2.from_pretrained(a.checkpoint, device="cuda", dtype="bfloat16", compile=True)  # as served
    load = time.monotonic() - t0
    eng = Engine(vox, EngineConfig(max_num_seqs=a.max_batch, chunk_schedule=(1, 4, 16)))
    res = {"device": torch.cuda.get_device_name(), "load_s": load, **{f"{k}_s": v for k, v in eng.startup_s.items()},
           "total_s": time.monotonic() - t0, "gpu_mem_peak_gib": torch.cuda.max_memory_allocated() / 2**30}
    if a.bursts:
        prompt = vox.prepare_prompt(TEXT)
        res["bursts"] = [wave(eng, vox, prompt, int(n), f"w{k}") for k, n in enumerate(a.bursts.split(","))]
        for w in res["bursts"]:
            print(f"[burst] {w['requests']} at once: first patch p50 {w['first_patch_ms_p50']:.0f} ms, "
                  f"max {w['first_patch_ms_max']:.0f} ms; compiled meanwhile: {w['compiled']}", flush=True)
    eng.shutdown()
    print(json.dumps(res, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
