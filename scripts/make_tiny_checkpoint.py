#!/usr/bin/env python3
"""Write a random VoxCPM2 checkpoint in the official format.

    make_tiny_checkpoint.py                       # the tiny embedded default -> checkpoints/tiny
    make_tiny_checkpoint.py --config benchmarks/voxcpm2_config.json --out /data/full --device cuda
                                                  # full-size (2.4B with the VAE, bf16) random weights, for benchmarks

Same seed, dtype and device -> same bytes. Weights are drawn per tensor in the
target dtype and streamed to the file, so memory stays at about two tensors.
"""

import argparse
import json
import os
import shutil
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python_backend"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="output directory (default: checkpoints/tiny, or checkpoints/full with --config)")
    ap.add_argument("--config", help="a VoxCPM2 config.json to take the shapes from (default: the tiny config)")
    ap.add_argument("--dtype", choices=["bfloat16", "float16", "float32"],
                    help="LM weight dtype (default: float32 for the tiny config, bfloat16 with --config)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where to draw the random values")
    args = ap.parse_args(argv)
    if not 0 <= args.seed < 2**63:
        ap.error(f"--seed must be from 0 to 2**63-1, got {args.seed}")
    if args.out is not None and (not args.out.strip() or os.path.exists(args.out) and not os.path.isdir(args.out)):
        ap.error(f"--out must name a directory, got {args.out!r}")

    t0 = time.time()
    import torch

    from voxcpm_triton.testing.checkpoint_writer import TINY_CONFIG, write_checkpoint
    from voxcpm_triton.model.config import ConfigError
    from voxcpm_triton.paths import DEFAULT_TINY_DIR

    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: CUDA is not available")
    if args.config:
        try:
            with open(args.config, encoding="utf-8") as f:
                config = json.load(f)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            ap.error(f"--config: {e}")
        out = args.out or os.path.join(REPO, "checkpoints", "full")
        dtype = args.dtype or "bfloat16"
    else:
        config, out, dtype = TINY_CONFIG, args.out or DEFAULT_TINY_DIR, args.dtype or "float32"
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads (startup {time.time() - t0:.1f}s)", flush=True)
    created = not os.path.exists(out)
    try:
        write_checkpoint(out, config, seed=args.seed, weights_dtype=dtype, device=args.device,
                         progress=lambda msg: print(msg, flush=True))
    except (ConfigError, OSError) as e:
        if created:  # nothing half-written is left to be taken for a checkpoint
            shutil.rmtree(out, ignore_errors=True)
        print(f"error: {args.config if isinstance(e, ConfigError) else out}: {e}", file=sys.stderr)
        return 2
    size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    print(f"wrote {out} ({size / 1e9:.2f} GB) in {time.time() - t0:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
