"""The experimental few-token fused MLP kernel (benchmarks/experiments/small_mlp.py) against the compiled PyTorch path it
replaces (cuBLAS gate/up, inductor's SiLU product, cuBLAS down, the residual add), at VoxCPM2's
decode shapes, on a CUDA machine: a sweep of launch configs per (weights, token count).

    python3 benchmarks/kernel_small_mlp.py --out $OUT/kernel_small_mlp.json

Microseconds per call, from a CUDA graph of back-to-back calls that each read a different copy of
the weights (copies past 256 MB, so the L2 cache does not hold them, as in a decode step that reads
7.5 GB). `tb_s` is the weight bytes over that time.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python_backend"))
from kernel_skinny_gemm import time_calls  # noqa: E402
from experiments import small_mlp as mlp  # noqa: E402  (benchmarks/experiments/small_mlp.py)

# name -> (K = hidden, I = intermediate, token counts): LocDiT/LocEnc (2 x 11 and 5 tokens per
# request, 8 and 1 at their last layer) and the two LMs (one token per request).
SHAPES = {
    "loc": (1024, 4096, (1, 8, 22, 44)),
    "lm": (2048, 6144, (1, 8, 16)),
}


MAX_ERR = 0.05  # on outputs of magnitude ~5 in bf16; the compiled path's own error is ~0.03


def compiled_path(x, res, w_gu, w_d):
    gate, up = F.linear(x, w_gu).chunk(2, dim=-1)
    return res + F.linear(F.silu(gate) * up, w_d)


def candidates(I: int, K: int):
    for bi, bk, bh, nw in itertools.product((32, 64, 128), (128, 256), (128, 256), (4, 8)):
        cfg = mlp.Config(bi, bk, bh, nw, 3)
        if mlp.supports(1, K, I, K, cfg):
            yield cfg


def measure(cfg, x, res, wgu, wd, want, copies) -> dict:
    """Launch `cfg`'s largest error over three calls, then its time per call over the weight copies;
    a wrong launch is recorded, not ranked."""
    try:
        err = max((mlp.launch(x, res, wgu[0], wd[0], cfg).float() - want).abs().max().item() for _ in range(3))
        us = time_calls([lambda a=a, b=b: mlp.launch(x, res, a, b, cfg) for a, b in zip(wgu, wd)], copies)
    except Exception as e:  # shared memory out of range and the like
        return {"cfg": list(cfg), "error": f"{type(e).__name__}: {e}"[:200]}
    return {"cfg": list(cfg), "us": us, "max_err": err, "wrong": err > MAX_ERR}


def sweep(names, save):
    dev, dt = torch.device("cuda"), torch.bfloat16
    base = torch.compile(compiled_path, dynamic=True)
    rows = []
    for name in names:
        K, I, Ms = SHAPES[name]
        H = K
        nbytes = 3 * I * K * 2
        copies = max(2, math.ceil(256e6 / nbytes))
        wgu = [torch.randn(2 * I, K, device=dev, dtype=dt) / K ** 0.5 for _ in range(copies)]
        wd = [torch.randn(H, I, device=dev, dtype=dt) / I ** 0.5 for _ in range(copies)]
        for M in Ms:
            x = torch.randn(M, K, device=dev, dtype=dt)
            res = torch.randn(M, H, device=dev, dtype=dt)
            act = torch.randn(M, I, device=dev, dtype=dt)
            want = mlp.reference(x, res, wgu[0], wd[0]).float()
            got_base = base(x, res, wgu[0], wd[0]).float()
            row = {"shape": name, "M": M, "K": K, "I": I, "weight_mb": nbytes / 1e6,
                   "compiled_us": time_calls([lambda a=a, b=b: base(x, res, a, b) for a, b in zip(wgu, wd)], copies),
                   "cublas_gemms_us": time_calls([lambda a=a, b=b: (F.linear(x, a), F.linear(act, b))
                                                  for a, b in zip(wgu, wd)], copies),
                   "compiled_max_err": (got_base - want).abs().max().item()}
            operands = (x, res, wgu, wd, want, copies)
            results = [measure(cfg, *operands) for cfg in candidates(I, K)]
            ranked = lambda: sorted((r for r in results if "us" in r and not r["wrong"]), key=lambda r: r["us"])  # noqa: E731
            for r in ranked()[:2]:  # stages for the best two
                results += [measure(mlp.Config(*r["cfg"])._replace(num_stages=ns), *operands) for ns in (2, 4)]
            ok = ranked()
            acc, count = mlp._workspace(dev, H)
            row.update(best=ok[0], top=ok[:5], tried=len(results),
                       default_us=next((r["us"] for r in ok if r["cfg"] == list(mlp.DEFAULT)), None),
                       errors=[r for r in results if "error" in r][:3],
                       wrong=[r["cfg"] for r in results if r.get("wrong")],
                       workspace_at_rest=bool(acc.abs().max().item() == 0 and count.item() == 0))
            row["compiled_tb_s"] = nbytes / row["compiled_us"] / 1e6
            row["best_tb_s"] = nbytes / ok[0]["us"] / 1e6
            row["speedup"] = row["compiled_us"] / ok[0]["us"]
            rows.append(row)
            print(f"{name:4s} M={M:3d} compiled {row['compiled_us']:7.2f} us ({row['compiled_tb_s']:.2f} TB/s, "
                  f"GEMMs alone {row['cublas_gemms_us']:6.2f})  fused best {ok[0]['us']:7.2f} us "
                  f"({row['best_tb_s']:.2f} TB/s) x{row['speedup']:.2f} {ok[0]['cfg']} err {ok[0]['max_err']:.3g} "
                  f"(compiled err {row['compiled_max_err']:.3g}) default {row['default_us']}"
                  + (f", {len(row['wrong'])} launches wrong" if row["wrong"] else ""), flush=True)
            save(rows)
        del wgu, wd
        torch.cuda.empty_cache()
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel_small_mlp.json"))
    ap.add_argument("--shapes", default=",".join(SHAPES))
    args = ap.parse_args()
    t0 = time.time()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)

    def save(rows):  # after every row: a run cut short keeps what it measured
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"),
                       "torch": torch.__version__, "seconds": round(time.time() - t0, 1), "rows": rows}, f, indent=1)

    sweep(args.shapes.split(","), save)
    print(f"wrote {args.out} ({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
