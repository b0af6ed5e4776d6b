"""The model's linear shapes, bf16 against FP8 (`kernels.fp8`), per call, from CUDA graphs (one GPU).

    python3 benchmarks/kernel_fp8_linear.py --out $OUT/kernel_fp8_linear.json

Each row: one weight shape [N, K] at M tokens, 20 calls back to back in one CUDA graph, each
call on its own copy of the weight (as the layers of a step are: nothing stays in L2), us per call:

    bf16        F.linear (cuBLAS)
    fp8_gemm    torch._scaled_mm alone, activations already e4m3 (row-wise scales)
    fp8_linear  per-token quantisation + _scaled_mm, eagerly (the quantisation as separate kernels;
                in the model torch.compile fuses it into the kernel before)
    fp8_fast    fp8_gemm with use_fast_accum (the Hopper FP8 accumulation shortcut), for reference

and the weight bandwidth each reaches (weight bytes / time). M: 1-2 is a batch-1 LM step, 22 a
batch-1 LocDiT evaluation (11 tokens x CFG 2), 1408 LocDiT at batch 64.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python_backend"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from voxcpm_triton.kernels import fp8  # noqa: E402

# (name, N, K): VoxCPM2's linears (LM hidden 2048, FFN 6144; LocDiT/LocEnc hidden 1024, FFN 4096;
# 16 query heads, 2 KV heads, head dim 128).
SHAPES = [
    ("lm.qkv", 2560, 2048), ("lm.o_proj", 2048, 2048), ("lm.gate_up", 12288, 2048), ("lm.down_proj", 2048, 6144),
    ("dit.qkv", 2560, 1024), ("dit.o_proj", 1024, 2048), ("dit.gate_up", 8192, 1024), ("dit.down_proj", 1024, 4096),
    ("fusion_concat_proj", 2048, 4096), ("lm_to_dit_proj", 1024, 2048),
]
CALLS = 20


def time_graph(fn, reps: int = 10) -> float:
    """us per call of `fn` (which makes CALLS calls), from a CUDA graph replayed `reps` times."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        g.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000 / reps / CALLS


def bench_shape(N: int, K: int, M: int) -> dict:
    dev = torch.device("cuda")
    ws = [torch.randn(N, K, device=dev, dtype=torch.bfloat16) / K ** 0.5 for _ in range(CALLS)]
    qs = [fp8.quantize_weight(w) for w in ws]
    x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
    xq, sx = fp8.quantize_rows(x)

    def bf16():
        for w in ws:
            F.linear(x, w)

    def fp8_gemm(fast=False):
        for q in qs:
            torch._scaled_mm(xq, q.data.t(), scale_a=sx, scale_b=q.scale, out_dtype=torch.bfloat16,
                             use_fast_accum=fast)

    def fp8_linear():
        for q in qs:
            fp8.fp8_linear(x, q)

    row = {"N": N, "K": K, "M": M}
    for name, fn in (("bf16", bf16), ("fp8_gemm", fp8_gemm), ("fp8_linear", fp8_linear),
                     ("fp8_fast", lambda: fp8_gemm(True))):
        us = time_graph(fn)
        wbytes = N * K * (2 if name == "bf16" else 1)
        row[f"{name}_us"] = us
        row[f"{name}_weight_tb_s"] = wbytes / (us * 1e-6) / 1e12
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--m", default="1,2,8,22,64,128,1408")
    args = ap.parse_args()
    why = fp8.supported(torch.device("cuda"))
    if why:
        sys.exit(why)
    rows = []
    for name, N, K in SHAPES:
        for M in (int(m) for m in args.m.split(",")):
            r = {"shape": name, **bench_shape(N, K, M)}
            rows.append(r)
            print(f"{name:20s} M={M:5d}: bf16 {r['bf16_us']:7.1f} us ({r['bf16_weight_tb_s']:.2f} TB/s)  "
                  f"fp8 gemm {r['fp8_gemm_us']:7.1f} ({r['fp8_gemm_weight_tb_s']:.2f})  "
                  f"fp8 linear {r['fp8_linear_us']:7.1f}  fast-accum {r['fp8_fast_us']:7.1f}", flush=True)
        torch.cuda.empty_cache()
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "calls_per_graph": CALLS, "rows": rows}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
