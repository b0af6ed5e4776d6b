"""EXPERIMENT, not used by the server: a decoder layer's MLP for a few tokens as one Triton kernel,
gate/up, SiLU, down and the residual. Measured on an H100 (benchmarks/results.md, "Fourteenth
session"), its best checked launch per shape against the compiled PyTorch path: 1.14x at one token
of LocDiT's shapes and 1.09x of the LM's, slower from 22 tokens (LocDiT) and 8 (LM) on, where the
fp32 atomics below cost 0.3-0.7 us per token. In a batch-1 decode step that would gain about 2%.
Kept with its sweep (benchmarks/kernel_small_mlp.py) and its tests so that the result can be
re-measured.

    x     [M, K]        the post-attention RMSNorm's output (M tokens, M <= MAX_M)
    res   [M, H]        the residual stream it came from
    w_gu  [2I, K]       the fused [gate; up] weight, as `minicpm.fuse_projections` stores it
    w_d   [H, I]        the down projection's weight
    ->    [M, H]        res + (silu(x w_g^T) * (x w_u^T)) w_d^T

Same roundings as the compiled PyTorch path (`LayerMath.attention_output_mlp`): gate and up rounded
to the activation dtype, SiLU and the product in fp32 rounded once, the down projection accumulated
in fp32 and rounded, the residual added in fp32 and rounded.

The idea: at a few tokens every GEMM of a step is bound by its kernel's start and tail, not by
bandwidth. Each program takes a BLOCK_I-wide slice of the intermediate features: it streams its rows
of gate and up over K, applies SiLU, multiplies the slice by the matching columns of the down weight
and adds the [M, H] partial product into an fp32 accumulator (fp32 atomics, so the sum's order
varies from run to run, within fp32 rounding). The last program to arrive adds the residual, writes
the output and zeroes the accumulator: four kernels (two GEMMs, the SiLU product, the residual add)
become one, and the intermediate activations never leave the chip.

The accumulator and arrival counter are per device and zero at rest, so calls on one device must
not run concurrently: not from two streams, nor from CUDA graphs replayed on two streams.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from voxcpm_triton.kernels._triton import HAVE_TRITON, interpreted, tl, triton
from voxcpm_triton.kernels._triton import next_pow2 as _next_pow2

MAX_M = 64  # tokens per call: all of them sit in one program's tile


if HAVE_TRITON:

    @triton.jit
    def _small_mlp_kernel(x_ptr, res_ptr, wgu_ptr, wd_ptr, acc_ptr, count_ptr, out_ptr, M,
                          K: tl.constexpr, I: tl.constexpr, H: tl.constexpr, BLOCK_M: tl.constexpr,
                          BLOCK_I: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_H: tl.constexpr,
                          UPCAST: tl.constexpr):
        dtype = x_ptr.dtype.element_ty
        rm = tl.arange(0, BLOCK_M)
        m_ok = rm < M
        ri = tl.program_id(0) * BLOCK_I + tl.arange(0, BLOCK_I)
        prec: tl.constexpr = "ieee" if UPCAST else "tf32"
        gate = tl.zeros((BLOCK_M, BLOCK_I), dtype=tl.float32)
        up = tl.zeros((BLOCK_M, BLOCK_I), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            rk = k0 + tl.arange(0, BLOCK_K)
            xt = tl.load(x_ptr + rm[:, None] * K + rk[None, :], mask=m_ok[:, None], other=0.0)
            wg = tl.load(wgu_ptr + ri[:, None] * K + rk[None, :])
            wu = tl.load(wgu_ptr + (ri + I)[:, None] * K + rk[None, :])
            if UPCAST:  # the CPU interpreter has no bf16 dot
                xt, wg, wu = xt.to(tl.float32), wg.to(tl.float32), wu.to(tl.float32)
            gate += tl.dot(xt, tl.trans(wg), input_precision=prec)
            up += tl.dot(xt, tl.trans(wu), input_precision=prec)
        gate = gate.to(dtype).to(tl.float32)
        up = up.to(dtype).to(tl.float32)
        act = (gate * tl.sigmoid(gate) * up).to(dtype)
        if UPCAST:
            act = act.to(tl.float32)
        for h0 in range(0, H, BLOCK_H):
            rh = h0 + tl.arange(0, BLOCK_H)
            wd = tl.load(wd_ptr + rh[:, None] * I + ri[None, :])
            if UPCAST:
                wd = wd.to(tl.float32)
            part = tl.dot(act, tl.trans(wd), input_precision=prec)
            tl.atomic_add(acc_ptr + rm[:, None] * H + rh[None, :], part, mask=m_ok[:, None], sem="relaxed")
        if not UPCAST:
            # Each thread's additions are done at the GPU's coherence point (a fence per thread, as
            # __threadfence()) before the barrier, so the count below is raised after all of them: a
            # barrier alone orders the issue of these fire-and-forget atomics, not their completion.
            tl.inline_asm_elementwise("fence.acq_rel.gpu; mov.u32 $0, $1;", "=r,r", [rm], dtype=tl.int32,
                                      is_pure=False, pack=1)
        tl.debug_barrier()
        arrived = tl.atomic_add(count_ptr, 1, sem="acq_rel", scope="gpu")
        if arrived == tl.num_programs(0) - 1:  # the last program: residual, output, reset
            for h0 in range(0, H, BLOCK_H):
                rh = h0 + tl.arange(0, BLOCK_H)
                offs = rm[:, None] * H + rh[None, :]
                s = tl.load(acc_ptr + offs, mask=m_ok[:, None], other=0.0, cache_modifier=".cg")
                r = tl.load(res_ptr + offs, mask=m_ok[:, None], other=0.0)
                y = r.to(tl.float32) + s.to(dtype).to(tl.float32)
                tl.store(out_ptr + offs, y.to(dtype), mask=m_ok[:, None])
            # Zero only once every thread has read: the zeros' layout need not match the loads', so a
            # thread may own elements another one reads (zeroing them in the same loop lost sums).
            tl.debug_barrier()
            for h0 in range(0, H, BLOCK_H):
                rh = h0 + tl.arange(0, BLOCK_H)
                tl.store(acc_ptr + rm[:, None] * H + rh[None, :], tl.zeros((BLOCK_M, BLOCK_H), dtype=tl.float32),
                         mask=m_ok[:, None])
            tl.atomic_xchg(count_ptr, 0)

    _INTERPRETED = interpreted(_small_mlp_kernel)
else:
    _INTERPRETED = False


class Config(NamedTuple):
    block_i: int
    block_k: int
    block_h: int
    num_warps: int = 4
    num_stages: int = 3


DEFAULT = Config(64, 128, 256, 8, 3)  # the sweep's best checked launch for the LM at 1-8 tokens


def supports(M: int, K: int, I: int, H: int, cfg: Config = DEFAULT) -> bool:
    """Whether the kernel takes these sizes with launch `cfg` (the tiles must divide the weights)."""
    return (1 <= M <= MAX_M and K % cfg.block_k == 0 and I % cfg.block_i == 0 and H % cfg.block_h == 0
            and 2 * I * K < 2 ** 31)


_WORKSPACE: dict = {}


def _workspace(device: torch.device, H: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(accumulator [MAX_M * H] fp32, counter [1] int32), zero at rest: each call's last program
    resets them."""
    if device.type == "cuda" and device.index is None:  # "cuda" and "cuda:0" are one workspace
        device = torch.device("cuda", torch.cuda.current_device())
    key = (device, H)
    if key not in _WORKSPACE:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            # zeros made during a capture are filled only when the graph replays
            raise RuntimeError("small_mlp: call it once on this device before capturing a CUDA graph")
        _WORKSPACE[key] = (torch.zeros(MAX_M * H, dtype=torch.float32, device=device),
                           torch.zeros(1, dtype=torch.int32, device=device))
    return _WORKSPACE[key]


def launch(x: torch.Tensor, res: torch.Tensor, w_gu: torch.Tensor, w_d: torch.Tensor,
           cfg: Config = DEFAULT) -> torch.Tensor:
    if not HAVE_TRITON:
        raise RuntimeError("triton is not installed")
    M, K = x.shape
    H, I = w_d.shape
    if w_gu.shape != (2 * I, K) or res.shape != (M, H) or not supports(M, K, I, H, cfg):
        raise ValueError(f"small_mlp: unsupported shapes x {tuple(x.shape)}, res {tuple(res.shape)}, "
                         f"gate_up {tuple(w_gu.shape)}, down {tuple(w_d.shape)} with {cfg}")
    x, res, w_gu, w_d = x.contiguous(), res.contiguous(), w_gu.contiguous(), w_d.contiguous()
    out = torch.empty((M, H), dtype=x.dtype, device=x.device)
    acc, count = _workspace(x.device, H)
    _small_mlp_kernel[(I // cfg.block_i,)](
        x, res, w_gu, w_d, acc, count, out, M, K=K, I=I, H=H, BLOCK_M=max(16, _next_pow2(M)),
        BLOCK_I=cfg.block_i, BLOCK_K=cfg.block_k, BLOCK_H=cfg.block_h, UPCAST=_INTERPRETED,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out


def reference(x, res, w_gu, w_d):
    """The same arithmetic in PyTorch (the compiled layer's rounding points)."""
    gate, up = torch.nn.functional.linear(x, w_gu).chunk(2, dim=-1)
    act = (torch.nn.functional.silu(gate.float()) * up.float()).to(x.dtype)
    return (res.float() + torch.nn.functional.linear(act, w_d).float()).to(x.dtype)
