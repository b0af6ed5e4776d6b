"""Each upsampling ConvTranspose1d of the full-size VAE decoder: cuDNN's transposed conv against the
polyphase conv + `voxcpm_triton.kernels.vae.phase_interleave`, on a CUDA machine:

    python3 benchmarks/kernel_vae_polyphase.py --streams 8 --patches 16 --out $OUT/polyphase_8x16.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python_backend"))
from voxcpm_triton.kernels import vae as vae_kernels  # noqa: E402
from voxcpm_triton.model.audio_vae import CausalConvTranspose1d  # noqa: E402


def bench(streams: int = 8, patches: int = 16, rates=(8, 6, 5, 2, 2, 2), dim: int = 2048, frames_per_patch: int = 4):
    """Each upsampling conv of the full-size decoder for `streams` x `patches` (one frame of
    look-back, as streaming runs it): cuDNN's transposed conv against the polyphase conv +
    `phase_interleave`. Microseconds per call (triton.testing.do_bench), one row per level."""
    from triton.testing import do_bench

    rows, T = [], frames_per_patch * patches
    for level, stride in enumerate(rates):
        c_in, c_out = dim // 2 ** level, dim // 2 ** (level + 1)
        up = CausalConvTranspose1d(c_in, c_out, stride).cuda()
        x, w = torch.randn(streams, c_in, T + 1, device="cuda"), up.phase_weight()
        w_rows = w.contiguous()  # the weight row-major, as a plain conv's is
        w_last = w_rows.transpose(1, 2).contiguous().transpose(1, 2)  # and channels-last
        rows.append({
            "level": level, "channels_in": c_in, "frames_in": T, "streams": streams,
            "conv_transpose_us": do_bench(lambda: torch.nn.functional.conv_transpose1d(
                x, up.weight, up.bias, stride, padding=stride)) * 1e3,
            "polyphase_us": do_bench(lambda: vae_kernels.phase_interleave(torch.nn.functional.conv1d(x, w), up.bias, stride)) * 1e3,
            "polyphase_row_major_weight_us": do_bench(
                lambda: vae_kernels.phase_interleave(torch.nn.functional.conv1d(x, w_rows), up.bias, stride)) * 1e3,
            "polyphase_channels_last_weight_us": do_bench(
                lambda: vae_kernels.phase_interleave(torch.nn.functional.conv1d(x, w_last), up.bias, stride)) * 1e3,
        })
        print({k: round(v, 1) if isinstance(v, float) else v for k, v in rows[-1].items()}, flush=True)
        T *= stride
    return rows


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=bench.__doc__)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--patches", type=int, default=16)
    ap.add_argument("--out", help="write the rows as JSON here")
    a = ap.parse_args()
    if not vae_kernels.available():
        raise SystemExit("needs triton and a CUDA device")
    result = bench(a.streams, a.patches)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "streams": a.streams, "patches": a.patches,
                       "rows": result}, f, indent=1)
