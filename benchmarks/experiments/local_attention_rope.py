"""Where the LocDiT/LocEnc attention kernel's time goes at large batches: the kernel as it is, the same
kernel without RoPE (a lower bound, wrong numerics), and a variant that reads each RoPE table once
per program ([S, D/2]: rotate-half tables repeat their frequencies) and broadcasts it over the
program's query heads, where the kernel reads the full [S, D] tables once per (head, token) row.

    python3 benchmarks/experiments/local_attention_rope.py --out $OUT/local_attention_rope.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "python_backend"))
from voxcpm_triton.kernels import local_attention as lat  # noqa: E402
from voxcpm_triton.kernels._triton import next_pow2, tl, triton  # noqa: E402


@triton.jit
def _broadcast_rope_kernel(qkv_ptr, cos_ptr, sin_ptr, out_ptr, stride_tok, stride_out, S, qk_scale,
                           HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, HALF: tl.constexpr,
                           HALF_PAD: tl.constexpr, S_PAD: tl.constexpr, HEADS: tl.constexpr):
    b = tl.program_id(0)
    h0 = tl.program_id(1) * HEADS
    kvh = h0 // (HQ // HKV)
    dtype = qkv_ptr.dtype.element_ty
    d = tl.arange(0, HALF_PAD)
    tok = tl.arange(0, S_PAD)
    hh = tl.arange(0, HEADS)
    tab_mask = (tok < S)[:, None] & (d < HALF)[None, :]
    c = tl.load(cos_ptr + tok[:, None] * D + d[None, :], mask=tab_mask, other=0.0)
    s = tl.load(sin_ptr + tok[:, None] * D + d[None, :], mask=tab_mask, other=0.0)

    kv_rows = qkv_ptr + (b * S + tok)[:, None] * stride_tok
    k_col = (HQ + kvh) * D
    v_col = (HQ + HKV + kvh) * D
    k1 = tl.load(kv_rows + k_col + d[None, :], mask=tab_mask, other=0.0).to(tl.float32)
    k2 = tl.load(kv_rows + k_col + HALF + d[None, :], mask=tab_mask, other=0.0).to(tl.float32)
    v1 = tl.load(kv_rows + v_col + d[None, :], mask=tab_mask, other=0.0)
    v2 = tl.load(kv_rows + v_col + HALF + d[None, :], mask=tab_mask, other=0.0)
    k1, k2 = (k1 * c - k2 * s).to(dtype), (k2 * c + k1 * s).to(dtype)

    q_ptrs = (qkv_ptr + (b * S + tok)[None, :, None] * stride_tok + (h0 + hh)[:, None, None] * D
              + d[None, None, :])
    q_mask = tab_mask[None, :, :] & (hh < HEADS)[:, None, None]
    q1 = tl.load(q_ptrs, mask=q_mask, other=0.0).to(tl.float32)
    q2 = tl.load(q_ptrs + HALF, mask=q_mask, other=0.0).to(tl.float32)
    r1 = (q1 * c[None, :, :] - q2 * s[None, :, :]).to(dtype)
    r2 = (q2 * c[None, :, :] + q1 * s[None, :, :]).to(dtype)
    q1 = tl.reshape(r1, (HEADS * S_PAD, HALF_PAD))
    q2 = tl.reshape(r2, (HEADS * S_PAD, HALF_PAD))

    sc = tl.dot(q1, tl.trans(k1)) + tl.dot(q2, tl.trans(k2))
    sc = tl.where((tok < S)[None, :], sc * qk_scale, float("-inf"))
    p = tl.exp2(sc - tl.max(sc, axis=1)[:, None])
    l = tl.sum(p, axis=1)
    p = p.to(dtype)
    o1 = tl.dot(p, v1) / l[:, None]
    o2 = tl.dot(p, v2) / l[:, None]

    r = tl.arange(0, HEADS * S_PAD)
    q_tok = r % S_PAD
    q_head = h0 + r // S_PAD
    o_mask = (q_tok < S)[:, None] & (d < HALF)[None, :]
    o_ptrs = out_ptr + (b * S + q_tok)[:, None] * stride_out + q_head[:, None] * D + d[None, :]
    tl.store(o_ptrs, o1.to(out_ptr.dtype.element_ty), mask=o_mask)
    tl.store(o_ptrs + HALF, o2.to(out_ptr.dtype.element_ty), mask=o_mask)


def broadcast_launch(qkv, cos, sin, S, Hq, Hkv, D, heads=4, num_warps=4):
    out = torch.empty((qkv.shape[0], Hq * D), dtype=qkv.dtype, device=qkv.device)
    half = D // 2
    k = _broadcast_rope_kernel[(qkv.shape[0] // S, Hq // heads)](
        qkv, cos, sin, out, qkv.stride(0), out.stride(0), S, 1.4426950408889634 / math.sqrt(D),
        HQ=Hq, HKV=Hkv, D=D, HALF=half, HALF_PAD=max(16, next_pow2(half)), S_PAD=max(16, next_pow2(S)),
        HEADS=heads, num_warps=num_warps)
    return out, k


def _regs(compiled):
    return {"regs": getattr(compiled, "n_regs", None), "spills": getattr(compiled, "n_spills", None),
            "shared": getattr(compiled, "metadata", None) and getattr(compiled.metadata, "shared", None)}


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64, 128])
    ap.add_argument("--seq-len", type=int, nargs="+", default=[11, 5])
    ap.add_argument("--ncu-batch", type=int, default=0, help="no timing: launch each kernel 3 times at this batch")
    ap.add_argument("--out")
    a = ap.parse_args()
    from triton.testing import do_bench_cudagraph

    dev, dt = torch.device("cuda"), torch.bfloat16
    Hq, Hkv, D = 16, 2, 128
    rows = []
    for S in a.seq_len:
        pos = torch.arange(S, device=dev, dtype=torch.float32)[:, None]
        ang = pos / (10000 ** (torch.arange(0, D, 2, device=dev) / D))
        cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
        for batch in ([a.ncu_batch] if a.ncu_batch else a.batches):
            qkv = torch.randn(2 * batch * S, (Hq + 2 * Hkv) * D, device=dev, dtype=dt)
            if a.ncu_batch:
                for _ in range(3):
                    lat._launch(qkv, cos, sin, S, Hq, Hkv, D)
                    broadcast_launch(qkv, cos, sin, S, Hq, Hkv, D)
                torch.cuda.synchronize()
                continue
            ref = lat._launch(qkv, cos, sin, S, Hq, Hkv, D)
            for heads, warps in ((4, 4), (8, 4), (2, 4), (4, 2), (8, 8)):
                out, k = broadcast_launch(qkv, cos, sin, S, Hq, Hkv, D, heads, warps)
                row = {"seq_len": S, "batch": batch, "heads": heads, "warps": warps,
                       "max_abs_vs_kernel": (out.float() - ref.float()).abs().max().item(),
                       "broadcast_us": do_bench_cudagraph(
                           lambda: broadcast_launch(qkv, cos, sin, S, Hq, Hkv, D, heads, warps), rep=100) * 1e3,
                       **{f"broadcast_{k_}": v for k_, v in _regs(k).items()}}
                if (heads, warps) == (4, 4):
                    row["kernel_us"] = do_bench_cudagraph(
                        lambda: lat._launch(qkv, cos, sin, S, Hq, Hkv, D), rep=100) * 1e3
                    row["kernel_no_rope_us"] = do_bench_cudagraph(
                        lambda: lat._launch(qkv, None, None, S, Hq, Hkv, D), rep=100) * 1e3
                    row["copy_bytes_us"] = do_bench_cudagraph(  # a read of qkv and a write of out, for scale
                        lambda: qkv[:, :Hq * D].clone(), rep=100) * 1e3
                rows.append(row)
                print({k_: round(v, 4) if isinstance(v, float) else v for k_, v in row.items()}, flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
