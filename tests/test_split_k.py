"""The output and down projections split along K (`voxcpm_triton.model.split_k`): the partial products
summed equal the one GEMM, the strided views copy nothing, and the split runs only where it was
measured (CUDA, bf16, plain weights, few rows; on unless VOXCPM_SPLIT_K=0): elsewhere `linear` is the
plain one."""

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


class _Cuda(torch.Tensor):
    """A CPU tensor that says it is on CUDA: `runs`' other conditions, on a machine without a GPU."""

    @property
    def is_cuda(self):
        return True


def _on_cuda(m, k=256, dt=torch.bfloat16):
    return torch.randn(m, k, dtype=dt).as_subclass(_Cuda)


def test_linear_is_the_plain_one_where_the_split_does_not_run(monkeypatch):
    monkeypatch.setattr(split_k, "ENABLED", True)
    w = torch.randn(16, 256, dtype=torch.bfloat16)
    x = torch.randn(4, 256, dtype=torch.bfloat16)
    assert not split_k.runs(x, w)  # a bf16 call on the CPU
    torch.testing.assert_close(split_k.linear(x, w), F.linear(x, w), rtol=0, atol=0)
    assert split_k.runs(_on_cuda(4), w)
    q = fp8.quantize_weight(w)
    assert q.dtype == torch.bfloat16 and not split_k.runs(_on_cuda(4), q)  # an FP8 weight: its own GEMM
    monkeypatch.setattr(split_k, "ENABLED", False)
    assert not split_k.runs(_on_cuda(4), w)


def test_runs_checks_rows_width_layout_and_dtype(monkeypatch):
    monkeypatch.setattr(split_k, "ENABLED", True)
    bf, h = torch.bfloat16, torch.float16
    w = torch.randn(16, 256, dtype=bf)
    assert split_k.runs(_on_cuda(176), w)
    assert split_k.runs(_on_cuda(split_k.MAX_TOKENS), w)
    assert not split_k.runs(_on_cuda(split_k.MAX_TOKENS + 1), w)  # enough tiles without it
    assert not split_k.runs(_on_cuda(8, dt=h), w.to(h))  # fp16: a half could overflow where the sum does not
    assert not split_k.runs(_on_cuda(8), w.to(h))  # operands of two dtypes
    assert not split_k.runs(_on_cuda(8, 192), torch.randn(16, 192, dtype=bf))  # K/2 is no whole 64-wide slice
    assert not split_k.runs(_on_cuda(8, dt=torch.float32), w.float())  # fp32: the plain GEMM
    assert not split_k.runs(torch.randn(256, 8, dtype=bf).t().as_subclass(_Cuda), w)  # columns not contiguous


def test_the_slice_count_is_read_at_each_call(monkeypatch):
    """A benchmark sets `SPLITS` after import (closed_loop.py's split_k4): `runs` and `linear` follow it."""
    monkeypatch.setattr(split_k, "ENABLED", True)
    w = torch.randn(16, 384, dtype=torch.bfloat16)
    assert split_k.runs(_on_cuda(8, 384), w)  # two slices of 192
    monkeypatch.setattr(split_k, "SPLITS", 4)
    assert not split_k.runs(_on_cuda(8, 384), w)  # four of 96: no whole 64-wide K tile each
    seen = []
    monkeypatch.setattr(split_k, "split_matmul", lambda x, w, s: seen.append(s))
    split_k.linear(_on_cuda(8, 512), torch.randn(16, 512, dtype=torch.bfloat16))
    assert seen == [4]


@pytest.mark.parametrize("value,enabled", [(None, True), ("1", True), ("0", False)])
def test_the_flag_is_on_unless_set_to_0(monkeypatch, value, enabled):
    import importlib

    was = split_k.ENABLED  # the session's own setting (a run with VOXCPM_SPLIT_K=0) comes back after
    if value is None:
        monkeypatch.delenv("VOXCPM_SPLIT_K", raising=False)
    else:
        monkeypatch.setenv("VOXCPM_SPLIT_K", value)
    try:
        assert importlib.reload(split_k).ENABLED is enabled
    finally:
        split_k.ENABLED = was


def test_bf16_partials_stay_within_a_rounding_of_one_gemm():
    """Each half rounded to bf16, then the sum: against float64, at most a few times one GEMM's error."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 1024, generator=g).to(torch.bfloat16)
    w = (torch.randn(256, 1024, generator=g) / 32).to(torch.bfloat16)
    exact = x.double() @ w.double().t()
    one = (F.linear(x, w).double() - exact).abs().max().item()
    split = (split_k.split_matmul(x, w, split_k.SPLITS).double() - exact).abs().max().item()
    assert split <= 3 * one, (split, one)


def test_the_layer_splits_the_output_and_down_projections_without_an_adapter_op(monkeypatch):
    """LayerMath's MLP half asks `split_k.linear` for exactly those two (gate/up stays one GEMM), and
    for neither where an adapter's op follows the projection (its kernel would come between the
    partials and their sum)."""
    calls = []
    monkeypatch.setattr(split_k, "linear", lambda x, w: calls.append(tuple(w.shape)) or F.linear(x, w))
    m = minicpm.LayerMath(2, 1, 8, 1e-5, None)
    H, I = 16, 32
    x, attn = torch.randn(3, H), torch.randn(3, 16)
    weights = (torch.randn(H, 16), torch.ones(H), torch.randn(2 * I, H), torch.randn(H, I))
    out = m.attention_output_mlp(x, attn, *weights)
    assert calls == [(H, 16), (H, I)] and out.shape == (3, H)

    class Ops:  # an adapter's op on the output projection only
        o, gate_up, down = object(), None, None

    seen = []
    monkeypatch.setattr(minicpm, "lora_add", lambda y, x_, op: seen.append(op) or y)
    calls.clear()
    m.attention_output_mlp(x, attn, *weights, Ops())
    assert calls == [(H, I)] and seen == [Ops.o, None]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the split runs on CUDA only; torch.compile, CUDA graphs")
@pytest.mark.parametrize("tokens", [176, 1408])  # LocDiT at batch buckets 8 and 64
def test_on_the_gpu_the_compiled_layer_splits_captures_and_stays_within_a_rounding(monkeypatch, tokens):
    """LayerMath's MLP half at LocDiT's sizes, torch.compile'd as the engine compiles it (dynamic, weights
    as Parameters), with the flag on: the split is traced in one graph (split_views called while
    compiling, for the two projections only), the result stays within a few bf16 roundings of the
    unsplit compiled half, and a CUDA graph of the compiled code replays the same."""
    dev, bf = torch.device("cuda"), torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(tokens)
    r = lambda *shape, scale=1.0: (torch.randn(*shape, device=dev, generator=g) * scale).to(bf)  # noqa: E731
    H, I, D = 1024, 4096, 16 * 128
    x, attn = r(tokens, H), r(tokens, D)
    weights = tuple(torch.nn.Parameter(w, requires_grad=False) for w in (
        r(H, D, scale=D ** -0.5), 1 + r(H, scale=0.1), r(2 * I, H, scale=H ** -0.5), r(H, I, scale=I ** -0.5)))
    m = minicpm.LayerMath(16, 2, 128, 1e-5, None)

    def compiled_half(enabled: bool):
        torch._dynamo.reset()
        monkeypatch.setattr(split_k, "ENABLED", enabled)
        return torch.compile(m.attention_output_mlp, dynamic=True, fullgraph=True)  # no graph break

    with torch.no_grad():
        plain = compiled_half(False)(x, attn, *weights)
        traced = []
        real_views = split_k.split_views
        monkeypatch.setattr(split_k, "split_views", lambda *a: traced.append(tuple(a[1].shape)) or real_views(*a))
        split = compiled_half(True)(x, attn, *weights)
        assert set(traced) == {(H, I), (H, D)}  # the down and output projections, nothing else
        exact = m.attention_output_mlp(x.double(), attn.double(), *(w.double() for w in weights))
        err = lambda y: (y.double() - exact).abs().max().item()  # noqa: E731
        assert err(split) <= 2 * err(plain) + 1e-2, (err(split), err(plain))
        # compiled again without the tracing hook (whose list dynamo guards), warmed up, then captured
        monkeypatch.setattr(split_k, "split_views", real_views)
        f = compiled_half(True)
        for _ in range(2):
            again = f(x, attn, *weights)
        assert err(again) <= 2 * err(plain) + 1e-2, (err(again), err(plain))
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            out = f(x, attn, *weights)
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out, again, rtol=0, atol=0)
