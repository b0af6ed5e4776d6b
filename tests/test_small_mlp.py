"""The experimental few-token fused MLP kernel (benchmarks/experiments/small_mlp.py, not used by the
server) against float64, and its accumulator's bookkeeping across launches.

Runs compiled on a CUDA machine, where its programs race (fp32 atomics, the last to arrive
finishes): the first version of its last program lost sums there, and the full-size shapes
below are the ones that showed it. Elsewhere under Triton's CPU interpreter (TRITON_INTERPRET=1,
set by conftest.py before triton is imported); fails where triton is not installed.
"""

from __future__ import annotations

import sys

import pytest
import torch

from tests.conftest import require_module, skip_unless_kernels_run

require_module("triton", "requirements-test.txt")

from tests.server import REPO  # noqa: E402

sys.path.insert(0, str(REPO / "benchmarks"))
from experiments import small_mlp as sm  # noqa: E402

CUDA = torch.cuda.is_available()
skip_unless_kernels_run(sm)
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")

DEV = torch.device("cuda" if CUDA else "cpu")
DT = torch.bfloat16 if CUDA else torch.float32
TOL = 2e-2 if CUDA else 1e-5  # relative to the output's scale: bf16 roundings on the GPU


def _operands(M, K, I, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g)
    res = torch.randn(M, K, generator=g)
    w_gu = torch.randn(2 * I, K, generator=g) / K ** 0.5
    w_d = torch.randn(K, I, generator=g) / I ** 0.5
    return tuple(t.to(DEV, DT) for t in (x, res, w_gu, w_d))


def _expected(x, res, w_gu, w_d):
    gate, up = (x.double() @ w_gu.double().t()).chunk(2, dim=-1)
    return res.double() + (torch.nn.functional.silu(gate) * up) @ w_d.double().t()


SHAPES = [  # (M, K, I, cfg): small enough for the interpreter; the GPU adds the decode shapes
    (1, 128, 128, sm.Config(32, 64, 64)),
    (5, 256, 256, sm.Config(64, 128, 128)),
    (22, 128, 192, sm.Config(32, 64, 128)),
    (64, 128, 128, sm.Config(16, 128, 64)),
]
if CUDA:
    SHAPES += [(M, K, I, cfg) for M in (1, 10, 22) for K, I in ((1024, 4096), (2048, 6144))
               for cfg in (sm.DEFAULT, sm.Config(64, 128, 256, 8, 3), sm.Config(64, 256, 256, 4, 3))]


@pytest.mark.parametrize("M,K,I,cfg", SHAPES)
def test_equals_float64_on_every_launch_and_leaves_the_workspace_at_rest(M, K, I, cfg):
    ops = _operands(M, K, I)
    want = _expected(*ops)
    acc, count = sm._workspace(ops[0].device, K)  # the launches' own (cuda:0 where DEV is "cuda")
    for _ in range(5 if CUDA else 2):
        got = sm.launch(*ops, cfg)
        err = (got.double() - want).abs().max().item()
        assert err <= TOL * want.abs().max().item(), err
        assert acc.abs().max().item() == 0 and count.item() == 0


def test_unsupported_shapes_are_refused_naming_them():
    x, res, w_gu, w_d = _operands(sm.MAX_M + 1, 128, 128)
    with pytest.raises(ValueError, match=r"small_mlp: unsupported shapes x \(65, 128\)"):
        sm.launch(x, res, w_gu, w_d, sm.Config(32, 64, 64))
    x, res, w_gu, w_d = _operands(2, 128, 96)
    with pytest.raises(ValueError, match=r"gate_up \(192, 128\), down \(128, 96\)"):
        sm.launch(x, res, w_gu, w_d, sm.Config(64, 64, 64))  # 96 intermediate features: no whole tiles
