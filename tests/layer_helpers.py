"""Shared by the fused decoder-layer kernels' tests (test_persistent_layer, test_five_kernel_layer):
random layer weights, RoPE tables, the PyTorch path they replace, and its tolerance."""

from __future__ import annotations

import torch

from voxcpm_triton.model.minicpm import LayerMath, local_attention

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
EPS = 1e-5


def stack_depth(kwargs: dict) -> int:
    """The layers a `persistent_layer.layer` call runs as one stack (its private `_stack` argument,
    which `persistent_layer.stack` passes), or 0 for a lone layer: what tests that spy on the
    kernel's launches count layers by."""
    return (kwargs.get("_stack") or (None, 0))[1]


def rand(*shape, g, scale=1.0, dtype=torch.float32):
    return (torch.randn(*shape, generator=g) * scale).to(DEV, dtype)


def tol(dtype, ref):
    """fp32: accumulation order only. bf16: a GEMM output rounded one ulp apart at most, times the
    GEMMs that follow in a layer."""
    return (1e-4 if dtype == torch.float32 else 4e-2) * max(1.0, ref.float().abs().max().item())


def layer_weights(H, Hq, Hkv, D, I, dtype, seed):
    """-> norm1, qkv, o, norm2, gate_up, down weights of one layer."""
    g = torch.Generator().manual_seed(seed)
    qkv = rand((Hq + 2 * Hkv) * D, H, g=g, scale=H ** -0.5, dtype=dtype)
    o = rand(H, Hq * D, g=g, scale=(Hq * D) ** -0.5, dtype=dtype)
    gate_up = rand(2 * I, H, g=g, scale=H ** -0.5, dtype=dtype)
    down = rand(H, I, g=g, scale=I ** -0.5, dtype=dtype)
    n1, n2 = (1 + 0.1 * rand(H, g=g)).to(dtype), (1 + 0.1 * rand(H, g=g)).to(dtype)
    return n1, qkv, o, n2, gate_up, down


def rope(S, D, halves_differ=False):
    """cos, sin [S, D] fp32 in rotate-half form: both halves repeat the D/2 frequencies, as
    `minicpm.LongRoPE` builds them (the local attention kernel reads the first half only).
    halves_differ: a second half of other frequencies, which catches a swapped half in a kernel that
    reads both (the LM's paged attention)."""
    pos = torch.arange(S, dtype=torch.float32)[:, None]
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    ang = torch.cat([pos * inv, pos * inv * (1.3 if halves_differ else 1.0)], dim=-1)
    return ang.cos().to(DEV), ang.sin().to(DEV)


def reference_layer(x, weights, cos, sin, B, S, heads):
    """The PyTorch path, eagerly: `LayerMath` around `minicpm.local_attention`."""
    n1, qkv_w, o_w, n2, gu_w, d_w = weights
    Hq, Hkv, D = heads
    m = LayerMath(Hq, Hkv, D, EPS, None)
    rows = (cos.repeat(B, 1), sin.repeat(B, 1)) if cos is not None else (None, None)
    q, k, v = m.attention_inputs(x, n1, qkv_w, *rows)
    attn = local_attention(0, q.view(B, S, Hq, D), k.view(B, S, Hkv, D), v.view(B, S, Hkv, D))
    return m.attention_output_mlp(x, attn.reshape(B * S, -1), o_w, n2, gu_w, d_w)
