"""The fused LocDiT/LocEnc attention kernel (`voxcpm_triton.kernels.local_attention`) against the
compiled PyTorch path, on a CUDA machine:

    python3 benchmarks/kernel_local_attention.py --out $OUT/local_attention_s11.json
    python3 benchmarks/kernel_local_attention.py --seq-len 5 --out $OUT/local_attention_s5.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python_backend"))
from voxcpm_triton.kernels import local_attention as lat  # noqa: E402
from voxcpm_triton.model.minicpm import apply_rope, local_attention  # noqa: E402


def bench(batches=(1, 8, 32, 64, 128), seq_len=11, n_heads=16, n_kv=2, head_dim=128, warp_counts=()):
    """Fused kernel vs the compiled PyTorch path (RoPE, fold, flash SDPA, unfold), microseconds per
    layer call from a CUDA graph, at LocDiT's shapes (CFG doubles the sequences), for every head
    blocking (and, with warp_counts, each of those warp counts too). Prints one line per batch; returns the rows."""
    from triton.testing import do_bench_cudagraph

    torch.backends.cuda.enable_cudnn_sdp(False)  # as the engine runs
    dev, dt = torch.device("cuda"), torch.bfloat16
    S, Hq, Hkv, D = seq_len, n_heads, n_kv, head_dim
    pos = torch.arange(S, device=dev, dtype=torch.float32)[:, None]
    ang = pos / (10000 ** (torch.arange(0, D, 2, device=dev) / D))
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()

    def torch_path(qkv):
        B = qkv.size(0) // S
        q, k, v = qkv.split([Hq * D, Hkv * D, Hkv * D], dim=-1)
        c, s = cos.repeat(B, 1), sin.repeat(B, 1)
        q, k = apply_rope(q.reshape(-1, Hq, D), c, s), apply_rope(k.reshape(-1, Hkv, D), c, s)
        out = local_attention(0, q.view(B, S, Hq, D), k.view(B, S, Hkv, D), v.reshape(B, S, Hkv, D))
        return out.reshape(B * S, Hq * D)

    compiled = torch.compile(torch_path, dynamic=True)
    rows = []
    print(f"local attention, S={S} Hq={Hq} Hkv={Hkv} D={D}, bf16, us per call (CUDA graph), "
          f"{torch.cuda.get_device_name()}")
    for batch in batches:
        n_seq = 2 * batch
        qkv = torch.randn(n_seq * S, (Hq + 2 * Hkv) * D, device=dev, dtype=dt)
        row = {"batch": batch, "sequences": n_seq, "auto_heads": lat.heads_per_program(Hq, Hkv),
               "torch_compiled_us": do_bench_cudagraph(lambda: compiled(qkv), rep=100) * 1e3}
        ref = compiled(qkv).float()
        for heads in (1, 2, 4, 8):
            out = lat._launch(qkv, cos, sin, S, Hq, Hkv, D, heads=heads)
            row[f"err_h{heads}"] = (out.float() - ref).abs().max().item()
            row[f"fused_h{heads}_us"] = do_bench_cudagraph(
                lambda: lat._launch(qkv, cos, sin, S, Hq, Hkv, D, heads=heads), rep=100) * 1e3
            for warps in warp_counts:  # the launch's default: 4 warps from 64 rows (heads x 16 padded tokens), else 2
                row[f"fused_h{heads}_w{warps}_us"] = do_bench_cudagraph(
                    lambda: lat._launch(qkv, cos, sin, S, Hq, Hkv, D, heads=heads, num_warps=warps), rep=100) * 1e3
        rows.append(row)
        print({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()})
    return rows


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=bench.__doc__)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64, 128])
    ap.add_argument("--seq-len", type=int, default=11, help="11: LocDiT, 5: LocEnc")
    ap.add_argument("--warps", type=int, nargs="*", default=[], help="also time these warp counts per head blocking")
    ap.add_argument("--out", help="write the rows as JSON here")
    a = ap.parse_args()
    if not lat.available():
        raise SystemExit("needs triton and a CUDA device")
    result = bench(tuple(a.batches), a.seq_len, warp_counts=tuple(a.warps))
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "seq_len": a.seq_len, "rows": result}, f, indent=1)
