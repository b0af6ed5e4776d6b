"""LocEnc (patch -> embedding), LocDiT V2 (the velocity net) and the CFM Euler solver."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .config import LMConfig
from .lora import lora_linear
from .minicpm import MiniCPM, local_attention


class LocalEncoder(nn.Module):
    """Summarises each latent patch [P, D] into one vector via a CLS token."""

    def __init__(self, cfg: LMConfig, feat_dim: int, attention=local_attention, compile: bool = False):
        """attention: `minicpm.local_attention` or the fused Triton kernel (`VoxCPM2Model`'s choice);
        compile: forward torch.compile'd (GPU, lazily on first call)."""
        super().__init__()
        self.special_token = nn.Parameter(torch.randn(1, 1, 1, cfg.hidden_size))
        self.in_proj = nn.Linear(feat_dim, cfg.hidden_size)
        self.encoder = MiniCPM(cfg)
        self.attention = attention
        if compile:
            self.forward = torch.compile(self.forward, dynamic=None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [B, T, P, D] -> [B, T, hidden]"""
        B, T, P, _ = x.shape
        h = self.in_proj(x)
        h = torch.cat([self.special_token.expand(B, T, 1, -1), h], dim=2).reshape(B * T, P + 1, -1)
        out = self.encoder(h, None, self.attention, keep=slice(0, 1))
        return out[:, 0].reshape(B, T, -1)


def timestep_embedding(t: torch.Tensor, dim: int, scale: float = 1000.0) -> torch.Tensor:
    """Sinusoidal embedding in t's dtype (the reference computes it in the model dtype)."""
    half = dim // 2
    freq = torch.exp(torch.arange(half, dtype=t.dtype, device=t.device) * -(math.log(10000) / (half - 1)))
    arg = scale * t[:, None] * freq[None]
    return torch.cat((arg.sin(), arg.cos()), dim=-1)


class TimestepMLP(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.linear_1 = nn.Linear(dim, dim)
        self.linear_2 = nn.Linear(dim, dim)

    def forward(self, x, lora=(None, None)):
        """lora: the two linears' `LoraOp`s (model.lora), or None each."""
        return lora_linear(self.linear_2, F.silu(lora_linear(self.linear_1, x, lora[0])), lora[1])


class LocalDiT(nn.Module):
    """Velocity estimator: tokens [mu_lm, mu_res, time, cond patch (P), x (P)] -> velocity of x."""

    def __init__(self, cfg: LMConfig, feat_dim: int, attention=local_attention):
        """attention: as for `LocalEncoder`. Compiled by its solver (`CFMSolver(compile=True)`), which calls
        `condition` and `velocity`, not `forward`."""
        super().__init__()
        h = cfg.hidden_size
        self.hidden = h
        self.in_proj = nn.Linear(feat_dim, h)
        self.cond_proj = nn.Linear(feat_dim, h)
        self.out_proj = nn.Linear(h, feat_dim)
        self.time_mlp = TimestepMLP(h)
        self.delta_time_mlp = TimestepMLP(h)
        self.decoder = MiniCPM(cfg)
        self.attention = attention

    def forward(self, x, mu, t, cond, dt, lora=None):
        """x: [N, D, P] current sample; mu: [N, 2*h]; t, dt: [N]; cond: [N, D, P'] -> [N, D, P].
        lora: this step's `DitLora` (model.lora: N holds each request twice, the CFG halves), or None."""
        top = {} if lora is None else lora.top
        te = self.time_embedding(t, x.dtype, (top.get("time_mlp.linear_1"), top.get("time_mlp.linear_2")))
        return self.velocity(x, te, self.condition(mu, cond, dt, lora), lora)

    def time_embedding(self, t, dtype, lora=(None, None)):
        """t [N] -> the time MLP's embedding [N, h] in dtype; lora: its two linears' `LoraOp`s, or None each.
        Apart from `velocity`: a CFM loop's times are known before it starts (`CFMSolver.sample`)."""
        return self.time_mlp(timestep_embedding(t, self.hidden).to(dtype), lora)

    def condition(self, mu, cond, dt, lora=None) -> tuple:
        """The inputs that do not depend on x or t, which a CFM loop's evaluations share when dt does
        not change -> (mu as tokens [N, 2, h], the cond patch's tokens [N, P', h], the dt embedding [N, h])."""
        top = {} if lora is None else lora.top
        ch = lora_linear(self.cond_proj, cond.transpose(1, 2), top.get("cond_proj"))
        td = self.delta_time_mlp(timestep_embedding(dt, self.hidden).to(ch.dtype),
                                 (top.get("delta_time_mlp.linear_1"), top.get("delta_time_mlp.linear_2")))
        return mu.view(ch.size(0), -1, ch.size(-1)), ch, td

    def velocity(self, x, te, condition: tuple, lora=None):
        """x: [N, D, P], te: the time embedding of its t ([N, h], `time_embedding`), condition:
        `condition`'s -> [N, D, P]."""
        top = {} if lora is None else lora.top
        mu, ch, td = condition
        xh = lora_linear(self.in_proj, x.transpose(1, 2), top.get("in_proj"))
        te = te + td
        seq = torch.cat([mu, te[:, None], ch, xh], dim=1)
        keep = slice(mu.size(1) + 1 + ch.size(1), None)
        if lora is None or lora.layers is None:
            out = self.decoder(seq, None, self.attention, keep=keep)
        else:
            out = self.decoder(seq, None, self.attention, keep=keep, lora=lora.layers)
        return lora_linear(self.out_proj, out, top.get("out_proj")).transpose(1, 2)


def euler_schedule(n_steps: int, sway_coef: float = 1.0, dtype=torch.float32, device=None):
    """Time grid 1 -> 0 with sway sampling, plus the (t, dt) pairs the solver visits.

    Mirrors the reference's arithmetic (t is advanced by subtracting dt, in
    `dtype`) so the visited times match it bit for bit.
    """
    span = torch.linspace(1, 0, n_steps + 1, device=device, dtype=dtype)
    span = span + sway_coef * (torch.cos(torch.pi / 2 * span) - 1 + span)
    ts, dts = [], []
    t, dt = span[0], span[0] - span[1]
    for step in range(1, n_steps + 1):
        ts.append(t)
        dts.append(dt)
        t = t - dt
        if step < n_steps:
            dt = t - span[step + 1]
    return torch.stack(ts), torch.stack(dts)


def zero_velocity_steps(n_steps: int) -> int:
    """CFG-zero-star: the first steps use zero velocity (the reference's `max(1, int(len(t_span) * 0.04))`)."""
    return max(1, int((n_steps + 1) * 0.04))


class CFMSolver(nn.Module):
    """Conditional flow matching sampler around LocDiT (reference: UnifiedCFM, inference only)."""

    def __init__(self, estimator: LocalDiT, mean_mode: bool = False, compile: bool = False):
        """compile: torch.compile each Euler step whole, and the conditioning its loop shares (GPU,
        lazily on first call): the CFG batch's concatenations, the estimator, the guidance and the
        update in one graph, where eagerly the glue around the estimator is some twenty small
        kernels per evaluation."""
        super().__init__()
        self.estimator = estimator
        self.mean_mode = mean_mode
        if compile:
            self.condition = torch.compile(self.condition, dynamic=None)
            self.time_embeddings = torch.compile(self.time_embeddings, dynamic=None)
            self.euler_step = torch.compile(self.euler_step, dynamic=None)

    def condition(self, mu, cond, dt, lora=None) -> tuple:
        """The estimator's `condition` for the CFG batch (conditional, then mu = 0): mu [B, 2h],
        cond [B, D, P'], dt [B], the step's (it enters only in mean mode: zeros otherwise)."""
        dt_in = torch.cat([dt, dt]) if self.mean_mode else dt.new_zeros(2 * dt.size(0))
        return self.estimator.condition(torch.cat([mu, torch.zeros_like(mu)]), torch.cat([cond, cond]), dt_in, lora)

    def time_embeddings(self, t, dtype, lora=None):
        """The time MLP over a whole loop's times at once, for the CFG batch: t [B, S] (row, evaluation)
        -> [S, 2B, h] in dtype. A loop's times are known before it starts, so one product serves all its
        steps. lora: the rows' `DitLora`, or None (its time-MLP ops cover B rows in `halves` blocks: 2S)."""
        B, S = t.shape
        top = {} if lora is None else lora.top
        ops = tuple(op._replace(halves=2 * S) if op is not None else None
                    for op in (top.get("time_mlp.linear_1"), top.get("time_mlp.linear_2")))
        rows = torch.cat([t, t]).t().reshape(2 * S * B)  # step by step, each step's cond rows, then uncond
        return self.estimator.time_embedding(rows, dtype, ops).view(S, 2 * B, -1)

    def guided_velocity(self, x, te, condition: tuple, cfg_value, lora=None):
        """One CFG evaluation as a 2B batch, with CFG-zero-star scaling.

        x: [B, D, P]; te: the CFG batch's time embedding ([2B, h], `time_embeddings`); condition:
        `condition`'s; cfg_value: [B] or float; lora: the rows' `DitLora` (model.lora), or None.
        """
        B = x.size(0)
        v = self.estimator.velocity(torch.cat([x, x]), te, condition, lora)
        v_cond, v_uncond = v[:B], v[B:]
        pos, neg = v_cond.reshape(B, -1), v_uncond.reshape(B, -1)
        st = (pos * neg).sum(1, keepdim=True) / ((neg ** 2).sum(1, keepdim=True) + 1e-8)
        st = st.view(B, 1, 1)
        if not torch.is_tensor(cfg_value):
            cfg_value = torch.full((B,), float(cfg_value), dtype=torch.float32, device=x.device)
        # The guidance scale multiplies in fp32, as the reference's Python float does (a bf16 copy
        # would turn 1.8 into 1.796875); the product is rounded back to the activation dtype.
        cfg_value = cfg_value.float().view(B, 1, 1)
        diff = v_cond - v_uncond * st
        return v_uncond * st + (cfg_value * diff.float()).to(x.dtype)

    def euler_step(self, x, te, dt, active, condition: tuple, cfg_value, lora=None):
        """x [B, D, P] one Euler step on: x - dt * v where the row is `active`, else x as it was
        (te: the CFG batch's time embedding of the step's t, [2B, h])."""
        v = self.guided_velocity(x, te, condition, cfg_value, lora)
        return torch.where(active.view(-1, 1, 1), x - dt.view(-1, 1, 1) * v, x)

    def sample(self, z, mu, cond, schedule: "CfmSchedule", cfg_value, lora=None):
        """z: [B, D, P] start noise -> sample [B, D, P]. lora: the rows' `DitLora`, or None.

        Rows may use different step counts: a row's padded steps have dt = 0 and
        are masked out, so its result equals a solo run with its own count.
        """
        if not torch.is_tensor(cfg_value):  # a tensor: a compiled step would specialise on a float
            cfg_value = torch.full((z.size(0),), float(cfg_value), dtype=torch.float32, device=z.device)
        # Detached: no views, whose bases compiled code would guard on (see minicpm._as_non_views).
        x, mu, cond, cfg_value = (a.detach() for a in (z, mu, cond, cfg_value))
        per_row = [mu, cond, cfg_value]
        if lora is not None:
            per_row += [a for op in (*lora.top.values(), *(o for layer in lora.layers or () if layer for o in layer if o))
                        for a in ((op.a, op.b) if op.rows is None else (op.rows,))]
        # Compiled: one graph for the batch buckets past the persistent layer kernel's token bound (under it,
        # `runs` pads the count: a graph per count; dynamo also specialises a batch of 1). The step's columns
        # of the tables and its row of the time embeddings start at an offset: dynamo may compile a loop's
        # first step apart from the rest. All of it happens in the warm-up before each CUDA-graph capture;
        # serving replays the graphs. The time MLP runs once for the whole loop (its times are known now).
        for a in per_row:
            torch._dynamo.maybe_mark_dynamic(a, 0)
        first, shared = schedule.first_velocity_step, None
        if first >= schedule.n_steps:
            return x
        times = schedule.t[:, first:schedule.n_steps].detach()
        torch._dynamo.maybe_mark_dynamic(times, 0)
        te_all = self.time_embeddings(times, x.dtype, lora).detach()
        for i in range(first, schedule.n_steps):
            te, dt, active = (a.detach() for a in (te_all[i - first], schedule.dt[:, i], schedule.active[:, i]))
            for a in (x, te, dt, active):
                torch._dynamo.maybe_mark_dynamic(a, 0)
            if shared is None or self.mean_mode:  # dt enters the conditioning only in mean mode
                shared = tuple(a.detach() for a in self.condition(mu, cond, dt, lora))
                for a in shared:
                    torch._dynamo.maybe_mark_dynamic(a, 0)
            x = self.euler_step(x, te, dt, active, shared, cfg_value, lora)
        return x


class CfmSchedule:
    """Per-row Euler time tables [B, N] for a batch whose rows may differ in step count."""

    def __init__(self, steps_per_row: list[int], dtype, device):
        n = max(steps_per_row)
        rows = [row_tables(k, n, dtype) for k in steps_per_row]
        self.t, self.dt, self.active = (torch.stack(x).to(device) for x in zip(*rows))
        # Steps before this one are zero-velocity for every row: nothing to evaluate.
        self.first_velocity_step = min(zero_velocity_steps(k) for k in steps_per_row)
        self.n_steps = n

    @classmethod
    def from_tables(cls, t, dt, active, first_velocity_step: int, n_steps: int) -> "CfmSchedule":
        """Over existing [B, >= n_steps] tables (the CUDA graph's static buffers)."""
        s = cls.__new__(cls)
        s.t, s.dt, s.active = t, dt, active
        s.first_velocity_step, s.n_steps = first_velocity_step, n_steps
        return s


def row_tables(k: int, width: int, dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One row's (t, dt, active) for k Euler steps, padded to `width` with inactive dt = 0 steps."""
    t, dt = torch.zeros(width, dtype=dtype), torch.zeros(width, dtype=dtype)
    active = torch.zeros(width, dtype=torch.bool)
    ts, dts = euler_schedule(k, dtype=dtype)
    t[:k], dt[:k] = ts, dts
    active[zero_velocity_steps(k):k] = True
    return t, dt, active
