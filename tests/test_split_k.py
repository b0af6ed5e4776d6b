"""The output and down projections split along K (`voxcpm_triton.model.split_k`): the partial products
summed equal the one GEMM, the strided views copy nothing, and the split runs only where it was
measured (CUDA, bf16/fp16, plain weights, few rows, VOXCPM_SPLIT_K=1): elsewhere `linear` is the plain one."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from voxcpm_triton.kernels import fp8
from voxcpm_triton.model import minicpm, split_k


@pytest.mark.parametrize("M,N,K,S", [(176, 64, 512, 2), (3, 32, 256, 4), (1, 16, 128, 2)])
def test_the_partial_products_summed_equal_one_gemm(M, N, K, S):
    g = torch.Generator().manual_seed(M)
    x, w = torch.randn(M, K, generator=g, dtype=torch.float64), torch.randn(N, K, generator=g, dtype=torch.float64)
    torch.testing.assert_close(split_k.split_matmul(x, w, S), F.linear(x, w), rtol=1e-12, atol=1e-12)


def test_the_slices_are_views_of_the_operands():
    """The batched GEMM reads x and w in place: its operands share their storage (no copy per call)."""
    x, w = torch.randn(8, 256), torch.randn(32, 256)
    seen = []
    real = torch.bmm
    try:
        torch.bmm = lambda a, b: seen.append((a, b)) or real(a, b)  # noqa: E731
        split_k.split_matmul(x, w, 4)
    finally:
        torch.bmm = real
    (a, b), = seen
    assert a.data_ptr() == x.data_ptr() and b.data_ptr() == w.data_ptr()
    assert a.shape == (4, 8, 64) and b.shape == (4, 64, 32)


def test_linear_is_the_plain_one_where_the_split_does_not_run(monkeypatch):
    monkeypatch.setattr(split_k, "ENABLED", True)
    x, w = torch.randn(4, 256), torch.randn(16, 256)
    assert not split_k.runs(x, w)  # the CPU
    torch.testing.assert_close(split_k.linear(x, w), F.linear(x, w), rtol=0, atol=0)
    q = fp8.quantize_weight(w)
    assert not split_k.runs(x, q)  # an FP8 weight goes to its own GEMM
    monkeypatch.setattr(split_k, "ENABLED", False)
    assert not split_k.runs(x, w)


def test_runs_checks_rows_width_layout_and_dtype(monkeypatch):
    """The conditions besides the device, on a stand-in for x.is_cuda (the CPU has no CUDA tensor)."""
    monkeypatch.setattr(split_k, "ENABLED", True)

    class Cuda(torch.Tensor):
        @property
        def is_cuda(self):
            return True

    bf = torch.bfloat16
    w = torch.randn(16, 256, dtype=bf)
    x = lambda m, k=256, dt=bf: torch.randn(m, k, dtype=dt).as_subclass(Cuda)  # noqa: E731
    assert split_k.runs(x(176), w)
    assert not split_k.runs(x(split_k.MAX_TOKENS + 1), w)  # enough tiles without it
    assert not split_k.runs(x(8, 192), torch.randn(16, 192, dtype=bf))  # K/2 is no whole 64-wide slice
    assert not split_k.runs(x(8, dt=torch.float32), w.float())  # fp32: the plain GEMM
    assert not split_k.runs(torch.randn(256, 8, dtype=bf).t().as_subclass(Cuda), w)  # columns not contiguous
    monkeypatch.setattr(split_k, "ENABLED", False)
    assert not split_k.runs(x(176), w)


def test_the_layer_takes_it_for_the_output_and_down_projections(monkeypatch):
    """LayerMath's MLP half asks `split_k.linear` for exactly those two (gate/up stays one GEMM)."""
    calls = []
    monkeypatch.setattr(split_k, "linear", lambda x, w: calls.append(tuple(w.shape)) or F.linear(x, w))
    m = minicpm.LayerMath(2, 1, 8, 1e-5, None)
    H, I = 16, 32
    x, attn = torch.randn(3, H), torch.randn(3, 16)
    out = m.attention_output_mlp(x, attn, torch.randn(H, 16), torch.ones(H), torch.randn(2 * I, H), torch.randn(H, I))
    assert calls == [(H, 16), (H, I)] and out.shape == (3, H)
