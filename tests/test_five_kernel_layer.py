"""The experimental five-kernel decoder layer (benchmarks/experiments/five_kernel_layer.py, not used
by the server) against the PyTorch path it would replace (`LayerMath` around
`minicpm.local_attention`, run eagerly), piece by piece and whole; and the experimental L2 prefetch.

Runs compiled on a CUDA machine, where split-K programs race (the last to arrive sums); elsewhere
under Triton's CPU interpreter (TRITON_INTERPRET=1, set by conftest.py before triton is imported);
fails where triton is not installed (setup.sh installs it).
"""

from __future__ import annotations

import sys

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import require_module, skip_unless_kernels_run

require_module("triton", "requirements-test.txt")

from tests.server import REPO  # noqa: E402
from tests.layer_helpers import DEV, EPS, layer_weights, rand, reference_layer, tol  # noqa: E402
from tests.layer_helpers import rope as rope_tables  # noqa: E402
from voxcpm_triton.model.minicpm import rms_norm  # noqa: E402

sys.path.insert(0, str(REPO / "benchmarks"))
from experiments import five_kernel_layer as fl  # noqa: E402
from experiments import l2_prefetch  # noqa: E402

CUDA = torch.cuda.is_available()
skip_unless_kernels_run(fl)
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")

DTYPES = [torch.float32, torch.bfloat16]


# (M tokens, N, K, cfg): the interpreter's share; the GPU adds LocDiT's full-size shapes
LINEAR_CASES = [
    (22, 96, 128, fl.Config(32, 64)),
    (5, 64, 256, fl.Config(16, 64, 2)),  # split K: the last program to arrive sums
    (40, 48, 192, fl.Config(16, 64, 3)),  # a ragged last column tile, three splits
    (1, 32, 64, None),  # the default launch
]
if CUDA:
    LINEAR_CASES += [(M, N, K, cfg) for M in (10, 44) for N, K in ((2560, 1024), (1024, 2048), (1024, 4096))
                     for cfg in (None, fl.Config(32, 256, 4, 4, 3))]


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("M,N,K,cfg", LINEAR_CASES)
@pytest.mark.parametrize("kind", ["plain", "norm", "residual", "gated"])
def test_linear_matches_eager(kind, M, N, K, cfg, dtype):
    if kind == "gated" and cfg is not None and cfg.split_k > 1:
        cfg = cfg._replace(split_k=1)
    g = torch.Generator().manual_seed(M * 7 + N)
    x = rand(M, K, g=g, dtype=dtype)
    w = rand(2 * N if kind == "gated" else N, K, g=g, scale=K ** -0.5, dtype=dtype)
    norm = rand(K, g=g, dtype=dtype) if kind in ("norm", "gated") else None
    res = rand(M, N, g=g, dtype=dtype) if kind == "residual" else None
    for launch in range(2):  # a second launch finds the split-K counters back at zero
        out = fl.linear(x, w, norm=norm, eps=EPS, residual=res, gated=kind == "gated", cfg=cfg)
        h = rms_norm(x, norm, EPS) if norm is not None else x
        y = F.linear(h, w)
        if kind == "gated":
            gate, up = y.chunk(2, dim=-1)
            y = F.silu(gate) * up
        if res is not None:
            y = res + y
        assert out.shape == (M, N) and out.dtype == dtype
        err = (out.float() - y.float()).abs().max().item()
        assert err <= tol(dtype, y), f"launch {launch}: max abs err {err:.3g}"
    assert int(fl._counters(x.device).abs().sum()) == 0  # every counter back at rest


# (sequences, S tokens, hidden, Hq, Hkv, D, FFN)
LAYER_SHAPES = [(2, 11, 128, 4, 2, 32, 256), (2, 5, 64, 4, 1, 16, 128), (4, 11, 96, 3, 1, 32, 192)]
if CUDA:
    LAYER_SHAPES += [(2, 11, 1024, 16, 2, 128, 4096), (4, 11, 1024, 16, 2, 128, 4096), (2, 5, 1024, 16, 2, 128, 4096)]


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("rope", [True, False], ids=["rope", "norope"])
@pytest.mark.parametrize("B,S,H,Hq,Hkv,D,I", LAYER_SHAPES)
def test_layer_matches_layer_math(B, S, H, Hq, Hkv, D, I, rope, dtype):
    weights = layer_weights(H, Hq, Hkv, D, I, dtype, seed=B * S + H)
    n1, qkv_w, o_w, n2, gu_w, d_w = weights
    x = rand(B * S, H, g=torch.Generator().manual_seed(1), dtype=dtype)
    cos, sin = rope_tables(S, D) if rope else (None, None)
    out = fl.layer(x, n1, qkv_w, cos, sin, S, (Hq, Hkv, D), o_w, n2, gu_w, d_w, EPS)
    ref = reference_layer(x, weights, cos, sin, B, S, (Hq, Hkv, D))
    assert out.shape == ref.shape and out.dtype == dtype
    err = (out.float() - ref.float()).abs().max().item()
    assert err <= tol(dtype, ref), f"max abs err {err:.3g}"


def test_too_many_tokens_is_refused():
    with pytest.raises(AssertionError, match="tokens"):
        fl.linear(torch.zeros(fl.MAX_TOKENS + 1, 8, device=DEV), torch.zeros(8, 8, device=DEV))


def test_l2_prefetch_changes_nothing():
    """Reading weights into L2 early is a hint: the layer's result is the same with it (a no-op
    where it cannot run: the CPU, the interpreter, GPUs before sm_90)."""
    n1, qkv_w, o_w, n2, gu_w, d_w = layer_weights(128, 4, 2, 32, 256, torch.bfloat16, seed=3)
    x = rand(22, 128, g=torch.Generator().manual_seed(2), dtype=torch.bfloat16)
    cos, sin = rope_tables(11, 32)
    before = fl.layer(x, n1, qkv_w, cos, sin, 11, (4, 2, 32), o_w, n2, gu_w, d_w, EPS)
    l2_prefetch.prefetch([o_w, gu_w, d_w, qkv_w])
    l2_prefetch.prefetch([o_w, None, d_w])
    after = fl.layer(x, n1, qkv_w, cos, sin, 11, (4, 2, 32), o_w, n2, gu_w, d_w, EPS)
    assert torch.equal(before, after)
    assert l2_prefetch.supported(x.device) == (CUDA and torch.cuda.get_device_capability() >= (9, 0))
