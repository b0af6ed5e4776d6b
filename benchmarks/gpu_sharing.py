"""How much a busy decoder slows the VAE decoder when both share one GPU (run on the GPU machine).

    python benchmarks/gpu_sharing.py --checkpoint /tmp/full --out gpu_sharing.json

Triton runs every Python model in its own process, so `decoder` and `vae_decoder` are two CUDA
contexts: their kernels never overlap and the GPU time-slices between them. This times the VAE
decoder's CUDA-graph calls (`VAEStreams.decode`) alone, next to a stand-in decoder (a CUDA graph
of bf16 GEMMs replayed back to back with a host sync each time, like the engine's steps) in
another process, and next to the same load on another stream of the same process.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python_backend"))

import torch  # noqa: E402

SHAPES = ((1, 1), (3, 16), (8, 4))  # (streams, patches per chunk)


def _load_graph(step_ms: float):
    """A CUDA graph of bf16 GEMMs taking about step_ms."""
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    torch.matmul(a, b)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(20):
        torch.matmul(a, b)
    torch.cuda.synchronize()
    reps = max(1, round(step_ms / ((time.perf_counter() - t) / 20 * 1000)))
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        with torch.cuda.graph(g):
            for _ in range(reps):
                torch.matmul(a, b)
    return g


def _load_loop(g, stop, stream=None):
    with torch.cuda.stream(stream or torch.cuda.current_stream()):
        while not stop.is_set():
            g.replay()
            torch.cuda.current_stream().synchronize()  # the engine reads each step's output back


def _load_process(step_ms, ready, stop):
    g = _load_graph(step_ms)
    ready.set()
    _load_loop(g, stop)


@torch.inference_mode()
def _vae_latency(bank, reps=40) -> dict:
    out = {}
    for b, n in SHAPES:
        keys, z = list(range(b)), torch.randn(b, bank.vae.latent_dim, n * bank.P)
        bank.decode(keys, z)
        xs = []
        for _ in range(reps):
            t = time.perf_counter()
            bank.decode(keys, z)
            xs.append((time.perf_counter() - t) * 1000)
            time.sleep(0.003)  # requests arrive spread out, as in serving
        xs.sort()
        out[f"{b}x{n}"] = {"p50_ms": xs[len(xs) // 2], "p90_ms": xs[int(len(xs) * 0.9)]}
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--step-ms", default="10,25")
    ap.add_argument("--out", default="gpu_sharing.json")
    args = ap.parse_args()
    from voxcpm_triton.audio.vae_streams import VAEStreams
    from voxcpm_triton.loading import load_audio_vae

    cfg, vae = load_audio_vae(args.checkpoint, "cuda", compile=True)
    bank = VAEStreams(vae, cfg.patch_size, max_streams=8, cuda_graphs=True)
    for k in range(8):
        bank.open(k)
    res = {"device": torch.cuda.get_device_name(0), "vae_alone": _vae_latency(bank)}
    print("alone", res["vae_alone"], flush=True)
    ctx = mp.get_context("spawn")
    for step_ms in (float(x) for x in args.step_ms.split(",")):
        ready, stop = ctx.Event(), ctx.Event()
        p = ctx.Process(target=_load_process, args=(step_ms, ready, stop))
        p.start()
        ready.wait(120)
        time.sleep(0.5)
        res[f"other_process_{step_ms:g}ms"] = _vae_latency(bank)
        stop.set()
        p.join(30)
        print(f"other process, {step_ms:g} ms steps", res[f"other_process_{step_ms:g}ms"], flush=True)

        g, stop_t = _load_graph(step_ms), threading.Event()
        th = threading.Thread(target=_load_loop, args=(g, stop_t, torch.cuda.Stream()))
        th.start()
        time.sleep(0.5)
        res[f"same_process_{step_ms:g}ms"] = _vae_latency(bank)
        stop_t.set()
        th.join()
        print(f"same process, {step_ms:g} ms steps", res[f"same_process_{step_ms:g}ms"], flush=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
