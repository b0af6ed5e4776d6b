"""The paged decode attention kernel (`voxcpm_triton.kernels.paged_attention`) against the PyTorch
version (`voxcpm_triton.engine.attention.paged_decode_attention`), on a CUDA machine:

    python3 benchmarks/kernel_paged_attention.py [--context 512] [--batches 1 8 32 64 128]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python_backend"))
from voxcpm_triton.engine.attention import paged_decode_attention  # noqa: E402
from voxcpm_triton.kernels import paged_attention as pa  # noqa: E402


def bench(batches=(1, 8, 32, 64, 128), context=512, Hq=16, Hkv=2, D=128, block_size=16,
          dtype=torch.bfloat16, num_splits=None):
    """Kernel vs PyTorch reference, microseconds per call (one layer), real VoxCPM2 shapes.
    'graph' columns replay a CUDA graph (what the engine's captured decode sees); 'eager' includes
    the Python launch cost (Triton's launcher is ~15-25 us of CPU per launch)."""
    from triton.testing import do_bench, do_bench_cudagraph

    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    nb = -(-context // block_size)
    x = torch.randn(4096, 4096, device=dev)
    for _ in range(100):  # let the clocks ramp up before the first row
        x @ x
    torch.cuda.synchronize()
    print(f"paged decode attention: Hq={Hq} Hkv={Hkv} D={D} block_size={block_size} context={context} "
          f"dtype={dtype} device={torch.cuda.get_device_name()}")
    print(f"{'B':>5} {'splits':>6} {'triton graph':>12} {'torch graph':>11} {'speedup':>8} "
          f"{'triton eager':>12} {'torch eager':>11} {'max err':>9} {'GB/s':>6}")
    for B in batches:
        num_blocks = B * nb + 1
        kp = torch.randn(num_blocks, block_size, Hkv, D, generator=g, device=dev).to(dtype)
        vp = torch.randn(num_blocks, block_size, Hkv, D, generator=g, device=dev).to(dtype)
        q = torch.randn(B, 1, Hq, D, generator=g, device=dev).to(dtype)
        bt = (torch.randperm(num_blocks - 1, generator=g, device=dev)[:B * nb] + 1).view(B, nb)
        cl = torch.full((B,), context, dtype=torch.int64, device=dev)
        splits = num_splits or pa.choose_num_splits(B, Hkv, nb * block_size, 64 if D <= 128 else 32, dev)
        ours = lambda: pa.paged_decode_attention_triton(q, kp, vp, bt, cl, num_splits=num_splits)  # noqa: E731
        ref = lambda: paged_decode_attention(q, kp, vp, bt, cl)  # noqa: E731
        err = (ours().float() - ref().float()).abs().max().item()
        t_ours, t_ref = (do_bench_cudagraph(f, rep=100) * 1e3 for f in (ours, ref))
        e_ours, e_ref = (do_bench(f, warmup=25, rep=100) * 1e3 for f in (ours, ref))
        gbs = 2 * B * context * Hkv * D * kp.element_size() / (t_ours * 1e-6) / 1e9
        print(f"{B:>5} {splits:>6} {t_ours:>12.1f} {t_ref:>11.1f} {t_ref / t_ours:>7.1f}x "
              f"{e_ours:>12.1f} {e_ref:>11.1f} {err:>9.2e} {gbs:>6.0f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=bench.__doc__)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64, 128])
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--splits", type=int, default=None, help="force a split-K count (default: auto)")
    a = ap.parse_args()
    if not pa.available():
        raise SystemExit("needs triton and a CUDA device")
    bench(tuple(a.batches), a.context, block_size=a.block_size, num_splits=a.splits)
