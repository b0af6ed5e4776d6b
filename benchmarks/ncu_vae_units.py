"""One launch each of the VAE's residual-unit kernels at served shapes (64 streams x 4 patches), for
Nsight Compute: which limit each kernel hits (memory, L1, occupancy, stalls).

    ncu -k regex:"unit_tail|dwconv_snake|snake_extend" --section SpeedOfLight --section MemoryWorkloadAnalysis \
        --section Occupancy --section LaunchStats --section WarpStateStats python3 benchmarks/ncu_vae_units.py

Launches, in order: snake_extend and unit_tail at 128 channels x 7680 frames, the same at 32 x 30720,
snake_extend and dwconv_snake at 256 x 3840 (dilation 1 each).
"""

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python_backend"))
from voxcpm_triton.kernels import vae as K  # noqa: E402

B = 64
for C, T, d in ((128, 7680, 1), (32, 30720, 1), (256, 3840, 1)):
    g = lambda *s: torch.randn(*s, device="cuda")  # noqa: E731
    x, prev = g(B, C, T), g(B, C, 6 * d)
    w, bias, alpha = g(C, 1, 7) / 3, g(C), torch.rand(C, device="cuda") + 0.5
    pw, pb = g(C, C, 1) / C ** 0.5, g(C)
    xp, _ = K.snake_extend(prev, x, alpha)
    if C <= K.UNIT_MAX_CHANNELS:
        K.unit_tail(xp, x, w, bias, alpha, pw, pb, d)
    else:
        K.dwconv_snake(xp, w, bias, alpha, d)
torch.cuda.synchronize()
