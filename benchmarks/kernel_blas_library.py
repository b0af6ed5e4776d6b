"""The decode step's bf16 GEMMs under each BLAS library torch can call (`torch.backends.cuda.
preferred_blas_library`: cuBLAS's `cublasGemmEx`, torch's default for a plain mm, or cuBLASLt, whose
heuristics may pick other kernels), on a CUDA machine.

LocDiT's four linears at its token counts (22 per request: 2 x 11 with CFG) and the LMs' at one row
per request past the persistent layer's 16. At LocDiT's batch-64 shape the output projection and
the down projection make 88 output tiles of 128 x 128 for 132 SMs: which library fills the GPU
better is what this asks.

Microseconds per call, median of replays of a CUDA graph of `--copies` calls, each with its own
weights (past the 50 MB L2), the libraries alternating so that both see the same clocks.

    python3 benchmarks/kernel_blas_library.py --out $OUT/kernel_blas_library.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernel_skinny_gemm import time_calls  # noqa: E402

# name -> (N, K) of y = x W^T, W [N, K]
LINEARS = {"loc": {"qkv": (2560, 1024), "o": (1024, 2048), "gate_up": (8192, 1024), "down": (1024, 4096)},
           "lm": {"qkv": (2560, 2048), "o": (2048, 2048), "gate_up": (12288, 2048), "down": (2048, 6144)}}
LIBRARIES = ("cublas", "cublaslt")


def cases(shapes, copies: int, dev, dt):
    """For each linear of LINEARS at each token count of `shapes` ("model:M,M,..."): (key, N, K, M, x,
    weights), `copies` weights (each its own, past the L2) and one input."""
    for spec in shapes:
        model, counts = spec.split(":")
        for name, (N, K) in LINEARS[model].items():
            ws = [torch.randn(N, K, device=dev).to(dt) * K ** -0.5 for _ in range(copies)]
            for M in (int(m) for m in counts.split(",")):
                yield f"{model}.{name}.{M}", N, K, M, torch.randn(M, K, device=dev).to(dt), ws


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="+", default=["loc:176,352,704,1408,2816", "lm:32,64,128"])
    ap.add_argument("--copies", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=3, help="alternations of the libraries")
    ap.add_argument("--out", default="kernel_blas_library.json")
    args = ap.parse_args()
    dev, dt = torch.device("cuda"), torch.bfloat16
    start = torch.backends.cuda.preferred_blas_library()
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "default": str(start),
           "copies": args.copies, "us": {}}
    for key, N, K, M, x, ws in cases(args.shapes, args.copies, dev, dt):
        times = {lib: [] for lib in LIBRARIES}
        for _ in range(args.rounds):
            for lib in LIBRARIES:
                torch.backends.cuda.preferred_blas_library(lib)
                times[lib].append(time_calls([lambda w=w: F.linear(x, w) for w in ws], args.copies))
        med = {lib: sorted(t)[len(t) // 2] for lib, t in times.items()}
        flops = 2 * M * N * K
        row = {lib: {"us": med[lib], "tflops": flops / med[lib] / 1e6, "runs": times[lib]} for lib in LIBRARIES}
        out["us"][key] = row
        print(f"[blas] {key} N={N} K={K}: "
              + ", ".join(f"{lib} {med[lib]:7.2f} us ({row[lib]['tflops']:5.0f} TFLOP/s)" for lib in LIBRARIES)
              + f"; lt/default {med['cublas'] / med['cublaslt']:.3f}x", flush=True)
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    torch.backends.cuda.preferred_blas_library(start)


if __name__ == "__main__":
    main()
