"""Multi-adapter LoRA as one Triton kernel: a projection's output plus each row's own adapter delta.

    y      [M, N]        the base projection's output (M tokens)
    x      [M, K]        its input
    a      [S, n*R, K]   the site's A slot table (`model.lora.LoraTables`: n fused targets, rank R)
    b      [S, N, R]     its B table (alpha / r folded in)
    slots  [G]           each row's slot (0: the base model, nothing added)
    -> y + (x A[slot]^T) B[slot]^T, row by row: fp32 accumulation, the shrink rounded to the
       tables' dtype before the expand (as the reference's LoRALinear in bf16), the sum once

Tokens come as `halves` blocks of G rows of T tokens each (`model.lora.LoraOp`): token (h, g, t) is
at index (h * G + g) * T + t and belongs to row g. One program per (chunk of output columns, token
tile, row); a chunk lies inside one target (a fused q/k/v or gate/up site has n targets side by
side). The program computes its tokens' shrink x A^T for that target once, then walks its chunk:
the expand against each tile of B, added to y. So one launch per site, nothing materialised between
shrink and expand, and a row on slot 0 only copies y. Each chunk of a row reads the row's A again:
chunks are as long as the GPU's width allows (`chunk`).

The torch formulations in `model.lora` cost 2-4 kernels per site, and at batch 1 the step is bound
by kernel count (LocDiT runs its sites nine times a step). Registered as the custom op
`voxcpm::lora_add`, so torch.compile keeps it as one opaque call, and CUDA graphs capture it (the
grid and blocks depend on shapes only).
"""

from __future__ import annotations

import torch

from ._triton import HAVE_TRITON as _HAVE_TRITON
from ._triton import available, interpreted, sm_count, tl, triton  # noqa: F401 - available: callers ask it here
from ._triton import next_pow2 as _next_pow2

if _HAVE_TRITON:

    @triton.jit
    def _lora_add_kernel(y_ptr, x_ptr, a_ptr, b_ptr, slot_ptr, out_ptr,
                         G, T, K, N, A_SLOT, B_SLOT, BOUND1, BOUND2, C0, C1, CHUNK,
                         HALVES: tl.constexpr, R: tl.constexpr, R_PAD: tl.constexpr,
                         BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         UPCAST: tl.constexpr, PRECISION: tl.constexpr):
        pid_c, pid_t, g = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        # this program's chunk of output columns, inside one target: targets 0 and 1 have C0 and C1
        # chunks of CHUNK columns, target 2 the rest
        target = (pid_c >= C0).to(tl.int64) + (pid_c >= C0 + C1).to(tl.int64)
        first = tl.where(target == 0, 0, tl.where(target == 1, C0, C0 + C1))
        lo = tl.where(target == 0, 0, tl.where(target == 1, BOUND1, BOUND2))
        hi = tl.where(target == 0, BOUND1, tl.where(target == 1, BOUND2, N))
        start = lo + (pid_c - first) * CHUNK
        end = tl.minimum(start + CHUNK, hi)

        k_in_row = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
        t_mask = k_in_row < HALVES * T
        tok = ((k_in_row // T) * G + g) * T + k_in_row % T
        slot = tl.load(slot_ptr + g).to(tl.int64)
        if slot != 0:
            r_off = tl.arange(0, R_PAD)
            r_mask = r_off < R
            a_rows = a_ptr + slot * A_SLOT + (target * R + r_off)[:, None] * K
            u = tl.zeros((BLOCK_T, R_PAD), dtype=tl.float32)
            for k0 in range(0, K, BLOCK_K):
                kk = k0 + tl.arange(0, BLOCK_K)
                k_mask = kk < K
                xa = tl.load(x_ptr + tok[:, None] * K + kk[None, :], mask=t_mask[:, None] & k_mask[None, :], other=0.0)
                aa = tl.load(a_rows + kk[None, :], mask=r_mask[:, None] & k_mask[None, :], other=0.0)
                if UPCAST:
                    xa, aa = xa.to(tl.float32), aa.to(tl.float32)
                u += tl.dot(xa, tl.trans(aa), input_precision=PRECISION)
            for n0 in range(start, end, BLOCK_N):
                n_off = n0 + tl.arange(0, BLOCK_N)
                n_mask = n_off < end
                y_mask = t_mask[:, None] & n_mask[None, :]
                y = tl.load(y_ptr + tok[:, None] * N + n_off[None, :], mask=y_mask, other=0.0).to(tl.float32)
                bb = tl.load(b_ptr + slot * B_SLOT + n_off[:, None] * R + r_off[None, :],
                             mask=n_mask[:, None] & r_mask[None, :], other=0.0)
                if UPCAST:
                    bb = bb.to(tl.float32)
                y += tl.dot(u.to(bb.dtype), tl.trans(bb), input_precision=PRECISION)
                tl.store(out_ptr + tok[:, None] * N + n_off[None, :], y.to(out_ptr.dtype.element_ty), mask=y_mask)
        else:  # the base model: y as it is
            for n0 in range(start, end, BLOCK_N):
                n_off = n0 + tl.arange(0, BLOCK_N)
                y_mask = t_mask[:, None] & (n_off < end)[None, :]
                y = tl.load(y_ptr + tok[:, None] * N + n_off[None, :], mask=y_mask, other=0.0)
                tl.store(out_ptr + tok[:, None] * N + n_off[None, :], y, mask=y_mask)

    _INTERPRETED = interpreted(_lora_add_kernel)
else:
    _INTERPRETED = False

BLOCK_N = 128
MAX_CHUNK = 512


def chunk(programs_per_chunk: int, widths: tuple, sms: int = 132) -> int:
    """Output columns per program: longer chunks re-read A less, shorter ones spread the work
    over more SMs. One tile each for small batches; up to MAX_CHUNK while half the SMs still get a
    program (benchmarks/kernel_lora.py). programs_per_chunk: rows x token tiles."""
    c = BLOCK_N
    while c < MAX_CHUNK and 2 * programs_per_chunk * sum(-(-w // (2 * c)) for w in widths) >= sms:
        c *= 2
    return c


MAX_RANK = 64  # the rank dimension sits whole in each tile (shared memory); larger: the torch paths


def supports(splits: tuple, rank: int) -> bool:
    """Whether a site fits the kernel: at most 3 fused targets, rank up to MAX_RANK."""
    return 1 <= len(splits) <= 3 and 1 <= rank <= MAX_RANK


def _num_sms(device: torch.device) -> int:
    return sm_count(device) if device.type == "cuda" else 132


def _launch(y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, slots: torch.Tensor,
            splits: list, halves: int, bn: int | None = None, cols: int | None = None,
            block_k: int | None = None, num_warps: int = 4) -> torch.Tensor:
    """The launch; bn, cols, block_k, num_warps: overrides for benchmarks/kernel_lora.py."""
    if not _HAVE_TRITON:
        raise RuntimeError("triton is not installed")
    M, N = y.shape
    K = x.size(1)
    G = slots.size(0)
    S, nR, Ka = a.shape
    R = b.size(-1)
    assert x.size(0) == M and Ka == K and b.shape == (S, N, R) and nR == len(splits) * R and sum(splits) == N, \
        (y.shape, x.shape, a.shape, b.shape, splits)
    assert M % (halves * G) == 0, (M, halves, G)
    y, x, a, b = y.contiguous(), x.contiguous(), a.contiguous(), b.contiguous()
    out = torch.empty_like(y)
    if M == 0:
        return out
    T = M // (halves * G)
    row_tokens = halves * T
    block_t = max(16, min(64, _next_pow2(row_tokens)))
    t_tiles = -(-row_tokens // block_t)
    widths = tuple(splits)
    cols = cols or chunk(G * t_tiles, widths, _num_sms(y.device))
    counts = [-(-w // cols) for w in widths] + [0, 0]
    bounds = [sum(widths[:i + 1]) for i in range(len(widths))] + [N, N]
    upcast = _INTERPRETED and y.dtype != torch.float32
    precision = "ieee" if y.dtype == torch.float32 or upcast else "tf32"
    r_pad = max(16, _next_pow2(R))
    if block_k is None:  # long K tiles where K is long and the rank small (shared memory per stage)
        block_k = 256 if K >= 2048 and r_pad <= 32 else 128 if K >= 128 else max(16, _next_pow2(K))
    _lora_add_kernel[(sum(counts), t_tiles, G)](
        y, x, a, b, slots, out, G, T, K, N, nR * K, N * R, bounds[0], bounds[1], counts[0], counts[1], cols,
        HALVES=halves, R=R, R_PAD=r_pad, BLOCK_T=block_t, BLOCK_N=bn or BLOCK_N, BLOCK_K=block_k,
        UPCAST=upcast, PRECISION=precision, num_warps=num_warps,
    )
    return out


@torch.library.custom_op("voxcpm::lora_add", mutates_args=())
def lora_add_op(y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, slots: torch.Tensor,
                splits: list[int], halves: int) -> torch.Tensor:
    return _launch(y, x, a, b, slots, splits, halves)


@lora_add_op.register_fake
def _(y, x, a, b, slots, splits, halves):
    return torch.empty_like(y)


def lora_add(y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, slots: torch.Tensor,
             splits: tuple, halves: int = 1) -> torch.Tensor:
    """y [..., N] + each row's LoRA delta of x [..., K] (see the module docstring) -> y's shape."""
    out = lora_add_op(y.reshape(-1, y.size(-1)), x.reshape(-1, x.size(-1)), a, b, slots, list(splits), halves)
    return out.view(y.shape)
