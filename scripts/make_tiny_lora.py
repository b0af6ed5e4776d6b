#!/usr/bin/env python3
"""Write a random LoRA adapter in the official format for a checkpoint's shapes, to try the LoRA
features on the tiny default checkpoint (a real adapter comes from the official trainer).

    make_tiny_lora.py --out /tmp/loras/narrator              # for checkpoints/tiny (generated if missing)
    make_tiny_lora.py --checkpoint /data/full --out /srv/voxcpm/loras/narrator --rank 16 --seed 3

The directory's name is the adapter's name. Serve its parent directory as the LoRA directory:
`VOXCPM_LORA_DIR=/tmp/loras bash scripts/serve.sh`.
"""

import argparse
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python_backend"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="the adapter's directory (its name is the adapter's name)")
    ap.add_argument("--checkpoint", help="the checkpoint whose shapes it fits (default: the tiny default)")
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--alpha", type=float, default=16.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    from voxcpm_triton.formats.checkpoint import CheckpointError
    from voxcpm_triton.formats.lora import LoraError
    from voxcpm_triton.model.config import ConfigError
    from voxcpm_triton.testing import ensure_tiny_checkpoint
    from voxcpm_triton.testing.lora_writer import write_random_adapter

    try:
        checkpoint = args.checkpoint or ensure_tiny_checkpoint(progress=lambda m: print(m, file=sys.stderr))
        modules = write_random_adapter(checkpoint, args.out, args.rank, args.alpha, args.seed)
    except (CheckpointError, ConfigError, LoraError, ValueError, OSError) as e:
        print(f"make_tiny_lora.py: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}: rank {args.rank}, alpha {args.alpha:g}, {len(modules)} linears of {checkpoint}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
