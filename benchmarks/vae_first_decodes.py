"""How long a VAE decode takes the first time its shape comes, after the server's start-up.

The decoder captures the VAE's CUDA graphs at start-up (`VAEStreams`, the served chunk lengths at
every batch bucket). A decode that does not replay them runs eagerly, and an eager decode of a
(streams, frames) shape whose kernels were never built compiles them there: the audio thread, and
every stream waiting on it, stalls. This times each (streams, patches) decode twice, in the order
given, after the same start-up as served: the first run pays any compile, the second is the
steady cost. Run it in a fresh process, with fresh caches to see a new deployment's first hour:

    TRITON_CACHE_DIR=$(mktemp -d) TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) \\
        python3 benchmarks/vae_first_decodes.py --checkpoint /tmp/full --out first.json

`--backend DIR` imports voxcpm_triton from DIR (another version's python_backend) instead. Whether a
decode ran eagerly: by `VAEStreams.plan` where the version has one (raw/vae_graph_plan_fiftythird.patch:
every decode through graphs), else by `pieces` (graphs up to the longest, eager past it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def log(*a):
    print("[vae-first]", *a, flush=True)


def parse_shapes(text: str) -> list:
    """'24x2,64x16' -> [(24, 2), (64, 16)] (streams x patches)."""
    return [tuple(int(v) for v in s.split("x")) for s in text.split(",")]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--backend", default=os.path.join(REPO, "python_backend"))
    ap.add_argument("--max-streams", type=int, default=128, help="the decoder's: 2 x max_num_seqs")
    ap.add_argument("--graph-patches", default="1,4,16", help="the decoder's chunk_schedule lengths")
    ap.add_argument("--shapes", default=",".join(f"{b}x{p}" for b in (24, 40, 17, 64, 80, 100)
                                                 for p in (2, 5, 6, 10, 15, 16)))
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    sys.path.insert(0, args.backend)

    import torch

    from voxcpm_triton.audio.vae_streams import VAEStreams
    from voxcpm_triton.loading import load_audio_vae

    dev = torch.device("cuda")
    t0 = time.perf_counter()
    cfg, vae = load_audio_vae(args.checkpoint, dev, triton_kernels=True, compile=True)
    t1 = time.perf_counter()
    P = cfg.patch_size
    bank = VAEStreams(vae, P, args.max_streams, cuda_graphs=True,
                      graph_patches=[int(p) for p in args.graph_patches.split(",")])
    t2 = time.perf_counter()
    log(f"VAE loaded and warmed in {t1 - t0:.1f} s, {len(bank.graphs)} graphs captured in {t2 - t1:.1f} s")
    gen = torch.Generator(device=dev).manual_seed(0)
    rows = []
    for streams, patches in parse_shapes(args.shapes):
        keys = [f"s{i}" for i in range(streams)]
        for k in keys:
            bank.open(k)
        z = torch.randn(streams, vae.latent_dim, patches * P, device=dev, generator=gen)
        plan = bank.plan(streams, patches * P) if hasattr(bank, "plan") else (
            None if bank.pieces(streams, patches * P) is None else "pieces")
        times = []
        for _ in range(2):
            torch.cuda.synchronize()
            t = time.perf_counter()
            bank.decode(keys, z)
            times.append((time.perf_counter() - t) * 1e3)
        for k in keys:
            bank.close(k)
        rows.append({"streams": streams, "patches": patches, "eager": plan is None,
                     "first_ms": times[0], "second_ms": times[1]})
        log(f"{streams:4d} x {patches:2d} patches  {'eager ' if plan is None else 'graphs'}  "
            f"first {times[0]:8.1f} ms  second {times[1]:7.1f} ms")
    out = {"device": torch.cuda.get_device_name(), "backend": args.backend, "load_s": t1 - t0,
           "capture_s": t2 - t1, "graphs": len(bank.graphs), "decodes": rows,
           "caches": {k: os.environ.get(k) for k in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")}}
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    log("wrote", args.out)


if __name__ == "__main__":
    main()
