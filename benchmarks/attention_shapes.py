"""Which attention is fastest for LocDiT's and LocEnc's tiny sequences, on this GPU.

    python benchmarks/attention_shapes.py --out benchmarks/raw/attention_shapes.json

LocDiT attends over 11 tokens (2 mu, time, 4 condition, 4 sample) with 16 query
heads sharing 2 KV heads, head dim 128, batch 2 x requests (CFG); LocEnc over 5.
The profile showed cuDNN's SDPA at 165 us per call for batch 256 there, the top
kernel of the step. This times each way of computing the same attention.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python_backend"))
from voxcpm_triton.model.minicpm import local_attention  # noqa: E402


def sdpa_gqa(q, k, v):
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                          enable_gqa=True).transpose(1, 2)


def folded(q, k, v):
    """The query heads sharing a KV head folded into the query length: what LocDiT/LocEnc run."""
    return local_attention(0, q, k, v)


def explicit(q, k, v):
    B, S, Hq, D = q.shape
    g = Hq // k.size(2)
    kk = k.repeat_interleave(g, dim=2).transpose(1, 2)
    vv = v.repeat_interleave(g, dim=2).transpose(1, 2)
    w = torch.softmax((q.transpose(1, 2) @ kk.transpose(-1, -2)).float() * D ** -0.5, dim=-1).to(q.dtype)
    return (w @ vv).transpose(1, 2)


def timed(fn, args, iters: int) -> float:
    for _ in range(3):
        fn(*args)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(10):
            fn(*args)
    g.replay()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(iters):
        g.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / (iters * 10) * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    dev, dt = "cuda", torch.bfloat16
    backends = {"default": None, "cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
    rows = []
    for seq in (11, 5):
        for batch in (2, 16, 128, 256):
            q = torch.randn(batch, seq, 16, 128, device=dev, dtype=dt)
            # k, v as the split of one fused QKV GEMM output: strided, like in the model
            kv = torch.randn(batch, seq, 2, 2, 128, device=dev, dtype=dt)
            k, v = kv[:, :, 0], kv[:, :, 1]
            ref = explicit(q.float(), k.float(), v.float())
            row = {"seq": seq, "batch": batch}
            for impl_name, impl in (("gqa", sdpa_gqa), ("folded", folded)):
                for be_name, be in backends.items():
                    name = f"{impl_name}/{be_name}"
                    try:
                        if be is None:
                            us = timed(impl, (q, k, v), args.iters)
                            err = (impl(q, k, v).float() - ref).abs().max().item()
                        else:
                            with sdpa_kernel([be]):
                                us = timed(impl, (q, k, v), args.iters)
                                err = (impl(q, k, v).float() - ref).abs().max().item()
                        row[name] = {"us": round(us, 2), "max_err": err}
                    except Exception as e:  # a backend that does not take this shape
                        row[name] = {"error": str(e).splitlines()[0][:120]}
            for name, fn in (("explicit", explicit), ("explicit/compiled", torch.compile(explicit))):
                row[name] = {"us": round(timed(fn, (q, k, v), args.iters), 2)}
            rows.append(row)
            best = min((v["us"], k) for k, v in row.items() if isinstance(v, dict) and "us" in v)
            print(f"seq {seq:3d} batch {batch:4d}: best {best[1]} {best[0]:.1f} us | " + "  ".join(
                f"{k} {v['us']:.1f}" for k, v in row.items() if isinstance(v, dict) and "us" in v), flush=True)
    result = {"device": torch.cuda.get_device_name(0), "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
              "rows": rows}
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
