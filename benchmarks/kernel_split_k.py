"""The decode step's bf16 GEMMs split along K through cuBLAS itself, on a CUDA machine: y = x W^T as
S batched GEMMs over K/S slices (`torch.bmm` on strided views, no copies: S times the output tiles, so
more SMs stream the weight), their partial products summed after, in fp32 (`bmm(out_dtype=float32)`)
or from bf16 partials, against the one GEMM the model runs (`F.linear`).

At few tokens an output projection makes few tiles: LocDiT's down projection at 176 tokens (batch 8)
is 2 x 8 tiles of 128 x 128 for 132 SMs, each reading 1 MB of weights in order.

Microseconds per call, median of replays of a CUDA graph of `--copies` calls, each with its own
weights (past the 50 MB L2). "gemm" is the batched GEMM alone; "+sum" adds the sum of the partials
(in the model it would fuse with the residual add that follows anyway).

    python3 benchmarks/kernel_split_k.py --out $OUT/kernel_split_k.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python_backend"))
from kernel_blas_library import cases  # noqa: E402
from kernel_skinny_gemm import time_calls  # noqa: E402
from voxcpm_triton.model.split_k import split_views  # noqa: E402  (the model's own operands)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="+", default=["loc:176,352,704,1408", "lm:32,64"])
    ap.add_argument("--splits", default="2,4,8")
    ap.add_argument("--copies", type=int, default=12)
    ap.add_argument("--out", default="kernel_split_k.json")
    args = ap.parse_args()
    dev, dt = torch.device("cuda"), torch.bfloat16
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "copies": args.copies, "us": {}}
    for key, N, K, M, x, ws in cases(args.shapes, args.copies, dev, dt):
        ref = F.linear(x.float(), ws[0].float())
        row = {"linear": time_calls([lambda w=w: F.linear(x, w) for w in ws], args.copies)}
        for S in (int(s) for s in args.splits.split(",")):
            if K % S or (K // S) % 64:
                continue
            for kind, odt in (("fp32", torch.float32), ("bf16", dt)):
                def gemm(w, S=S, odt=odt):
                    a, b = split_views(x, w, S)
                    return torch.bmm(a, b, out_dtype=odt) if odt != dt else torch.bmm(a, b)
                try:
                    y = gemm(ws[0]).sum(0)
                    err = ((y.float() - ref).abs().max() / ref.abs().max()).item()
                    row[f"S{S}_{kind}"] = {
                        "gemm": time_calls([lambda w=w: gemm(w) for w in ws], args.copies),
                        "+sum": time_calls([lambda w=w: gemm(w).sum(0).to(dt) for w in ws], args.copies),
                        "err": err}
                except Exception as e:  # noqa: BLE001 - out_dtype missing in this torch, say
                    row[f"S{S}_{kind}"] = {"error": repr(e)[:200]}
        out["us"][key] = row
        timed = {k: v["+sum"] for k, v in row.items() if isinstance(v, dict) and "+sum" in v}
        best = min(timed, key=timed.get) if timed else None
        print(f"[split-k] {key} N={N} K={K}: linear {row['linear']:6.2f} us"
              + (f"; best {best} {row[best]['gemm']:6.2f} (+sum {row[best]['+sum']:6.2f}) us, "
                 f"{row['linear'] / row[best]['+sum']:.3f}x with the sum, err {row[best]['err']:.1e}"
                 if best else "; no split ran"), flush=True)
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
