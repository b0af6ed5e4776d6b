"""Weight precision of the network: the linears as loaded (`bf16`, the model's dtype), or `fp8`: e4m3
weights with per-output-channel scales and activations scaled per token (`kernels.fp8`).

`quantize_model_fp8` swaps the weights, once, after loading: every transformer layer's fused QKV,
output, fused gate/up and down projections (base LM, residual LM, LocEnc, LocDiT), and the
projections around them (LocDiT's input, condition, time and output projections, LocEnc's input
projection, the bridges between the LMs and the local modules). The code that runs them does not
change: the layer math calls `kernels.fp8.linear`, which dispatches on the weight it is given, and
a projection module becomes an `FP8Linear` with the same call. A layer of a few tokens (LocDiT and
LocEnc at small batches, the LMs' decode rows up to 16) runs in `kernels.persistent_layer` with the
same e4m3 weights, its activations not quantised there. The AudioVAE is not touched.

Kept in the model dtype: the stop head and the FSQ bottleneck, whose outputs go through an argmax
or a rounding (a small error there becomes a discrete one: a different length, a different
bin; 12 MB of the ~7.5 GB read per step), and any weight whose shape `_scaled_mm` cannot take.
"""

from __future__ import annotations

import torch
from torch import nn

from ..kernels import fp8 as fp8_kernels
from ..kernels.fp8 import FP8Weight, fp8_linear, quantize_weight
from .minicpm import MLP, Attention

PRECISIONS = ("bf16", "fp8")

# Module names (relative to VoxCPM2Model) whose linears stay in the model dtype, and why.
KEEP = {
    "stop_proj": "stop head: its logits go through an argmax",
    "stop_head": "stop head: its logits go through an argmax",
    "fsq_layer.in_proj": "FSQ bottleneck: its output is rounded to a grid",
    "fsq_layer.out_proj": "FSQ bottleneck: its output is rounded to a grid",
}


def resolve_precision(precision: str, device: torch.device, dtype: torch.dtype) -> str:
    """Check `precision` for a model on `device` computing in `dtype`; ValueError naming it if not."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision == "fp8":
        why = fp8_kernels.supported(device)
        if why is not None:
            raise ValueError(f"precision='fp8': {why}")
        if dtype != torch.bfloat16:
            raise ValueError(f"precision='fp8' computes in bfloat16 (the FP8 GEMM's output); dtype is {dtype}")
    return precision


class FP8Linear(nn.Module):
    """nn.Linear's call over an e4m3 weight. `weight` is its FP8Weight (what the layer math takes, and
    whose `dtype` is the activations'); the e4m3 data and scales are frozen Parameters (`qweight`,
    `weight_scale`), so they follow the module to a device. Quantise after any `.to(dtype)`: that
    would cast them too."""

    def __init__(self, w: FP8Weight, bias: torch.Tensor | None):
        super().__init__()
        self.out_features, self.in_features = w.data.shape
        self.compute_dtype = w.dtype
        self.qweight = _frozen(w.data)
        self.weight_scale = _frozen(w.scale)
        self.register_parameter("bias", None if bias is None else nn.Parameter(bias.detach(), requires_grad=False))

    @property
    def weight(self) -> FP8Weight:
        return FP8Weight(self.qweight, self.weight_scale, self.compute_dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fp8_linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, fp8 e4m3, "
                f"bias={self.bias is not None}")


def _frozen(t: torch.Tensor) -> nn.Parameter:
    """A Parameter, not a buffer: torch.compile keeps a Parameter's shape static even where it compiles
    with dynamic=True (the layer math), so its kernels stay specialised to each weight's size."""
    return t if isinstance(t, nn.Parameter) else nn.Parameter(t, requires_grad=False)


def _fp8_weight(w: torch.Tensor) -> FP8Weight:
    q = quantize_weight(w)
    return FP8Weight(_frozen(q.data), _frozen(q.scale), q.dtype)


def _fp8_linear_module(linear: nn.Linear) -> FP8Linear:
    return FP8Linear(_fp8_weight(linear.weight), linear.bias)


def _fused(module: nn.Module, fused_name: str, parts: tuple[str, ...]) -> None:
    """Quantise a fused group (q/k/v, gate/up): the fused weight becomes one FP8Weight, and each part's
    Linear an FP8Linear over its rows of it (views: names kept, no extra memory)."""
    fused = getattr(module, fused_name)
    if fused is None:  # not fused by `fuse_projections`: fuse here
        fused = torch.cat([getattr(module, p).weight.detach() for p in parts])
    w = _fp8_weight(fused)
    setattr(module, fused_name, w)
    start = 0
    for p in parts:
        n = getattr(module, p).out_features
        view = FP8Weight(w.data[start:start + n], w.scale[:, start:start + n], w.dtype)
        setattr(module, p, FP8Linear(view, None))
        start += n


def _eligible(*linears: nn.Linear) -> bool:
    return all(fp8_kernels.eligible(m.out_features, m.in_features) for m in linears)


def quantize_model_fp8(target) -> dict:
    """Swap the network's eligible linear weights for e4m3 ones (see the module doc), in place.

    target: a `VoxCPM2` (its network is quantised, its VAE left alone) or a `VoxCPM2Model`, after its
    weights are loaded, cast and fused (`fuse_projections`), and before anything is compiled or
    captured. -> {"quantized": [names], "kept": {name: why}}: fused groups are named by their module
    (`base_lm.layers.0.self_attn.qkv`), other linears by theirs."""
    model = getattr(target, "model", target)
    quantized, kept = [], {}
    layer_linears = set()
    for name, m in list(model.named_modules()):
        if isinstance(m, Attention):
            groups = (("qkv", ("q_proj", "k_proj", "v_proj")),)
            singles = ("o_proj",)
        elif isinstance(m, MLP):
            groups = (("gate_up", ("gate_proj", "up_proj")),)
            singles = ("down_proj",)
        else:
            continue
        for fused_name, parts in groups:
            layer_linears.update(f"{name}.{p}" for p in parts)
            if _eligible(*(getattr(m, p) for p in parts)):
                _fused(m, fused_name, parts)
                quantized.append(f"{name}.{fused_name}")
            else:
                kept[f"{name}.{fused_name}"] = "shape not divisible by 16"
        for s in singles:
            layer_linears.add(f"{name}.{s}")
            if _eligible(getattr(m, s)):
                setattr(m, s, _fp8_linear_module(getattr(m, s)))
                quantized.append(f"{name}.{s}")
            else:
                kept[f"{name}.{s}"] = "shape not divisible by 16"
    for name, m in list(model.named_modules()):
        if not isinstance(m, nn.Linear) or name in layer_linears:
            continue
        if name in KEEP:
            kept[name] = KEEP[name]
        elif not _eligible(m):
            kept[name] = "shape not divisible by 16"
        else:
            parent, _, attr = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, attr, _fp8_linear_module(m))
            quantized.append(name)
    return {"quantized": quantized, "kept": kept}
