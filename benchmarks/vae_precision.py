#!/usr/bin/env python3
"""The VAE decoder's decode precision (`AudioVAE.set_decode_precision`): speed and audio error.

    python benchmarks/vae_precision.py --checkpoint /tmp/full --out vae_precision.json

For each precision (fp32, bf16, fp16) the full-size VAE is built as served (`vae_kernels` and the
compiled snakes) and its `VAEStreams` decode timed per call, B streams x n patches (CUDA graphs
where captured, as served), with a kernel profile of one 64 x 4 call. Quality: 4 streams of 100
patches of fixed-seed latents, decoded chunk by chunk as served (chunks of 1, 2, 4 patches, then
16), against fp32 with TF32 off (the exact result) and against the served fp32 (TF32 in cuDNN, the
default): max abs error, its ratio to the peak, and SNR in dB. Random weights and latents: a real
checkpoint's activations may have outliers these do not (fp16 overflows past 65504).

A precision given as `fp32:N` runs residual units of up to N channels in `unit_tail` (one kernel
for the depthwise conv, its snake, the pointwise conv and the skip) and wider ones in three, so
`--precisions fp32:0,fp32:256` is the A/B of that kernel. `+NAME=VALUE` after a variant sets a
`kernels.vae` constant for it (each variant starts from the module's defaults):
`fp32,fp32+ROW_ALIGN_FROM=99999` is the A/B of the residual units' aligned look-back rows. A variant
may repeat; "runs" holds every run in order (the other keys, one per variant name, its last run).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python_backend"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from bench import log, summarize_profile, sync, top_ops  # noqa: E402
from kernel_kinds import VAE_KERNEL_KINDS  # noqa: E402
from kernel_vae_blocks import parse_settings  # noqa: E402
from voxcpm_triton.audio.vae_streams import VAEStreams  # noqa: E402
from voxcpm_triton.kernels import vae as vae_kernels  # noqa: E402
from voxcpm_triton.loading import load_audio_vae  # noqa: E402

SHAPES = ((1, 1), (8, 4), (16, 4), (64, 1), (64, 4), (64, 16))
CHUNKS = [1, 2, 4] + [16] * 5 + [13]  # 100 patches, the served chunk schedule's shape


def stream_audio(bank: VAEStreams, P: int, z: torch.Tensor) -> torch.Tensor:
    """z [S, D, frames] decoded chunk by chunk as one batch of S streams -> audio [S, samples]."""
    keys = list(range(z.shape[0]))
    for k in keys:
        bank.open(k)
    parts, start = [], 0
    for n in CHUNKS:
        parts.append(bank.decode(keys, z[..., start:start + n * P]))
        start += n * P
    for k in keys:
        bank.close(k)
    return torch.cat(parts, -1)


def errors(got: torch.Tensor, ref: torch.Tensor) -> dict:
    err = (got - ref).double()
    return {"max_abs": err.abs().max().item(), "rel_to_peak": err.abs().max().item() / ref.abs().max().item(),
            "snr_db": 10 * math.log10(ref.double().pow(2).sum().item() / max(err.pow(2).sum().item(), 1e-30))}


def timed(bank: VAEStreams, b: int, n: int, P: int, D: int, reps: int = 10) -> float:
    keys, z = list(range(b)), torch.randn(b, D, n * P)
    for _ in range(3):
        bank.decode(keys, z)
    sync()
    t = time.perf_counter()
    for _ in range(reps):
        bank.decode(keys, z)
    sync()
    return (time.perf_counter() - t) / reps * 1000


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", default="/tmp/full")
    ap.add_argument("--precisions", default="fp32,bf16,fp16",
                    help="decode precisions, each optionally with ':N', the widest residual unit that runs "
                         "`unit_tail` (kernels.vae.UNIT_MAX_CHANNELS; 0: none), e.g. fp32:0,fp32:256")
    ap.add_argument("--out", default="vae_precision.json")
    ap.add_argument("--ops", action="store_true",
                    help="also the PyTorch ops of one eager 64 x 4 decode with their input shapes (which layer a "
                         "kernel of the profile belongs to)")
    args = ap.parse_args()
    dev = torch.device("cuda")
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "shapes": {}, "profile_64x4": {},
           "quality": {}, "runs": []}
    z = torch.randn(4, 64, 100 * 4, generator=torch.Generator().manual_seed(0))

    torch.backends.cudnn.allow_tf32 = False
    cfg, exact = load_audio_vae(args.checkpoint, dev)
    P = cfg.patch_size
    ref = stream_audio(VAEStreams(exact, P, max_streams=4), P, z)
    torch.backends.cudnn.allow_tf32 = True
    del exact
    served_fp32 = None
    defaults = {k: getattr(vae_kernels, k) for k in dir(vae_kernels) if k.isupper()}
    for variant in args.precisions.split(","):
        head, _, settings = variant.partition("+")
        for k, v in {**defaults, **parse_settings(settings)}.items():
            setattr(vae_kernels, k, v)
        precision, _, unit_max = head.partition(":")
        if unit_max:
            vae_kernels.UNIT_MAX_CHANNELS = int(unit_max)
        log(f"[{variant}] residual units of <= {vae_kernels.UNIT_MAX_CHANNELS} channels run unit_tail")
        t0 = time.perf_counter()
        _, vae = load_audio_vae(args.checkpoint, dev, triton_kernels=vae_kernels.available(), compile=True,
                                decode_precision=precision)
        bank = VAEStreams(vae, P, max_streams=64, cuda_graphs=True)
        log(f"[{variant}] built and captured {len(bank.graphs)} graphs in {time.perf_counter() - t0:.1f} s")
        for k in range(64):
            bank.open(k)
        rows = {}
        for b, n in SHAPES:
            ms = timed(bank, b, n, P, vae.latent_dim)
            rows[f"{b}x{n}"] = ms
            log(f"[{variant}] {b:3d} streams x {n:2d} patches: {ms:7.2f} ms ({ms / (b * n) * 1000:6.1f} us per patch)"
                f"{'  graph' if (min(s for s in bank.buckets if s >= b), n * P) in bank.graphs else ''}")
        out["shapes"][variant] = rows
        from torch.profiler import ProfilerActivity, profile

        keys, zz = list(range(64)), torch.randn(64, vae.latent_dim, 4 * P)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                bank.decode(keys, zz)
            sync()
        p = summarize_profile(prof, 3, VAE_KERNEL_KINDS)
        out["profile_64x4"][variant] = p
        log(f"[{variant}] profile 64 x 4: {p['gpu_ms']:.2f} ms GPU: "
            + ", ".join(f"{k} {v:.2f}" for k, v in p["by_kind_ms"].items()))
        if args.ops:
            idx = torch.arange(1, 65, device=dev)
            p["ops"] = top_ops(lambda: bank._body(idx, zz.to(dev)), n=40)
            for o in p["ops"]:
                log(f"[{variant}]   {o['self_cuda_ms']:.3f} ms {o['calls']:g}x {o['op']} {o['shapes']}")
        for k in range(64):
            bank.close(k)
        audio = stream_audio(bank, P, z)
        q = {"vs_exact_fp32": errors(audio, ref)}
        if served_fp32 is not None:
            q["vs_served_fp32"] = errors(audio, served_fp32)  # the first fp32 variant's audio
        elif precision == "fp32":
            served_fp32 = audio
        out["quality"][variant] = q
        out["runs"].append({"variant": variant, "shapes": rows, "gpu_ms_64x4": p["gpu_ms"], "quality": q})
        log(f"[{variant}] audio of 4 x 100 patches: " + json.dumps(q))
        del bank, vae
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
