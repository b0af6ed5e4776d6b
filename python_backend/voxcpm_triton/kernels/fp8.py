"""FP8 (e4m3) linear layers: weights quantised once per output channel, activations per token on
the fly, one `torch._scaled_mm` with row-wise scales (CUDA, compute capability >= 8.9).

    w = quantize_weight(linear.weight)      # FP8Weight: e4m3 [N, K], fp32 scales [1, N], bf16
    y = linear(x, w, bias)                   # x [..., K] bf16 -> [..., N] bf16

    y[m, n] = round_bf16(scale_x[m] * scale_w[n] * sum_k q(x)[m, k] * q(w)[n, k] + bias[n])

with q() the e4m3 rounding of x / scale (scale = absmax / 448 of the row). `linear` dispatches on
the weight's type: a plain tensor goes to `F.linear`, so one call site serves either precision.
Inside torch.compile the per-token scaling fuses into the kernels before the GEMM, and the whole
path captures in CUDA graphs (no host synchronisation, shapes only).

Off the GPU, `fp8_linear` computes the same arithmetic from the dequantised e4m3 values in fp32
(`emulated_scaled_mm`): the quantisation is then testable on the CPU, and the GPU kernel is checked
against it.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)  # 448
# A row of zeros (CFG's unconditional half, padding rows) gets this scale instead of 0: q(x) = 0.
_MIN_AMAX = 1e-12
# _scaled_mm needs K and N divisible by 16 (M is free).
ALIGN = 16


class FP8Weight(NamedTuple):
    """A linear weight in e4m3 with one fp32 scale per output channel.

    data: [N, K] float8_e4m3fn, contiguous; scale: [1, N] float32 (the layout `_scaled_mm` takes);
    dtype: the dtype of the activations it multiplies and of its outputs (the weight's own dtype
    before quantisation), so code that asks a weight for the model's dtype still gets it."""

    data: torch.Tensor
    scale: torch.Tensor
    dtype: torch.dtype

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    def dequantize(self) -> torch.Tensor:
        return (self.data.float() * self.scale.t()).to(self.dtype)


def eligible(out_features: int, in_features: int) -> bool:
    """Whether `_scaled_mm` takes a weight of this shape."""
    return out_features % ALIGN == 0 and in_features % ALIGN == 0


def _quantize(x: torch.Tensor, amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x / scale rounded to e4m3 (clamped: the cast does not saturate, 449 would become NaN), and the
    scale = amax / 448 in fp32."""
    scale = amax.float().clamp_min(_MIN_AMAX) / FP8_MAX
    q = (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scale


def quantize_weight(w: torch.Tensor) -> FP8Weight:
    """[N, K] weight -> FP8Weight with per-output-channel scales (done once, at load)."""
    if w.dim() != 2:
        raise ValueError(f"a linear weight is 2-D, got shape {tuple(w.shape)}")
    q, scale = _quantize(w.detach(), w.detach().abs().amax(dim=1, keepdim=True))
    # Fresh tensors, no views: torch.compile guards on a view's base size (one graph for all layers).
    return FP8Weight(q.contiguous(), scale.reshape(1, -1).clone(), w.dtype)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[M, K] activations -> (e4m3 [M, K], fp32 scales [M, 1]), one scale per token."""
    return _quantize(x, x.abs().amax(dim=-1, keepdim=True))


def emulated_scaled_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                       bias: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
    """What `torch._scaled_mm(a, b, scale_a, scale_b, bias, out_dtype=...)` computes with row-wise
    scales: a [M, K] and b [K, N] e4m3, products summed in fp32, scaled, bias added, rounded once."""
    out = (a.float() @ b.float()) * scale_a * scale_b
    if bias is not None:
        out = out + bias.float()
    return out.to(out_dtype)


def fp8_linear(x: torch.Tensor, w: FP8Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] -> [..., N] in w.dtype: x quantised per token, one scaled GEMM."""
    lead, K = x.shape[:-1], x.shape[-1]
    # Row-major, as _scaled_mm takes its first operand (a pointwise op keeps its input's strides).
    xq, sx = quantize_rows(x.reshape(-1, K).contiguous())
    if bias is not None and bias.dtype != w.dtype:
        bias = bias.to(w.dtype)
    if x.is_cuda:
        out = torch._scaled_mm(xq, w.data.t(), scale_a=sx, scale_b=w.scale, bias=bias, out_dtype=w.dtype)
    else:
        out = emulated_scaled_mm(xq, w.data.t(), sx, w.scale, bias, w.dtype)
    return out.reshape(*lead, w.data.shape[0])


def linear(x: torch.Tensor, w, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear for a plain weight, `fp8_linear` for an FP8Weight: the one call the model's linears go
    through, so that a precision switch changes only the weights it is given."""
    if isinstance(w, FP8Weight):
        return fp8_linear(x, w, bias)
    return F.linear(x, w, bias)


def supported(device: torch.device) -> str | None:
    """None where `_scaled_mm` runs on `device`, else why not."""
    if device.type != "cuda":
        return f"FP8 GEMMs need a CUDA GPU (device is {device})"
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < (8, 9):
        return (f"FP8 GEMMs need compute capability >= 8.9 (Ada, Hopper or newer); "
                f"{torch.cuda.get_device_name(device)} is {major}.{minor}")
    return None
