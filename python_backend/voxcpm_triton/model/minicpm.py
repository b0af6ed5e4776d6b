"""MiniCPM4 transformer: the base LM, the residual LM, and the bodies of LocEnc and LocDiT.

Attention is delegated to a backend object so the same weights serve every
caller: `local_attention` over a patch's few tokens (LocEnc, LocDiT; or the fused Triton
kernel), a contiguous KV cache (offline generation) and the engine's paged KV cache
(`full_attention`, cache-less, is the LMs' for the tests that compare them). A backend is called as
``backend(layer_idx, q, k, v)`` with ``q: [B, S, Hq, D]``, ``k, v: [B, S, Hkv, D]``
(RoPE already applied) and returns ``[B, S, Hq, D]``; one whose ``packed_qkv`` is true
(the fused LocDiT/LocEnc kernel) gets the QKV projection itself and the RoPE tables instead; one
with a ``layer`` method is offered each whole layer first (`kernels.persistent_layer`).

Inside the stack, activations are a flat ``[tokens, hidden]`` matrix, and a
layer is two pure functions around the backend call (``LayerMath``): norm, QKV
and RoPE before it; output projection, residual, norm and MLP after it. On the
GPU, `MiniCPM(cfg, compile_layers=True)` uses torch.compile'd versions of those two,
shared by every layer of the same shape, while the backend (paged KV writes,
the Triton decode kernel, per-prompt prefill) stays outside the compiled code.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels.fp8 import linear
from . import split_k
from .config import LMConfig
from .lora import lora_add


def rms_norm(x, weight, eps: float):
    # Variance in fp32 even for bf16 activations, as the reference does.
    var = x.float().pow(2).mean(-1, keepdim=True)
    return (x * torch.rsqrt(var + eps)).to(x.dtype) * weight


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


class LongRoPE(nn.Module):
    """cos/sin tables over all positions, kept in fp32 whatever the weight dtype."""

    def __init__(self, cfg: LMConfig):
        super().__init__()
        rs = cfg.rope_scaling
        dim = cfg.head_dim
        n = cfg.max_position_embeddings
        scale = n / rs.original_max_position_embeddings
        factor = math.sqrt(1 + math.log(scale) / math.log(rs.original_max_position_embeddings))
        ext = rs.long_factor if n > rs.original_max_position_embeddings else rs.short_factor
        # Built on the CPU explicitly: models are constructed under the meta device.
        inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, device="cpu").float() / dim))
        t = torch.arange(n, dtype=torch.float32, device="cpu")
        freqs = torch.outer(t, 1.0 / torch.tensor(ext, dtype=torch.float32, device="cpu")) * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)  # rotate-half form: kernels.local_attention reads one half
        # Plain attributes, not buffers: module.to(bf16) must not round them.
        self.cos = emb.cos() * factor
        self.sin = emb.sin() * factor

    def to_device_(self, device):
        """Move the tables if they are elsewhere (model loading does, before anything is compiled:
        torch.compile would trace a first call that moves them, then compile the whole module again)."""
        if self.cos.device != device:
            self.cos, self.sin = self.cos.to(device), self.sin.to(device)
        return self

    def forward(self, positions: torch.Tensor):
        self.to_device_(positions.device)
        return self.cos[positions], self.sin[positions]

    def first(self, n: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """Positions 0..n-1 as [1, n, D] views of the tables: no gather (in a compiled step, none of
        the index kernels that positions would cost each call)."""
        self.to_device_(device)
        return self.cos[None, :n], self.sin[None, :n]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [N, H, D]; cos/sin: [N, D] fp32."""
    xf = x.float()
    x1, x2 = xf.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    return (xf * cos[:, None] + rotated * sin[:, None]).to(x.dtype)


def full_attention(causal: bool):
    """Attention over the given tokens only (no cache): the LMs run on a whole sequence at once, as the
    parity tests compare them with the reference."""

    def attend(layer_idx, q, k, v):
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal, enable_gqa=True
        )
        return out.transpose(1, 2)

    return attend


def local_attention(layer_idx, q, k, v):
    """Non-causal attention over a handful of tokens (LocEnc: 5, LocDiT: 11).

    The query heads that share a KV head are folded into the query length, [B, Hkv, g*S, D]
    against [B, Hkv, S, D]: the same result as grouped-query SDPA (every query sees every
    key), as a few long problems instead of many 11x11 ones: much faster at large batch, a
    little slower at tiny ones (benchmarks/attention_shapes.py). One formulation for every batch
    keeps the compiled LocDiT's graphs few (a batch-dependent branch costs a recompile; the one
    there is: layers of at most `persistent_layer.MAX_TOKENS` tokens go to `kernels.persistent_layer`).
    """
    B, S, Hq, D = q.shape
    Hkv = k.size(2)
    g = Hq // Hkv
    qf = q.reshape(B, S, Hkv, g, D).permute(0, 2, 3, 1, 4).reshape(B, Hkv, g * S, D)
    out = F.scaled_dot_product_attention(qf, k.transpose(1, 2), v.transpose(1, 2))
    return out.reshape(B, Hkv, g, S, D).permute(0, 3, 1, 2, 4).reshape(B, S, Hq, D)


def _as_non_views(fn):
    """Call `fn` with its tensor arguments detached. torch.compile guards on the base size of an
    input that is a view, and decode and prefill pass views of differently shaped bases (the
    layer input, RoPE tables, attention output): each would compile again. A detached tensor is
    the same memory but no view, so one graph serves both."""

    def call(*args):
        return fn(*(a.detach() if isinstance(a, torch.Tensor) else a for a in args))

    return call


class LayerMath:
    """The two halves of a decoder layer as functions of tensors only: `attention_inputs` and
    `attention_output_mlp`. Instances with the same shape constants behave identically, so
    one compiled pair serves every such layer (see `compiled`). A weight is a tensor or an e4m3
    `kernels.fp8.FP8Weight` (`model.precision`): `linear` runs either."""

    _compiled: dict = {}

    def __init__(self, n_heads: int, n_kv: int, head_dim: int, eps: float, branch_scale: float | None):
        self.key = (n_heads, n_kv, head_dim, eps, branch_scale)
        self.n_heads, self.n_kv, self.head_dim, self.eps, self.branch_scale = self.key

    def normed_qkv(self, x, norm_w, qkv_w, lora=None):
        """x: [N, hidden] -> the packed projection [N, (Hq + 2 * Hkv) * D], before RoPE.
        lora: the fused projection's `LoraOp` (model.lora), or None."""
        h = rms_norm(x, norm_w, self.eps)
        y = linear(h, qkv_w)
        return lora_add(y, h, lora)

    def attention_inputs(self, x, norm_w, qkv_w, cos, sin, lora=None):
        """x: [N, hidden] -> q [N, Hq, D], k, v [N, Hkv, D]."""
        nq, nk = self.n_heads * self.head_dim, self.n_kv * self.head_dim
        q, k, v = self.normed_qkv(x, norm_w, qkv_w, lora).split([nq, nk, nk], dim=-1)
        q = q.reshape(-1, self.n_heads, self.head_dim)
        k = k.reshape(-1, self.n_kv, self.head_dim)
        v = v.reshape(-1, self.n_kv, self.head_dim)
        if cos is not None:
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        return q, k, v

    def _residual(self, x, h):
        # muP depth scaling of each residual branch; None unless use_mup.
        return x + (h * self.branch_scale if self.branch_scale is not None else h)

    def attention_output_mlp(self, x, attn, o_w, norm_w, gate_up_w, down_w, lora=None):
        """x: [N, hidden] (the layer input), attn: [N, Hq * D] -> the layer output. lora: the layer's
        `LayerLora` (model.lora), or None."""
        o, gate_up, down = (None, None, None) if lora is None else (lora.o, lora.gate_up, lora.down)
        x = self._residual(x, self._narrow_linear(attn, o_w, o))
        h = rms_norm(x, norm_w, self.eps)
        gate, up = lora_add(linear(h, gate_up_w), h, gate_up).chunk(2, dim=-1)
        act = F.silu(gate) * up
        return self._residual(x, self._narrow_linear(act, down_w, down))

    @staticmethod
    def _narrow_linear(x, w, lora):
        """The output and down projections (few output columns): split along K (`split_k`) unless an
        adapter's op follows, whose kernel would stand between the partials and their sum."""
        return split_k.linear(x, w) if lora is None else lora_add(linear(x, w), x, lora)

    def compiled(self) -> "LayerMath":
        """A LayerMath whose two functions are torch.compile'd, one per distinct shape key."""
        if self.key not in LayerMath._compiled:
            # dynamic=True: the token count varies (batch buckets, prompt lengths); every other
            # size is tied to a weight (a Parameter, static to dynamo), so the kernels stay specialised.
            c = LayerMath(*self.key)
            c.attention_inputs = _as_non_views(torch.compile(c.attention_inputs, dynamic=True))
            c.attention_output_mlp = _as_non_views(torch.compile(c.attention_output_mlp, dynamic=True))
            LayerMath._compiled[self.key] = c
        return LayerMath._compiled[self.key]


class Attention(nn.Module):
    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        h = cfg.hidden_size
        self.q_proj = nn.Linear(h, self.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(h, self.n_kv * self.head_dim, bias=False)
        self.v_proj = nn.Linear(h, self.n_kv * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, h, bias=False)
        self.qkv = None  # fused [q; k; v] weight, see fuse_projections()

    def qkv_weight(self):
        if self.qkv is not None:
            return self.qkv
        return torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight])


class MLP(nn.Module):
    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.gate_up = None  # fused [gate; up] weight, see fuse_projections()

    def gate_up_weight(self):
        if self.gate_up is not None:
            return self.gate_up
        return torch.cat([self.gate_proj.weight, self.up_proj.weight])


class DecoderLayer(nn.Module):
    def __init__(self, cfg: LMConfig, layer_idx: int, compiled: bool = False):
        super().__init__()
        self.layer_idx = layer_idx
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        branch_scale = cfg.scale_depth / math.sqrt(cfg.num_hidden_layers) if cfg.use_mup else None
        self.math = LayerMath(cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.rms_norm_eps,
                              branch_scale)
        if compiled:  # one compiled pair shared by every layer of the same shape (GPU)
            self.math = self.math.compiled()

    def heads(self) -> tuple:
        return self.math.n_heads, self.math.n_kv, self.math.head_dim

    def weights(self) -> tuple:
        """What a backend that runs whole layers takes: the input norm, QKV, output, post-attention
        norm, gate/up and down weights."""
        attn, mlp = self.self_attn, self.mlp
        return (self.input_layernorm.weight, attn.qkv_weight(), attn.o_proj.weight,
                self.post_attention_layernorm.weight, mlp.gate_up_weight(), mlp.down_proj.weight)

    def forward(self, x, batch_shape, rope, backend, keep: slice | None = None, lora=None, normed=None,
                next_norm=None):
        """x: [N, hidden] with N = B * S tokens; batch_shape: (B, S); rope: (cos, sin) or None,
        [N, D] each, or [S, D] for a backend that takes the packed QKV (and applies RoPE itself).
        keep: the positions of each sequence whose output is wanted (all by default); the others
        still serve as keys and values, but skip the output projection and the MLP.
        lora: this layer's `LayerLora` (model.lora), or None: no adapter.
        normed, next_norm: where the backend runs whole layers, this layer's input norm of x as the
        previous layer made it (or None), and the next layer's input norm weight (or None) ->
        (output, the next layer's `normed` or None)."""
        attn, mlp, m = self.self_attn, self.mlp, self.math
        B, S = batch_shape
        # Without adapters the calls are exactly the plain ones (no extra argument for compiled code).
        qkv_lora = () if lora is None else (lora.qkv,)
        if lora is None and m.branch_scale is None and hasattr(backend, "layer"):  # the whole layer fused
            res = backend.layer(self.layer_idx, x, S, rope, self.heads(), *self.weights(), m.eps,
                                h_in=normed, next_norm=None if keep is not None else next_norm)
            if res is not None:
                out, nxt = res
                return (out if keep is None else out.view(B, S, -1)[:, keep].reshape(-1, out.size(-1))), nxt
        if getattr(backend, "packed_qkv", False):
            qkv = m.normed_qkv(x, self.input_layernorm.weight, attn.qkv_weight(), *qkv_lora)
            out = backend(self.layer_idx, qkv, S, rope, (m.n_heads, m.n_kv, m.head_dim))
        else:
            cos, sin = rope if rope is not None else (None, None)
            q, k, v = m.attention_inputs(x, self.input_layernorm.weight, attn.qkv_weight(), cos, sin, *qkv_lora)
            out = backend(self.layer_idx, q.view(B, S, *q.shape[1:]), k.view(B, S, *k.shape[1:]),
                          v.view(B, S, *v.shape[1:]))
        out = out.reshape(B * S, -1)
        if keep is not None:
            x = x.view(B, S, -1)[:, keep].reshape(-1, x.size(-1))
            out = out.view(B, S, -1)[:, keep].reshape(-1, out.size(-1))
        return m.attention_output_mlp(x, out, attn.o_proj.weight, self.post_attention_layernorm.weight,
                                      mlp.gate_up_weight(), mlp.down_proj.weight,
                                      *(() if lora is None else (lora,))), None


class MiniCPM(nn.Module):
    def __init__(self, cfg: LMConfig, compile_layers: bool = False):
        """compile_layers: the layer halves torch.compile'd (GPU), one small graph pair for all
        layers, not one per layer (compiled lazily, on first call)."""
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size) if cfg.vocab_size > 0 else None
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, compile_layers) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rope = None if cfg.no_rope else LongRoPE(cfg)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None, backend, keep: slice | None = None,
                lora: list | None = None) -> torch.Tensor:
        """x: [B, S, hidden]; positions: [B or 1, S] int64, or None for 0..S-1 in every sequence
        (LocEnc, LocDiT) -> [B, S, hidden], or [B, len(keep), hidden]:
        with `keep`, the last layer computes only those positions' outputs (LocDiT reads 4 of its 11,
        LocEnc 1 of 5). lora: per layer its `LayerLora` or None (`model.lora.LoraBatch.layers`)."""
        B, S, H = x.shape
        rope = None
        if self.rope is not None:
            cos, sin = self.rope(positions) if positions is not None else self.rope.first(S, x.device)
            if getattr(backend, "packed_qkv", False):  # one table row per position of a shared [1, S]
                assert cos.size(0) == 1, "a packed-QKV backend needs the same positions in every sequence"
                rope = (cos[0], sin[0])
            else:
                rope = (cos.expand(B, S, -1).reshape(B * S, -1), sin.expand(B, S, -1).reshape(B * S, -1))
        h, normed = x.reshape(B * S, H), None
        first = self.layers[0]
        if lora is None and first.math.branch_scale is None and hasattr(backend, "stack"):  # all layers, one launch
            res = backend.stack(h, S, rope, first.heads(), [layer.weights() for layer in self.layers],
                                self.norm.weight, first.math.eps)
            if res is not None:
                out = res[1]  # the final norm's output
                return (out if keep is None else out.view(B, S, -1)[:, keep]).reshape(B, -1, H)
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            args = (h, (B, S), rope, backend, keep if i == last else None)
            if lora is None:  # a fused layer may hand the next one its input norm (persistent_layer)
                h, normed = layer(*args, normed=normed,
                                  next_norm=self.layers[i + 1].input_layernorm.weight if i < last else None)
            else:
                h, _ = layer(*args) if lora[i] is None else layer(*args, lora[i])
        return self.norm(h).view(B, -1, H)


def fuse_projections(model: nn.Module) -> nn.Module:
    """q/k/v and gate/up as single GEMMs in every transformer of `model`, once its weights are loaded
    (`voxcpm2.VoxCPM2.from_pretrained` calls it right after `load_model_weights`).

    Each group's weights are concatenated into one tensor, and the Linear weights become
    (non-trainable) Parameters over views of it: the official parameter names and shapes stay
    (state_dict, strict loading, adapters), with no extra memory, and `qkv_weight()` /
    `gate_up_weight()` return the fused tensor instead of concatenating on every call."""
    for m in model.modules():
        if isinstance(m, Attention):
            projs, name = (m.q_proj, m.k_proj, m.v_proj), "qkv"
        elif isinstance(m, MLP):
            projs, name = (m.gate_proj, m.up_proj), "gate_up"
        else:
            continue
        fused = torch.cat([p.weight.detach() for p in projs])
        start = 0
        for p in projs:
            p.weight = nn.Parameter(fused[start:start + p.out_features], requires_grad=False)
            start += p.out_features
        setattr(m, name, fused)
    return model
