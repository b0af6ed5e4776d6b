"""The experimental few-token linear kernel (benchmarks/experiments/skinny_gemm.py) against cuBLAS
(`F.linear`) at VoxCPM2's decode shapes, on a CUDA machine: a sweep of launch configs per (weight,
token count), whose rows `skinny_gemm.TUNED` was picked from by hand; with --lora, the kernel with the LoRA delta
inside against cuBLAS followed by `voxcpm_triton.kernels.lora`, at the default LoRA sites.

    python3 benchmarks/kernel_skinny_gemm.py --out $OUT/kernel_skinny_gemm.json
    python3 benchmarks/kernel_skinny_gemm.py --lora --out $OUT/kernel_skinny_gemm_lora.json

Microseconds per call, from a CUDA graph of back-to-back calls that each read a different copy of
the weight (copies past 128 MB, so the L2 cache does not hold them, as in a decode step that reads
7.5 GB). `tb_s` is the weight bytes over that time.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python_backend"))
from experiments import skinny_gemm as sg  # noqa: E402  (benchmarks/experiments/skinny_gemm.py)

# name -> (N, K, token counts to measure): the LMs (one token per request) and LocEnc / LocDiT
# (5 and 2 x 11 tokens per request) of the full-size config, at the smaller batch buckets.
SHAPES = {
    "lm_qkv": (2560, 2048, (1, 2, 4, 8, 16, 32, 64)),
    "lm_o": (2048, 2048, (1, 2, 4, 8, 16, 32, 64)),
    "lm_gate_up": (12288, 2048, (1, 2, 4, 8, 16, 32, 64)),
    "lm_down": (2048, 6144, (1, 2, 4, 8, 16, 32, 64)),
    "loc_qkv": (2560, 1024, (10, 22, 44)),
    "loc_o": (1024, 2048, (10, 22, 44)),
    "loc_gate_up": (8192, 1024, (10, 22, 44)),
    "loc_down": (1024, 4096, (10, 22, 44)),
}


def time_calls(fn_per_copy, copies: int, reps: int = 15) -> float:
    """Median microseconds per call over `reps` replays of a graph of `copies` calls."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fn_per_copy:
            f()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in fn_per_copy:
            f()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / copies)
    del g
    return statistics.median(times)


def candidates(M: int, N: int, K: int, block_ks=(64, 128, 256), block_ns=(16, 32, 64, 128), splits=(1, 2, 4, 8, 16)):
    block_m = max(16, sg._next_pow2(M))
    for bn, sk, bk in itertools.product(block_ns, splits, block_ks):
        if K // sk < bk or (-(-N // bn)) * sk > 4096:
            continue
        yield sg.Config(block_m, bn, bk, sk)


# LoRA sites of the official default targets (q/k/v/o of the LMs and LocDiT): name -> (target
# widths, K, tokens, halves, rows), at batch 1 in a decode bucket of 2 rows (the second a padding
# row on the base slot 0), the smallest bucket the server had until the forty-sixth session.
LORA_SITES = {
    "lm_qkv": ((2048, 256, 256), 2048, 2, 1, 2),
    "lm_o": ((2048,), 2048, 2, 1, 2),
    "loc_qkv": ((2048, 256, 256), 1024, 44, 2, 2),
    "loc_o": ((1024,), 2048, 44, 2, 2),
}


def lora_sweep(rank: int, save):
    """The fused kernel per LoRA site against cuBLAS alone and cuBLAS + kernels.lora."""
    from voxcpm_triton.kernels import lora as lk

    dev, dt = torch.device("cuda"), torch.bfloat16
    rows = []
    for name, (splits, K, M, halves, G) in LORA_SITES.items():
        N = sum(splits)
        copies = max(2, math.ceil(128e6 / (N * K * 2)))
        ws = [torch.randn(N, K, device=dev, dtype=dt) / K ** 0.5 for _ in range(copies)]
        a = torch.randn(65, len(splits) * rank, K, device=dev, dtype=dt) / K ** 0.5
        b = torch.randn(65, N, rank, device=dev, dtype=dt) * 0.01
        slots = torch.tensor([7] + [0] * (G - 1), device=dev)
        lora = sg.Lora(a, b, slots, splits, halves)
        x = torch.randn(M, K, device=dev, dtype=dt)
        want = lk.lora_add(F.linear(x, ws[0]), x, a, b, slots, splits, halves).float()
        row = {"site": name, "M": M, "N": N, "K": K, "rank": rank,
               "cublas_us": time_calls([lambda w=w: F.linear(x, w) for w in ws], copies),
               "unfused_us": time_calls([lambda w=w: lk.lora_add(F.linear(x, w), x, a, b, slots, splits, halves)
                                         for w in ws], copies)}
        results = []
        for cfg in candidates(M, N, K, block_ks=(64, 128)):
            if any(s % cfg.block_n for s in splits):
                continue
            try:
                err = (sg.launch(x, ws[0], cfg, lora).float() - want).abs().max().item()
                us = time_calls([lambda w=w, c=cfg: sg.launch(x, w, c, lora) for w in ws], copies)
            except Exception as e:
                results.append({"cfg": list(cfg), "error": type(e).__name__})
                continue
            results.append({"cfg": list(cfg), "us": us, "max_err": err})
        ok = sorted((r for r in results if "us" in r), key=lambda r: r["us"])
        row.update(best=ok[0], top=ok[:5], tried=len(results))
        rows.append(row)
        print(f"{name:8s} M={M:3d} cublas {row['cublas_us']:6.2f} us  cublas+lora {row['unfused_us']:6.2f} us  "
              f"fused best {ok[0]['us']:6.2f} us {ok[0]['cfg']} err {ok[0]['max_err']:.3g}", flush=True)
        save(rows)
    return rows


def table(rows, margin: float = 0.97) -> dict:
    """"NxKxBLOCK_M" -> the best launch at the largest token count measured in that BLOCK_M class, or
    None where cuBLAS is faster than it by more than 1 - margin."""
    out, biggest = {}, {}
    for r in rows:
        key = f"{r['N']}x{r['K']}x{r['best']['cfg'][0]}"
        if r["M"] >= biggest.get(key, 0):
            biggest[key] = r["M"]
            out[key] = r["best"]["cfg"] if r["best"]["us"] * margin <= r["cublas_us"] else None
    return out


def sweep(names, refine: bool, save, tokens=None, quick=False):
    dev, dt = torch.device("cuda"), torch.bfloat16
    rows = []
    for name in names:
        N, K, Ms = SHAPES[name]
        Ms = tokens or Ms
        nbytes = N * K * 2
        copies = max(2, math.ceil(128e6 / nbytes))
        ws = [torch.randn(N, K, device=dev, dtype=dt) / K ** 0.5 for _ in range(copies)]
        for M in Ms:
            x = torch.randn(M, K, device=dev, dtype=dt)
            want = F.linear(x, ws[0]).float()
            row = {"shape": name, "M": M, "N": N, "K": K, "weight_mb": nbytes / 1e6,
                   "cublas_us": time_calls([lambda w=w: F.linear(x, w) for w in ws], copies)}
            results = []
            narrow = dict(block_ks=(64, 128), block_ns=(32, 64), splits=(1, 2, 4, 8)) if quick else {}
            for cfg in candidates(M, N, K, **narrow):
                try:
                    err = (sg.launch(x, ws[0], cfg).float() - want).abs().max().item()
                    us = time_calls([lambda w=w, c=cfg: sg.launch(x, w, c) for w in ws], copies)
                except Exception as e:  # shared memory out of range and the like
                    results.append({"cfg": list(cfg), "error": type(e).__name__})
                    continue
                results.append({"cfg": list(cfg), "us": us, "max_err": err})
            ok = sorted((r for r in results if "us" in r), key=lambda r: r["us"])
            if refine:
                for r in ok[:3]:
                    base = sg.Config(*r["cfg"])
                    for nw, ns in ((2, 4), (8, 4), (4, 3), (4, 5), (8, 3)):
                        cfg = base._replace(num_warps=nw, num_stages=ns)
                        try:
                            us = time_calls([lambda w=w, c=cfg: sg.launch(x, w, c) for w in ws], copies)
                        except Exception as e:
                            results.append({"cfg": list(cfg), "error": type(e).__name__})
                            continue
                        results.append({"cfg": list(cfg), "us": us})
                ok = sorted((r for r in results if "us" in r), key=lambda r: r["us"])
            row.update(best=ok[0], top=ok[:5], tried=len(results))
            row["cublas_tb_s"] = nbytes / row["cublas_us"] / 1e6
            row["best_tb_s"] = nbytes / ok[0]["us"] / 1e6
            row["speedup"] = row["cublas_us"] / ok[0]["us"]
            rows.append(row)
            print(f"{name:12s} M={M:3d} cublas {row['cublas_us']:7.2f} us ({row['cublas_tb_s']:.2f} TB/s)  "
                  f"best {ok[0]['us']:7.2f} us ({row['best_tb_s']:.2f} TB/s) x{row['speedup']:.2f} {ok[0]['cfg']}",
                  flush=True)
            save(rows)
        del ws
        torch.cuda.empty_cache()
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel_skinny_gemm.json"))
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--lora", action="store_true", help="the fused LoRA kernel at the LoRA sites instead")
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--no-refine", action="store_true", help="skip the warps/stages pass over the best three")
    ap.add_argument("--tokens", default="", help="token counts for every shape instead of its own, e.g. 88,176")
    ap.add_argument("--quick", action="store_true",
                    help="fewer launch configs (BLOCK_N 32/64, split-K <= 8, BLOCK_K 64/128)")
    args = ap.parse_args()
    t0 = time.time()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)

    def save(rows):  # after every row: a run cut short keeps what it measured
        out = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"),
               "torch": torch.__version__, "seconds": round(time.time() - t0, 1), "rows": rows}
        if not args.lora:
            out["table"] = table(rows)
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)

    if args.lora:
        lora_sweep(args.rank, save)
    else:
        sweep(args.shapes.split(","), not args.no_refine, save,
              [int(t) for t in args.tokens.split(",")] if args.tokens else None, args.quick)
    print(f"wrote {args.out} ({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
