"""MiniCPM4 transformer: the base LM, the residual LM, and the bodies of LocEnc and LocDiT.

Attention is delegated to a backend object so the same weights serve every
caller: plain full attention (LocEnc, LocDiT), a contiguous KV cache (offline
generation) and the engine's paged KV cache. A backend is called as
``backend(layer_idx, q, k, v)`` with ``q: [B, S, Hq, D]``, ``k, v: [B, S, Hkv, D]``
(RoPE already applied) and returns ``[B, S, Hq, D]``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .config import LMConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        # Variance in fp32 even for bf16 activations, as the reference does.
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x * torch.rsqrt(var + self.eps)).to(x.dtype) * self.weight


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
        emb = torch.cat((freqs, freqs), dim=-1)
        # Plain attributes, not buffers: module.to(bf16) must not round them.
        self.cos = emb.cos() * factor
        self.sin = emb.sin() * factor

    def forward(self, positions: torch.Tensor):
        if self.cos.device != positions.device:
            self.cos, self.sin = self.cos.to(positions.device), self.sin.to(positions.device)
        return self.cos[positions], self.sin[positions]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [B, S, H, D]; cos/sin: [B or 1, S, D] fp32."""
    xf = x.float()
    x1, x2 = xf.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    return (xf * cos[:, :, None] + rotated * sin[:, :, None]).to(x.dtype)


def full_attention(causal: bool):
    """Attention over the given tokens only (no cache): LocEnc/LocDiT and cache-less prefill."""

    def attend(layer_idx, q, k, v):
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal, enable_gqa=True
        )
        return out.transpose(1, 2)

    return attend


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
        self.qkv = None  # fused [q; k; v] weight, see fuse_()

    def fuse_(self):
        """One GEMM for q, k and v: the three weights become views of one tensor (no extra memory)."""
        w = torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight]).detach()
        nq, nk = self.q_proj.out_features, self.k_proj.out_features
        self.q_proj.weight.data, self.k_proj.weight.data, self.v_proj.weight.data = w[:nq], w[nq:nq + nk], w[nq + nk:]
        self.qkv = w

    def forward(self, x, rope, layer_idx, backend):
        B, S, _ = x.shape
        if self.qkv is not None:
            nq, nk = self.n_heads * self.head_dim, self.n_kv * self.head_dim
            q, k, v = F.linear(x, self.qkv).split([nq, nk, nk], dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.reshape(B, S, self.n_heads, self.head_dim)
        k = k.reshape(B, S, self.n_kv, self.head_dim)
        v = v.reshape(B, S, self.n_kv, self.head_dim)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        out = backend(layer_idx, q, k, v)
        return self.o_proj(out.reshape(B, S, self.n_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.gate_up = None  # fused [gate; up] weight, see fuse_()

    def fuse_(self):
        w = torch.cat([self.gate_proj.weight, self.up_proj.weight]).detach()
        n = self.gate_proj.out_features
        self.gate_proj.weight.data, self.up_proj.weight.data = w[:n], w[n:]
        self.gate_up = w

    def forward(self, x):
        if self.gate_up is not None:
            gate, up = F.linear(x, self.gate_up).chunk(2, dim=-1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: LMConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        # muP depth scaling of each residual branch; off (1.0) unless use_mup.
        self.branch_scale = cfg.scale_depth / math.sqrt(cfg.num_hidden_layers) if cfg.use_mup else None

    def _residual(self, x, h):
        return x + (h * self.branch_scale if self.branch_scale is not None else h)

    def forward(self, x, rope, backend):
        x = self._residual(x, self.self_attn(self.input_layernorm(x), rope, self.layer_idx, backend))
        return self._residual(x, self.mlp(self.post_attention_layernorm(x)))


class MiniCPM(nn.Module):
    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size) if cfg.vocab_size > 0 else None
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rope = None if cfg.no_rope else LongRoPE(cfg)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, backend) -> torch.Tensor:
        """x: [B, S, hidden]; positions: [B or 1, S] int64."""
        rope = self.rope(positions) if self.rope is not None else None
        for layer in self.layers:
            x = layer(x, rope, backend)
        return self.norm(x)
