"""FP8 weights against bf16 on the same checkpoint: quality and decode-step speed (one GPU).

    python3 benchmarks/fp8_quality.py --checkpoint /tmp/full --out $OUT/fp8_quality.json

Quality (eager models, the same prompt and noise for every precision):
1. teacher-forced: each step, every precision's patch is compared with the bf16 patch while both
   are fed the bf16 run's history (its patch goes into the LMs, its previous patch conditions the
   CFM); per-step cosine over --steps steps, min and median. fp32 is measured the same way as a
   yardstick: how far a precision change the project already accepts moves the patches.
2. free-running: each precision generates --steps patches on its own (same seed, no stop); the
   latents' distance to bf16's, relative L2 overall and per step (a chaotic autoregressive
   system: small differences grow, so this is the run-to-run scale, not an error bound).

Speed: the engine as served (compiled, CUDA graphs), batches of --batches requests decoding
together, ms per step in the steady state (the engine's step counter over a window, while every
request is past its prefill), bf16 then fp8; RTF at batch 1 = step time / 0.16 s of audio.

Random weights have no outlier channels like a trained checkpoint's; the per-channel and
per-token scales are there for those, and a real checkpoint should be measured the same way.
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
import torch.nn.functional as F  # noqa: E402

from voxcpm_triton import VoxCPM2  # noqa: E402
from voxcpm_triton.engine import Engine, EngineConfig, EngineRequest, Finished, LatentChunk  # noqa: E402
from voxcpm_triton.model.local_modules import CfmSchedule  # noqa: E402
from voxcpm_triton.model.noise import noise_for_steps  # noqa: E402
from voxcpm_triton.model.precision import quantize_model_fp8  # noqa: E402

TEXT = "Eight bits per weight should sound the same as sixteen, step after step, to the very end."
SEED = 5


def log(*a):
    print(*a, flush=True)


def load(path, precision, dtype="bfloat16", compile=False, device="cuda"):
    if device != "cuda":  # a smoke run of this script: the CPU emulates the FP8 GEMM (from_pretrained refuses it)
        vox = VoxCPM2.from_pretrained(path, device=device, dtype=dtype)
        if precision == "fp8":
            quantize_model_fp8(vox)
            vox.precision = "fp8"
        return vox, 0.0
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    vox = VoxCPM2.from_pretrained(path, device="cuda", dtype=dtype, precision=precision, compile=compile)
    torch.cuda.synchronize()
    return vox, (torch.cuda.memory_allocated() - before) / 2**30


def summary(xs: list[float]) -> dict:
    return {"min": min(xs), "median": statistics.median(xs), "mean": sum(xs) / len(xs)}


@torch.inference_mode()
def teacher_forced(teacher: VoxCPM2, students: dict, steps: int) -> dict:
    """Per student, the per-step cosine of its patch with the teacher's, fed the teacher's history."""
    prompt = teacher.prepare_prompt(TEXT)
    dev = teacher.device
    noise = noise_for_steps(SEED, steps, (teacher.feat_dim, teacher.patch_size)).to(dev)
    T = len(prompt)
    runs = {"teacher": teacher, **students}
    state = {k: v.prefill(prompt, T + steps) for k, v in runs.items()}
    prev = prompt.feats[-1:].to(dev)
    cfg = torch.tensor([2.0], device=dev)
    cos = {k: [] for k in students}
    for i in range(steps):
        pos = torch.tensor([T + i], device=dev)
        out = {}
        for k, v in runs.items():
            s = state[k]
            out[k] = v.model.decode_step(s[0], s[1], prev.to(v.dtype), noise[i:i + 1],
                                         CfmSchedule([10], v.dtype, dev), cfg, pos, s[2], s[3],
                                         teacher_patch=None if k == "teacher" else out["teacher"].patch)
            s[2].advance(1)
            s[3].advance(1)
            state[k] = (out[k].lm_hidden, out[k].residual_hidden, *s[2:])
        ref = out["teacher"].patch.float().flatten()
        for k in students:
            cos[k].append(F.cosine_similarity(out[k].patch.float().flatten(), ref, dim=0).item())
        prev = out["teacher"].patch
    return {k: {**summary(c), "per_step": c} for k, c in cos.items()}


@torch.inference_mode()
def free_running(models: dict, steps: int) -> dict:
    lat = {k: v.generate_latents(TEXT, seed=SEED, min_len=steps, max_len=steps, retry_badcase=False)
           for k, v in models.items()}
    ref = lat["bf16"]
    out = {}
    for k, x in lat.items():
        if k == "bf16":
            continue
        per_step = ((x - ref).flatten(1).norm(dim=1) / ref.flatten(1).norm(dim=1)).tolist()
        out[k] = {"relative_l2": ((x - ref).norm() / ref.norm()).item(),
                  "cosine": F.cosine_similarity(x.flatten(), ref.flatten(), dim=0).item(),
                  "relative_l2_first_10_steps": ((x[:10] - ref[:10]).norm() / ref[:10].norm()).item(),
                  "relative_l2_per_step": per_step, "steps": x.size(0)}
    return out


def step_times(vox: VoxCPM2, batches, window: int) -> dict:
    """ms per decode step at each batch, steady state, as `bench.profile_step` measures it."""
    eng = Engine(vox, EngineConfig(max_num_seqs=max(batches), kv_memory_bytes=4 << 30, prefill_graphs=False,
                                   timestep_buckets=(10, 100)))
    prompt = vox.prepare_prompt(TEXT)
    res = {"graphs": sum(g is not None for g in eng.runner.graphs.values()), "runs": []}
    try:
        for b in batches:
            started, done, seen = threading.Semaphore(0), threading.Semaphore(0), set()

            def sink(ev, started=started, done=done, seen=seen):
                if isinstance(ev, LatentChunk) and ev.request_id not in seen:
                    seen.add(ev.request_id)
                    started.release()
                elif isinstance(ev, Finished):
                    done.release()

            n = window + 40  # steps left once the window starts
            for i in range(b):
                eng.submit(EngineRequest(f"t{b}-{i}", prompt, seed=i, min_len=n, max_len=n), sink=sink)
            for _ in range(b):
                assert started.acquire(timeout=600)
            s0, t0 = eng.stats()["steps"], time.perf_counter()
            while eng.stats()["steps"] - s0 < window:
                time.sleep(0.0005)
            steps, wall = eng.stats()["steps"] - s0, time.perf_counter() - t0
            for _ in range(b):
                assert done.acquire(timeout=600)
            ms = wall / steps * 1000
            audio_per_step = vox.patch_size * vox.vae.chunk_size / vox.vae.sample_rate
            res["runs"].append({"batch": b, "ms_per_step": ms, "rtf": ms / 1000 / audio_per_step,
                                "aggregate_xrt": b * audio_per_step / (ms / 1000)})
            log(f"[speed {vox.precision}] batch {b:3d}: {ms:6.2f} ms per step  RTF {ms / 1000 / audio_per_step:.4f}")
    finally:
        eng.shutdown()
    res["gpu_mem_peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--window", type=int, default=40, help="steps timed per batch")
    ap.add_argument("--no-fp32", action="store_true", help="skip the fp32 yardstick")
    ap.add_argument("--no-speed", action="store_true")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run of the quality part on a tiny checkpoint")
    args = ap.parse_args()
    batches = [int(x) for x in args.batches.split(",")]
    t_start = time.perf_counter()
    gpu = args.device == "cuda"
    result = {"device": torch.cuda.get_device_name(0) if gpu else args.device, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
              "checkpoint": args.checkpoint, "steps": args.steps, "text": TEXT, "seed": SEED}

    models, mem = {}, {}
    for name, precision, dtype in [("bf16", "bf16", "bfloat16"), ("fp8", "fp8", "bfloat16")] + \
            ([] if args.no_fp32 else [("fp32", "bf16", "float32")]):
        models[name], mem[name] = load(args.checkpoint, precision, dtype, device=args.device)
    result["weights_gib"] = mem
    log(f"[load] weights (GiB): {mem}")
    students = {k: v for k, v in models.items() if k != "bf16"}
    result["teacher_forced_cosine_vs_bf16"] = tf = teacher_forced(models["bf16"], students, args.steps)
    for k, v in tf.items():
        log(f"[teacher-forced] {k} vs bf16 over {args.steps} steps: cosine min {v['min']:.5f} median {v['median']:.5f}")
    result["free_running_vs_bf16"] = fr = free_running(models, args.steps)
    for k, v in fr.items():
        log(f"[free-running] {k} vs bf16 over {v['steps']} steps: relative L2 {v['relative_l2']:.4f} "
            f"(first 10 steps {v['relative_l2_first_10_steps']:.4f}), cosine {v['cosine']:.5f}")
    result["fp8_patch_cosine_min"] = tf["fp8"]["min"]
    del models, students
    if gpu:
        torch.cuda.empty_cache()
    log(f"[quality] done at {time.perf_counter() - t_start:.0f} s")

    if gpu and not args.no_speed:
        speed = {}
        for precision in ("bf16", "fp8"):
            torch._dynamo.reset()  # the layer math is compiled per process: each precision on its own
            torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            vox, _ = load(args.checkpoint, precision, compile=True)
            speed[precision] = step_times(vox, batches, args.window)
            speed[precision]["startup_s"] = time.perf_counter() - t0
            del vox
            torch.cuda.empty_cache()
        result["decode_step"] = speed
        for b in batches:
            r = {p: next(x for x in speed[p]["runs"] if x["batch"] == b)["ms_per_step"] for p in speed}
            log(f"[speed] batch {b:3d}: bf16 {r['bf16']:.2f} ms, fp8 {r['fp8']:.2f} ms ({r['bf16'] / r['fp8']:.2f}x)")
        if 1 in batches:
            result["single_stream_rtf_offline_fp8"] = speed["fp8"]["runs"][batches.index(1)]["rtf"]
    result["wall_s"] = time.perf_counter() - t_start
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    log(json.dumps({k: v for k, v in result.items() if k not in ("teacher_forced_cosine_vs_bf16",
                                                                  "free_running_vs_bf16", "decode_step")}, indent=1))


if __name__ == "__main__":
    main()
