"""The experimental few-token linear + LoRA kernel (benchmarks/experiments/skinny_gemm.py, not
used by the server) against float64, its split-K
bookkeeping, and the op's choice between it and cuBLAS + `kernels.lora`.

Runs compiled on a CUDA machine; elsewhere under Triton's CPU interpreter (TRITON_INTERPRET=1, set
by conftest.py before triton is imported); fails where triton is not installed.
"""

from __future__ import annotations

import sys

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import require_module, skip_unless_kernels_run

require_module("triton", "requirements-test.txt")

from tests.server import REPO  # noqa: E402
from voxcpm_triton.kernels import lora as lk  # noqa: E402

sys.path.insert(0, str(REPO / "benchmarks"))
from experiments import skinny_gemm as sg  # noqa: E402

CUDA = torch.cuda.is_available()
skip_unless_kernels_run(sg)
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")

DEV = torch.device("cuda" if CUDA else "cpu")
DT = torch.bfloat16 if CUDA else torch.float32
TOL = 2e-2 if CUDA else 1e-5  # relative to the output's scale: bf16 rounding of the output on the GPU


def _operands(M, N, K, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g).to(DEV, DT)
    w = (torch.randn(N, K, generator=g) / K ** 0.5).to(DEV, DT)
    return x, w


def _lora(splits, K, R, slots, halves, seed=1, n_slots=4):
    """Slot tables with random adapters in slots 1.. (slot 0 zero: the base model)."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(n_slots, len(splits) * R, K, generator=g) / K ** 0.5
    b = torch.randn(n_slots, sum(splits), R, generator=g) / R ** 0.5
    a[0], b[0] = 0, 0
    return sg.Lora(a.to(DEV, DT), b.to(DEV, DT), torch.tensor(slots, device=DEV), tuple(splits), halves)


def _expected(x, w, lora=None):
    """float64: x W^T plus, token by token, its row's adapter's delta for each target's columns."""
    out = x.double() @ w.double().t()
    if lora is None:
        return out
    G, R = lora.slots.numel(), lora.b.size(-1)
    T = x.size(0) // (lora.halves * G)
    for i in range(x.size(0)):
        s = int(lora.slots[(i // T) % G])
        col = 0
        for t, width in enumerate(lora.splits):
            u = x[i].double() @ lora.a[s, t * R:(t + 1) * R].double().t()
            out[i, col:col + width] += lora.b[s, col:col + width].double() @ u
            col += width
    return out


def _close(got, want):
    err = (got.double() - want).abs().max().item()
    assert err <= TOL * want.abs().max().item(), err


@pytest.mark.parametrize("M,N,K,cfg", [
    (1, 64, 256, sg.Config(16, 32, 64, 1)),  # one token, no split
    (3, 80, 1040, sg.Config(16, 32, 128, 4)),  # N past the last tile, K past the last split
    (37, 96, 512, sg.Config(64, 64, 128, 2)),  # one tile of 64 rows
    (70, 48, 320, sg.Config(16, 16, 64, 3)),  # five row tiles, an odd split
    (2, 32, 4096, sg.Config(16, 32, 256, 8)),  # long K, many splits
])
def test_product_equals_float64(M, N, K, cfg):
    x, w = _operands(M, N, K)
    _close(sg.launch(x, w, cfg), _expected(x, w))


@pytest.mark.parametrize("M,K,splits,R,slots,halves,cfg", [
    (2, 96, (32, 16, 16), 8, [3, 0], 1, sg.Config(16, 16, 64, 1)),  # LM decode: fused q/k/v, a base row
    (44, 200, (64,), 16, [1, 2], 2, sg.Config(64, 32, 64, 1)),  # LocDiT: CFG halves of 2 rows x 11 tokens
    (3, 512, (32, 32), 8, [2], 1, sg.Config(16, 32, 64, 4)),  # split K: shrinks summed before the expand
    (22, 128, (48,), 4, [3], 2, sg.Config(32, 16, 32, 2)),  # rank below the pad, odd split count
    (4, 256, (32, 16, 16), 8, [1, 2], 1, sg.Config(16, 16, 64, 4)),  # split K, two adapters, three targets
    (6, 128, (32,), 8, [1, 0, 2], 1, sg.Config(16, 16, 64, 1)),  # three rows: slot list padded to four
])
def test_lora_in_the_same_kernel_equals_float64(M, K, splits, R, slots, halves, cfg):
    x, w = _operands(M, sum(splits), K)
    lora = _lora(splits, K, R, slots, halves)
    _close(sg.launch(x, w, cfg, lora), _expected(x, w, lora))


def test_cfg_blocks_agree_with_the_served_lora_kernel():
    """The token layout of CFG blocks as `kernels.lora` (what the server runs) reads it."""
    splits, K = (64, 32), 96
    x, w = _operands(2 * 2 * 5, sum(splits), K)
    lora = _lora(splits, K, 8, [2, 3], halves=2)
    want = lk.lora_add(F.linear(x, w), x, lora.a, lora.b, lora.slots, splits, 2)
    _close(sg.launch(x, w, sg.Config(32, 32, 32, 2), lora), want.double())


def test_a_base_row_gets_the_plain_product():
    x, w = _operands(4, 64, 128)
    cfg = sg.Config(16, 32, 64, 2)
    lora = _lora((64,), 128, 8, [0, 0], 1)
    assert torch.equal(sg.launch(x, w, cfg, lora), sg.launch(x, w, cfg))


def test_split_k_leaves_the_counters_at_zero_and_is_deterministic():
    x, w = _operands(5, 96, 1024)
    cfg = sg.Config(16, 32, 64, 4)
    lora = _lora((96,), 1024, 8, [1], 1)
    for adapter in (None, lora):
        first = sg.launch(x, w, cfg, adapter)
        assert int(sg._counters(x.device).abs().sum()) == 0  # every tile's last program reset its counter
        assert torch.equal(sg.launch(x, w, cfg, adapter), first)  # same config: bit-identical
        _close(first, _expected(x, w, adapter))


def test_a_rows_result_does_not_depend_on_the_other_rows():
    """Eager runs and graph buckets pad the batch differently: a row must come out the same."""
    x, w = _operands(9, 64, 512)
    for M in (1, 4, 9):
        cfg = sg.config(M, 64, 512)
        assert torch.equal(sg.launch(x[:M], w, cfg)[0], sg.launch(x[:1], w, cfg)[0])


def test_config_by_token_count():
    assert sg.config(sg.MAX_M + 1, 2048, 2048) is None
    assert sg.config(0, 2048, 2048) is None
    for M, block_m in ((1, 16), (2, 16), (16, 16), (17, 32), (32, 32), (44, 64), (sg.MAX_M, 64)):
        assert sg.config(M, 2048, 6144).block_m == block_m
        assert sg.config(M, 100, 100).block_m == block_m  # untuned shapes: the default launch


def test_op_fuses_few_rows_and_leaves_the_rest_to_cublas_and_the_lora_kernel():
    K, splits = 128, (32, 16, 16)
    x, w = _operands(3, sum(splits), K)
    for slots, fused in (([2], True), ([1, 3], True), ([1, 2, 3], False)):
        lora = _lora(splits, K, 8, slots, 1)
        xs = x[:len(slots)]
        got = sg.linear_lora(xs[None], w, lora.a, lora.b, lora.slots, splits)
        assert got.shape == (1, len(slots), sum(splits))
        assert (sg.fused_config(len(slots), sum(splits), K, lora) is not None) == fused
        if not fused:
            assert torch.equal(got[0], lk.lora_add(F.linear(xs, w), xs, lora.a, lora.b, lora.slots, splits, 1))
        _close(got[0], _expected(xs, w, lora))
    # a column tile across two targets: not fused
    lora = _lora((24, 40), K, 8, [1], 1)
    assert sg.fused_config(1, 64, K, lora) is None


@pytest.mark.skipif(not CUDA, reason="torch.compile and CUDA graphs of the op need a GPU")
def test_op_inside_compile_and_a_cuda_graph():
    """A split-K launch (the LM's down projection: 4 splits) replayed: the counters come back to zero."""
    splits = (2048,)
    assert sg.config(2, 2048, 6144).split_k > 1
    x, w = _operands(2, sum(splits), 6144)
    lora = _lora(splits, 6144, 32, [1, 0], 1)
    fn = torch.compile(lambda t: sg.linear_lora(torch.relu(t), w, lora.a, lora.b, lora.slots, splits),
                       dynamic=True)
    want = fn(x)
    _close(want, _expected(torch.relu(x), w, lora))
    static = x.clone()
    fn(static)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(static)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want)
    assert int(sg._counters(x.device).abs().sum()) == 0
