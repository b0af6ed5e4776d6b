"""Offline speed of the decoder engine against the official voxcpm 2.0.3, on one GPU.

    python benchmarks/bench.py --checkpoint /tmp/full --out benchmarks/offline.json

Same full-size random checkpoint for both (speed depends on shapes, not values),
MIN_LENGTH = MAX_LENGTH = --steps so every run decodes the same number of steps.
Audio seconds = steps * patch_size / 25 Hz latents (0.16 s per step for VoxCPM2).

Measures: load and start-up (incl. CUDA graph capture) time and GPU memory; RTF
at batch 1, steps/s and aggregate x real time at each batch size, with graphs
and eagerly; a kernel profile of one step at batch 1 and the largest batch; the
reference's eager and torch.compile (`optimize()`) RTF with the same step count.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python_backend"))

import torch  # noqa: E402

from voxcpm_triton import VoxCPM2  # noqa: E402
from voxcpm_triton.loading import load_audio_vae  # noqa: E402
from voxcpm_triton.engine import Engine, EngineConfig, EngineRequest, Finished, LatentChunk  # noqa: E402

from cli import int_list, timestep_buckets  # noqa: E402
from kernel_kinds import KERNEL_KINDS, VAE_KERNEL_KINDS  # noqa: E402

TEXT = "The quick brown fox jumps over the lazy dog, and then it runs far away into the quiet green forest."


def log(*a):
    print(*a, flush=True)


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def empty_cache():
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def audio_seconds(vox, steps: int) -> float:
    return steps * vox.patch_size * vox.vae.chunk_size / vox.vae.sample_rate


def run_batch(engine, vox, prompt, batch: int, steps: int, tag: str) -> dict:
    t0 = time.perf_counter()
    first: dict = {}
    done = threading.Semaphore(0)

    def sink(ev):  # runs on the engine thread: timestamps are taken as events are made
        if isinstance(ev, LatentChunk) and ev.first_step == 0:
            first[ev.request_id] = time.perf_counter() - t0
        elif isinstance(ev, Finished):
            done.release()

    for i in range(batch):
        engine.submit(EngineRequest(f"{tag}-{batch}-{i}", prompt, seed=i, min_len=steps, max_len=steps), sink=sink)
    for _ in range(batch):
        if not done.acquire(timeout=3600):
            raise RuntimeError(f"{tag}: a request of the batch of {batch} did not finish within an hour")
    wall = time.perf_counter() - t0
    ttfa = list(first.values())
    audio = audio_seconds(vox, steps)
    return {"batch": batch, "wall_s": wall, "steps_per_s": steps / wall, "rtf": wall / audio,
            "aggregate_xrt": batch * audio / wall, "ttfa_ms_p50": 1000 * sorted(ttfa)[len(ttfa) // 2],
            "ttfa_ms_max": 1000 * max(ttfa)}


def first_audio_latency(engine, vox, prompt, reps: int = 7) -> dict:
    """A lone request, one at a time: submit -> first latent patch (prefill + one step), median;
    and the prefill alone, synchronised: eager (the offline API's) and the engine's graph."""
    ttfa = []
    for i in range(reps):
        got = threading.Event()
        t0 = time.perf_counter()
        stamp = {}

        def sink(ev, stamp=stamp, got=got, t0=t0):
            if isinstance(ev, LatentChunk) and "t" not in stamp:
                stamp["t"] = time.perf_counter() - t0
            elif isinstance(ev, Finished):
                got.set()

        engine.submit(EngineRequest(f"ttfa-{i}", prompt, seed=i, min_len=1, max_len=1), sink=sink)
        got.wait(60)
        ttfa.append(stamp["t"] * 1000)
    def timed(fn):
        xs = []
        with torch.inference_mode():
            for _ in range(reps):
                sync()
                t = time.perf_counter()
                fn()
                sync()
                xs.append((time.perf_counter() - t) * 1000)
        return sorted(xs)[len(xs) // 2]

    res = {"first_patch_ms_p50": sorted(ttfa)[len(ttfa) // 2], "prompt_positions": len(prompt),
           "prefill_eager_ms_p50": timed(lambda: vox.prefill(prompt, len(prompt) + 1))}
    pg = engine.prefill_graphs
    if pg is not None and pg.fits(len(prompt)):
        scratch = [int(x) for x in pg.scratch[:len(prompt)]]  # writes the scratch block only
        res["prefill_graph_ms_p50"] = timed(lambda: pg.run(prompt, scratch))
    log(f"[engine] first patch of a lone request {res['first_patch_ms_p50']:.1f} ms (p50); prefill of its "
        f"{len(prompt)} positions: eager {res['prefill_eager_ms_p50']:.1f} ms, graph "
        f"{res.get('prefill_graph_ms_p50', float('nan')):.1f} ms")
    return res


def summarize_profile(prof, per: int, kinds=KERNEL_KINDS) -> dict:
    """Kernel time per kind and the top kernels, in ms per `per` (steps or calls)."""
    events = [e for e in prof.key_averages() if e.device_time_total > 0]
    by_kind: dict = {}
    for e in events:
        k = next((kind for kind, keys in kinds if any(f in e.key for f in keys)), "other (copies, indexing, ...)")
        by_kind[k] = by_kind.get(k, 0.0) + e.device_time_total / 1000 / per
    every = [{"kernel": e.key[:120], "calls": e.count / per, "cuda_ms": e.device_time_total / 1000 / per}
             for e in sorted(events, key=lambda e: -e.device_time_total)]
    return {"gpu_ms": sum(by_kind.values()), "kernels": sum(e.count for e in events) / per,
            "by_kind_ms": dict(sorted(by_kind.items(), key=lambda kv: -kv[1])), "top": every[:12],
            "all": [k for k in every if k["cuda_ms"] >= 0.005]}  # what "other" holds, per kernel


def top_ops(fn, reps: int = 3, n: int = 15) -> list:
    """The PyTorch ops of `fn()` (eager) with the most GPU time of their own, per call, with their
    input shapes: which layer a kernel of `summarize_profile` belongs to."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        for _ in range(reps):
            fn()
        sync()
    ops = [e for e in prof.key_averages(group_by_input_shape=True)
           if e.key.startswith("aten::") and e.self_device_time_total > 0]
    return [{"op": e.key, "shapes": str(e.input_shapes)[:120], "calls": e.count / reps,
             "self_cuda_ms": e.self_device_time_total / 1000 / reps}
            for e in sorted(ops, key=lambda e: -e.self_device_time_total)[:n]]


def profile_step(engine, vox, prompt, batch: int, steps: int = 8) -> dict:
    """CUDA kernels of `steps` decode steps at `batch`, once every request is past its prefill:
    the top kernels and the time per kind, per step."""
    from torch.profiler import ProfilerActivity, profile

    if not torch.cuda.is_available():
        return {}
    started, done = threading.Semaphore(0), threading.Semaphore(0)
    seen = set()

    def sink(ev):
        if isinstance(ev, LatentChunk) and ev.request_id not in seen:
            seen.add(ev.request_id)
            started.release()
        elif isinstance(ev, Finished):
            done.release()

    n = steps + 40  # enough steps left once the profile starts
    for i in range(batch):
        engine.submit(EngineRequest(f"prof-{batch}-{i}", prompt, seed=i, min_len=n, max_len=n), sink=sink)
    for _ in range(batch):
        started.acquire(timeout=600)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        s0, t0 = engine.stats()["steps"], time.perf_counter()
        while engine.stats()["steps"] - s0 < steps:
            time.sleep(0.001)
        sync()
        measured, wall = engine.stats()["steps"] - s0, time.perf_counter() - t0
    for _ in range(batch):
        done.acquire(timeout=600)
    # wall vs GPU time per step: how busy the engine keeps the GPU (the profiler adds a little host work)
    return {"batch": batch, "steps": measured, "wall_ms_per_step": wall / measured * 1000,
            **summarize_profile(prof, measured)}


def engine_bench(vox, prompt, args) -> dict:
    """vox: built with args' attention, and compiled unless --no-compile (GPU): the graphs run. The
    eager run (no graphs, nothing compiled, as the engine ran before compile moved to the load)
    gets a vox of its own, with the same attention."""
    out = {}
    for graphs in ([True, False] if not args.graphs_only else [True]):
        if not graphs:
            torch._dynamo.reset()
            if vox.compiled:
                vox = VoxCPM2.from_pretrained(args.checkpoint, device=args.device, dtype=vox.dtype,
                                              precision=args.precision,
                                              attention=args.attention)
        t0 = time.perf_counter()
        buckets = {} if args.timestep_buckets is None else {"timestep_buckets": args.timestep_buckets}
        eng = Engine(vox, EngineConfig(max_num_seqs=max(args.batches), cuda_graphs=graphs,
                                       kv_memory_bytes=int(args.kv_gb * 2**30), **buckets))
        startup = time.perf_counter() - t0
        key = "graphs" if graphs else "eager"
        log(f"[engine {key}] start-up {startup:.1f} s")
        res = {"startup_s": startup, "graphs_captured": len(eng.runner.graphs),
               "capture_s_per_bucket": eng.runner.capture_seconds,
               "triton_attention": eng.runner.use_triton, "runs": []}
        run_batch(eng, vox, prompt, 1, 8, "warm")
        res["first_audio"] = first_audio_latency(eng, vox, prompt)
        batches = args.batches if graphs else [b for b in args.batches if b in (1, 64)]
        for b in batches:
            r = run_batch(eng, vox, prompt, b, args.steps, key)
            log(f"[engine {key}] batch {b:4d}: {r['steps_per_s']:7.1f} steps/s  RTF {r['rtf']:.4f}  "
                f"aggregate {r['aggregate_xrt']:8.1f}x real time  TTFA {r['ttfa_ms_p50']:.1f} ms")
            res["runs"].append(r)
        if graphs and not args.no_profile:
            res["profile_batch1"] = profile_step(eng, vox, prompt, 1)
            if 64 in args.batches and max(args.batches) != 64:  # the served load's batch
                res["profile_batch64"] = profile_step(eng, vox, prompt, 64)
            res["profile_batch_max"] = profile_step(eng, vox, prompt, max(args.batches))
            for p in (res.get(k) for k in ("profile_batch1", "profile_batch64", "profile_batch_max")):
                if p:
                    log(f"[profile] batch {p['batch']}: {p['gpu_ms']:.2f} ms of GPU work in {p['wall_ms_per_step']:.2f} "
                        f"ms, {p['kernels']:.0f} kernels per step; "
                        + ", ".join(f"{k} {v:.2f}" for k, v in p["by_kind_ms"].items()))
        if torch.cuda.is_available():
            res["gpu_mem_peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        eng.shutdown()
        out[key] = res
        del eng
        empty_cache()
    return out


def vae_bench(path: str, P: int, dev, streams=(1, 8, 32, 64), chunks=(1, 4, 16)) -> dict:
    """Streaming VAE decode as `vae_decoder` runs it per execute (`VAEStreams.decode`: gather the
    streams' state, decode, scatter it back, audio to the host), fp32, for B streams' chunks of n
    patches: eager, with the snake activations compiled (`audio_vae.compile_snakes`), and replayed as CUDA
    graphs (where captured: B x n <= vae_streams.MAX_GRAPH_PATCHES); then the same two with the
    Triton kernels (`vae_kernels`: residual units, polyphase upsampling). ms per call and x real time."""
    from voxcpm_triton.kernels import vae as vae_kernels
    from voxcpm_triton.audio.vae_streams import VAEStreams

    t0 = time.perf_counter()
    _, vae = load_audio_vae(path, dev)
    load_s = time.perf_counter() - t0
    out = {}
    modes = ["eager", "compiled", "graphs"] + (["triton", "triton_graphs"] if vae_kernels.available() else [])
    for mode in modes:
        t0 = time.perf_counter()
        # Each VAE is built with its backends; "graphs" replays the compiled one, "triton_graphs" the
        # triton one (the Triton kernels and the compiled snakes, as served).
        if mode == "compiled":
            del vae
            empty_cache()
            _, vae = load_audio_vae(path, dev, compile=True)
            out["compile_s"] = time.perf_counter() - t0 - load_s  # the load itself is timed apart
        if mode == "triton":
            del vae
            empty_cache()
            _, vae = load_audio_vae(path, dev, triton_kernels=True, compile=True)
        mem0 = torch.cuda.memory_allocated() if torch.cuda.is_available() else 0
        bank = VAEStreams(vae, P, max_streams=max(streams), cuda_graphs=mode.endswith("graphs"))
        if mode.endswith("graphs"):
            out["capture_s"] = time.perf_counter() - t0
            out["graphs_captured"] = len(bank.graphs)
            out["graph_mem_gib"] = ((torch.cuda.memory_allocated() if torch.cuda.is_available() else 0) - mem0) / 2**30
        for k in range(max(streams)):
            bank.open(k)
        rows = []
        for b in streams:
            for n in chunks:
                keys, z = list(range(b)), torch.randn(b, vae.latent_dim, n * P)
                for _ in range(2):
                    bank.decode(keys, z)
                sync()
                t, reps = time.perf_counter(), 5
                for _ in range(reps):
                    bank.decode(keys, z)
                sync()
                ms = (time.perf_counter() - t) / reps * 1000
                audio = b * n * P * vae.chunk_size / vae.sample_rate
                rows.append({"streams": b, "patches": n, "ms": ms, "audio_s_per_s": audio / (ms / 1000),
                             "graph": (b, n * P) in bank.graphs})
                log(f"[vae {mode}] {b:3d} streams x {n:2d} patches: {ms:7.2f} ms  "
                    f"({audio / (ms / 1000):7.1f}x real time){'  graph' if rows[-1]['graph'] else ''}")
        out[mode] = rows
        if mode in ("compiled", "triton") and torch.cuda.is_available():  # where a large call's GPU time goes
            from torch.profiler import ProfilerActivity, profile

            keys, z = list(range(8)), torch.randn(8, vae.latent_dim, 16 * P)
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(3):
                    bank.decode(keys, z)
                sync()
            out[f"profile_8x16_{mode}"] = prof_ = summarize_profile(prof, 3, VAE_KERNEL_KINDS)
            prof_["top_ops"] = top_ops(lambda bank=bank: bank.decode(keys, z))
            log(f"[vae profile, {mode}] 8 streams x 16 patches: {prof_['gpu_ms']:.1f} ms GPU, "
                f"{prof_['kernels']:.0f} kernels: {prof_['by_kind_ms']}")
        del bank
    return out


class _TokenizerShim:
    """The reference wraps its tokenizer at construction; the benchmark feeds ids directly."""

    vocab: dict = {}


def reference_bench(path: str, prompt, steps: int, compiled: bool, dev: str) -> dict:
    import importlib.machinery
    import types

    # voxcpm imports these at module level; the benchmark never calls them.
    stand_ins = [("librosa", {}), ("transformers", {"PreTrainedTokenizer": object, "LlamaTokenizerFast": object})]
    try:
        import torchaudio  # noqa: F401
    except Exception:  # no build matching this torch
        stand_ins.append(("torchaudio", {}))
    for name, attrs in stand_ins:
        mod = types.ModuleType(name)
        mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
        mod.__dict__.update(attrs)
        sys.modules[name] = mod
    from safetensors.torch import load_file
    from voxcpm.model.voxcpm2 import AudioVAEV2, VoxCPM2Model, VoxCPMConfig

    with open(os.path.join(path, "config.json")) as f:
        cfg = VoxCPMConfig.model_validate_json(f.read())
    t0 = time.perf_counter()
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    model = VoxCPM2Model(cfg, _TokenizerShim(), AudioVAEV2(config=cfg.audio_vae_config), device=dev)
    model = model.to(dtype)
    model.audio_vae = model.audio_vae.float()
    sd = load_file(os.path.join(path, "model.safetensors"))
    sd.update({f"audio_vae.{k}": v for k, v in load_file(os.path.join(path, "audiovae.safetensors")).items()})
    model.load_state_dict(sd, strict=False)
    model = model.to(dev).eval()
    load_s = time.perf_counter() - t0
    args = (prompt.tokens[None].to(dev), prompt.text_mask[None].to(dev).int(), prompt.feats[None].to(dev, dtype),
            prompt.audio_mask[None].to(dev).int())
    audio = steps * cfg.patch_size * model.audio_vae.chunk_size / model.audio_vae.sample_rate
    res = {"load_s": load_s}

    def timed():
        sync()
        t = time.perf_counter()
        model.inference(*args, min_len=steps, max_len=steps, inference_timesteps=10, cfg_value=2.0)
        sync()
        return time.perf_counter() - t

    timed()  # warm-up
    res["eager_rtf"] = [timed() / audio for _ in range(2)]
    log(f"[reference eager] RTF {res['eager_rtf']}")
    if compiled:
        model.optimize()
        res["compile_first_call_s"] = timed()
        res["compiled_rtf"] = [timed() / audio for _ in range(2)]
        log(f"[reference compiled] first call {res['compile_first_call_s']:.1f} s, RTF {res['compiled_rtf']}")
    return res  # the model is freed when this frame goes


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--batches", type=int_list, default=(1, 8, 32, 64, 128))
    ap.add_argument("--kv-gb", type=float, default=8.0)
    ap.add_argument("--timestep-buckets", type=timestep_buckets, default=None,
                    help="CFM loop buckets captured, e.g. 10,100 as served (default: the engine's, every length)")
    ap.add_argument("--out", default=os.path.join(REPO, "benchmarks", "offline.json"))
    ap.add_argument("--reference", choices=["none", "eager", "compiled"], default="compiled")
    ap.add_argument("--graphs-only", action="store_true")
    ap.add_argument("--no-compile", action="store_true", help="CUDA graphs without torch.compile of LocDiT/LocEnc")
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--no-vae", action="store_true", help="skip the streaming VAE decode timing")
    ap.add_argument("--vae-only", action="store_true", help="only the streaming VAE decode timing")
    ap.add_argument("--attention", default="auto", choices=["auto", "triton", "torch"])
    ap.add_argument("--precision", default="bf16", choices=["bf16", "fp8"], help="linear weights (model.precision)")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke run on the tiny checkpoint")
    ap.add_argument("--max-autotune", action="store_true",
                    help="experiment: inductor autotunes its GEMMs (Triton templates against cuBLAS, epilogues fused)")
    ap.add_argument("--fused-max-tokens", type=int, default=None,
                    help="an A/B: the persistent layer's token bound (kernels.persistent_layer.MAX_TOKENS) for this run")
    args = ap.parse_args()
    if args.fused_max_tokens is not None:
        from voxcpm_triton.kernels import persistent_layer
        persistent_layer.MAX_TOKENS = args.fused_max_tokens
    if args.max_autotune:
        import torch._inductor.config as inductor_config
        inductor_config.max_autotune_gemm = True
        inductor_config.max_autotune_gemm_backends = "ATEN,TRITON"

    gpu = args.device == "cuda"
    result = {"device": torch.cuda.get_device_name(0) if gpu else "cpu", "date": time.strftime("%Y-%m-%d"),
              "torch": torch.__version__, "steps": args.steps, "text": TEXT, "precision": args.precision,
              "max_autotune": args.max_autotune, "fused_max_tokens": args.fused_max_tokens,
              "timestep_buckets": None if args.timestep_buckets is None else ",".join(map(str, args.timestep_buckets))}
    t0 = time.perf_counter()
    vox = VoxCPM2.from_pretrained(args.checkpoint, device=args.device, dtype="bfloat16" if gpu else "float32",
                                  attention=args.attention, compile=gpu and not args.no_compile,
                                  precision=args.precision)
    sync()
    result["load_s"] = time.perf_counter() - t0
    result["weights_gib"] = torch.cuda.memory_allocated() / 2**30 if gpu else 0.0
    log(f"[load] {result['load_s']:.1f} s, {result['weights_gib']:.2f} GiB on the GPU")
    prompt = vox.prepare_prompt(TEXT)
    result["prompt_positions"] = len(prompt)
    if not args.no_vae:
        result["vae_stream_decode"] = vae_bench(args.checkpoint, vox.patch_size, vox.device)
    if not args.vae_only:
        result["engine"] = engine_bench(vox, prompt, args)
    del vox
    empty_cache()
    if args.reference != "none" and not args.vae_only:
        result["reference"] = reference_bench(args.checkpoint, prompt, args.steps, args.reference == "compiled",
                                              args.device)
        empty_cache()
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    log(json.dumps({k: v for k, v in result.items() if k != "engine"}, indent=1))


if __name__ == "__main__":
    main()
