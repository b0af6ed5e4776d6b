"""The multi-adapter LoRA kernel (`voxcpm_triton.kernels.lora`) against the compiled PyTorch
"token" formulation and against the base projection alone, on a CUDA machine, at VoxCPM2's decode
shapes (rank 32, every row its own adapter):

    python3 benchmarks/kernel_lora.py --out $OUT/kernel_lora.json

Microseconds per call from a CUDA graph: `base_us` is the plain projection (cuBLAS), `torch_us` the
projection plus the compiled "token" delta, `kernel_<bn>_c<cols>_k<bk>_w<warps>_us` the projection
plus the kernel with that output tile, chunk, K tile and warp count (`auto`: what the launch picks).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python_backend"))
from voxcpm_triton.kernels import lora as lk  # noqa: E402
from voxcpm_triton.model.lora import LoraOp, lora_delta  # noqa: E402

# name -> (in, target widths, tokens per row, halves): the LMs' decode (one token per row) and
# LocDiT's evaluations (11 tokens per row, CFG halves), full-size config.
SITES = {
    "lm_qkv": (2048, (2048, 256, 256), 1, 1),
    "lm_o": (2048, (2048,), 1, 1),
    "dit_qkv": (1024, (2048, 256, 256), 11, 2),
    "dit_o": (2048, (1024,), 11, 2),
}


def bench(batches=(1, 8, 64), rank=32, slots=64):
    from triton.testing import do_bench_cudagraph

    dev, dt = torch.device("cuda"), torch.bfloat16
    rows_out = []
    print(f"LoRA add, rank {rank}, bf16, us per call (CUDA graph), {torch.cuda.get_device_name()}")
    for name, (K, splits, T, halves) in SITES.items():
        N = sum(splits)
        w = torch.randn(N, K, device=dev, dtype=dt) / K ** 0.5
        a = torch.randn(slots + 1, len(splits) * rank, K, device=dev, dtype=dt) / K ** 0.5
        b = torch.randn(slots + 1, N, rank, device=dev, dtype=dt) * 0.01
        seg = torch.repeat_interleave(torch.arange(len(splits), device=dev), torch.tensor(splits, device=dev))
        for batch in batches:
            rows = torch.arange(batch, device=dev) % slots + 1
            x = torch.randn(halves * batch * T, K, device=dev, dtype=dt)
            op = LoraOp("token", a, b, rows, seg if len(splits) > 1 else None, splits, halves)
            torch._dynamo.reset()  # a fresh compile per shape (no recompile limit, no dynamic fallback)
            torch_path = torch.compile(lambda x: torch.nn.functional.linear(x, w) + lora_delta(x, op), dynamic=False)
            ref = torch_path(x).float()
            row = {"site": name, "batch": batch, "tokens": x.size(0),
                   "base_us": do_bench_cudagraph(lambda: torch.nn.functional.linear(x, w), rep=100) * 1e3,
                   "torch_us": do_bench_cudagraph(lambda: torch_path(x), rep=100) * 1e3}
            configs = [(None, None, None, 4)] + [(bn, cols, bk, nw) for bn in (64, 128) for cols in (128, 512, 2048)
                                                 for bk, nw in ((128, 4), (256, 4), (256, 8)) if cols >= bn]
            for bn, cols, bk, nw in configs:
                key = "auto" if bn is None else f"{bn}_c{cols}_k{bk}_w{nw}"
                f = lambda: lk._launch(torch.nn.functional.linear(x, w), x, a, b, rows, splits, halves,  # noqa: E731
                                       bn=bn, cols=cols, block_k=bk, num_warps=nw)
                try:
                    err = (f().float() - ref).abs().max().item()
                    row[f"kernel_{key}_us"] = do_bench_cudagraph(f, rep=50) * 1e3
                    row[f"err_{key}"] = err
                except Exception as e:  # a tile config the hardware rejects (shared memory)
                    row[f"kernel_{key}_us"] = None
                    row[f"err_{key}"] = repr(e)[:120]
            timed = {k: v for k, v in row.items() if k.startswith("kernel_") and v is not None}
            row["best"] = min(timed, key=timed.get)
            rows_out.append(row)
            print({k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items()
                   if k in ("site", "batch", "base_us", "torch_us", "kernel_auto_us", "best")},
                  "best_us", round(timed[row["best"]], 2))
    return rows_out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--out", help="write the rows as JSON here")
    args = ap.parse_args()
    if not lk.available():
        raise SystemExit("needs triton and a CUDA device")
    result = bench(tuple(args.batches), args.rank)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rank": args.rank, "rows": result}, f, indent=1)
