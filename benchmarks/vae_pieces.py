#!/usr/bin/env python3
"""Long VAE decodes: eagerly in one go, as graph-sized pieces in time, or as graph-sized groups of
streams.

    python benchmarks/vae_pieces.py --checkpoint /tmp/full --out vae_pieces.json

`VAEStreams` captures its graphs up to 256 patches per replay (`MAX_GRAPH_PATCHES`) and decodes
larger work eagerly: with 64 streams every 16-patch chunk is a 64 x 16 decode (1,024 patches).
Each shape here (streams x patches, full-size VAE as served: fp32, Triton kernels, compiled
snakes) is decoded three ways, the same latents and state:
  eager    one `decode` call (what the served decoder runs past the graphs),
  pieces   consecutive calls of the longest chunk that has a graph at the streams' bucket,
  groups   one call per group of streams that fits a graph of the whole chunk (`--group` streams),
timed per decode over `--reps` (wall ms with a sync after each, and GPU ms between CUDA events),
medians; and the kernels of one decode of each way (the 10 costliest), and the largest difference
between the ways' audio (the causal state carries across pieces; kernels that differ by shape, TF32 or
not, make the rest). Shapes with a graph (64 x 4, 8 x 16) replay it all three ways. The ways run in
an order that rotates from shape to shape.

`--channels-last-from 512,256`: the whole table once per threshold of input channels from which an
upsampling conv's polyphase form runs channels-last (`audio_vae.POLYPHASE_CHANNELS_LAST_FROM`, the
graphs captured again each time), with each way's audio against the first threshold's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python_backend"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from bench import log, summarize_profile  # noqa: E402
from kernel_kinds import VAE_KERNEL_KINDS  # noqa: E402
from voxcpm_triton.audio.vae_streams import VAEStreams  # noqa: E402
from voxcpm_triton.kernels import vae as vae_kernels  # noqa: E402
from voxcpm_triton.model import audio_vae  # noqa: E402
from voxcpm_triton.loading import load_audio_vae  # noqa: E402


def ways(bank: VAEStreams, keys: list, z: torch.Tensor, piece: int, group: int) -> dict:
    """name -> fn() decoding z [B, D, frames] for `keys` that way -> audio [B, samples] (CPU). Each way
    queues all its calls before it waits for the first (`decode_async`), as the audio thread does."""
    frames = z.shape[-1]
    starts = range(0, len(keys), group)
    for s in starts:
        assert bank.pieces(len(keys[s:s + group]), frames) == [frames], "a group's chunk must have a graph"

    def pieces():
        queued = [bank.decode_async(keys, z[..., s:s + piece]) for s in range(0, frames, piece)]
        return torch.cat([q.result() for q in queued], -1)

    def groups():
        queued = [bank.decode_async(keys[s:s + group], z[s:s + group]) for s in starts]
        return torch.cat([q.result() for q in queued], 0)

    return {"eager": lambda: bank.decode(keys, z), "pieces": pieces, "groups": groups}


def timed(fn, reps: int) -> dict:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    wall, gpu = [], []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t = time.perf_counter()
        a.record()
        fn()
        b.record()
        b.synchronize()
        wall.append((time.perf_counter() - t) * 1000)
        gpu.append(a.elapsed_time(b))
    return {"wall_ms": statistics.median(wall), "gpu_ms": statistics.median(gpu)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", default="/tmp/full")
    ap.add_argument("--shapes", default="64x16,48x16,32x16,24x16")
    ap.add_argument("--group", type=int, default=16, help="streams per call in the 'groups' way")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--channels-last-from", default=str(audio_vae.POLYPHASE_CHANNELS_LAST_FROM),
                    help="thresholds, comma-separated: the table once per threshold")
    ap.add_argument("--out", default="vae_pieces.json")
    a = ap.parse_args()
    dev = torch.device("cuda")
    cfg, vae = load_audio_vae(a.checkpoint, dev, triton_kernels=vae_kernels.available(), compile=True)
    P = cfg.patch_size
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "shapes": {}, "by_threshold": {}}
    from torch.profiler import ProfilerActivity, profile

    first_audio: dict = {}  # (shape, way) -> the first threshold's audio
    for threshold in (int(x) for x in a.channels_last_from.split(",")):
        audio_vae.POLYPHASE_CHANNELS_LAST_FROM = threshold
        t0 = time.perf_counter()
        bank = VAEStreams(vae, P, max_streams=64, cuda_graphs=True)
        log(f"[channels-last from {threshold}] captured {len(bank.graphs)} graphs in {time.perf_counter() - t0:.1f} s")
        table = {}
        for shape in a.shapes.split(","):
            b, n = (int(x) for x in shape.split("x"))
            keys = list(range(b))
            z = torch.randn(b, vae.latent_dim, n * P, generator=torch.Generator().manual_seed(b))
            bucket = min(s for s in bank.buckets if s >= b)
            piece = max(f for s, f in bank.graphs if s == bucket)
            row = {"streams": b, "patches": n, "bucket": bucket, "piece_frames": piece, "ways": {}}
            audio = {}
            order = list(ways(bank, keys, z, piece, a.group).items())
            i = len(table) % len(order)
            for name, fn in order[i:] + order[:i]:
                for k in keys:  # every way starts from silence
                    bank.close(k)
                    bank.open(k)
                audio[name] = fn()
                first_audio.setdefault((shape, name), audio[name])
                t = timed(fn, a.reps)
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    fn()
                    torch.cuda.synchronize()
                p = summarize_profile(prof, 1, VAE_KERNEL_KINDS)
                t.update(profiled_gpu_ms=p["gpu_ms"], kernels=p["kernels"], by_kind_ms=p["by_kind_ms"], top=p["top"][:10],
                         max_abs_vs_first_threshold=(audio[name] - first_audio[(shape, name)]).abs().max().item())
                row["ways"][name] = t
                log(f"[{threshold}] {shape} {name:6s}: wall {t['wall_ms']:7.2f} ms, GPU {t['gpu_ms']:7.2f} ms "
                    f"({t['gpu_ms'] / (b * n) * 1000:5.1f} us per patch), {p['kernels']:.0f} kernels")
                for k in p["top"][:6]:
                    log(f"      {k['cuda_ms']:6.2f} ms {k['calls']:4.0f}x {k['kernel'][:100]}")
            row["max_abs_vs_eager"] = {k: (v - audio["eager"]).abs().max().item() for k, v in audio.items() if k != "eager"}
            log(f"[{threshold}] {shape}: audio vs eager {row['max_abs_vs_eager']}")
            table[shape] = row
            for k in keys:
                bank.close(k)
        out["by_threshold"][str(threshold)] = table
        out["shapes"] = out["shapes"] or table  # the first threshold's, as before
        del bank
        torch.cuda.empty_cache()
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)

if __name__ == "__main__":
    main()
