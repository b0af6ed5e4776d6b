"""Triton kernels (GPU) for the VAE decoder's depthwise residual units, its upsampling and its last conv.

A depthwise residual unit is snake -> causal depthwise conv (kernel 7, dilation d) -> snake ->
pointwise conv, plus the skip. For fp32 depthwise convs PyTorch runs its generic CUDA kernel
(cuDNN is not used), a large share of a streaming decode's GPU time, and each snake is another
pass over the activations. Each kernel below is one pass:

`snake_extend`: a snake written behind the look-back frames of the conv that follows it (the first
snake of a residual unit that does not run from its raw input, below; the snakes before each
upsampling conv and before the last conv), with the frames to save for the next chunk cut from the
same pass (instead of snake, torch.cat and a copy):

    prev [B, C, L], x [B, C, T]  ->  xp [B, C, L + T] = [prev | snake(x)],  tail = xp[..., -L:]

Before an upsampling conv it also applies the decoder's sample-rate condition, a per-channel
x * scale + shift (two passes over the activations in PyTorch).

`dwconv_snake`: the causal depthwise conv, its bias and the snake after it:

    xp   [B, C, L + T]  the conv's input with its look-back frames in front (L = 6 * d): zeros
                        for a one-shot decode, the stream's saved frames when streaming
    ->   y [B, C, T]    snake(conv(xp) + bias), snake(v) = v + sin(a v)^2 / (a + 1e-9)

Both take the GPU's approximate sin (`_snake`).

`skip_add`: the pointwise conv's bias and the skip, x + (z + bias), where z is the pointwise conv
run without its bias: cuDNN adds a conv's bias in a broadcast pass of its own.

`unit_tail`: the rest of a residual unit after its first snake in one pass, where dwconv_snake,
the pointwise conv (cuDNN) and skip_add are three, each writing a tensor the next one reads:

    xp [B, C, L + T] (as dwconv_snake), x [B, C, T] the unit's input
    ->  out = x + pointwise(snake(conv(xp) + bias)) + pointwise bias

A program takes BLOCK_T frames and BLOCK_CO output channels; it makes the depthwise conv and its
snake BLOCK_CI channels at a time and multiplies them straight into its accumulator (tensor cores;
for fp32 activations products of their bf16 parts, UNIT_DOT_PRECISION). With more than BLOCK_CO channels
each output block makes the depthwise conv again, which makes the widest units slower than the three
kernels: they keep them (UNIT_MAX_CHANNELS, benchmarks/kernel_vae_blocks.py --unit).

`residual_unit`: a whole unit from its raw input x and the stream's raw saved frames of it. The two
depthwise kernels above in their PRE_SNAKE form apply the unit's first snake to each tap as they load
it, so no pass writes the snaked look-back input, and write the next chunk's saved frames themselves.
Which units run so is policy (`unit_snake_on_load`, measured per width).

`unit_cl`: `unit_tail` for channels-last activations ([B, C, T] laid out [B, T, C] in memory), the
narrow units' form (UNIT_CL_CHANNELS): each tap loads whole frames of C adjacent channels, aligned, and
the pointwise conv is a product of the [frames, C] tile by the [C, C] weight. Its input comes from the
upsampling before the units (`phase_interleave` with channels_last) and its look-back pass
(`snake_extend`, reading any strides, writing channels-last). The first snake is that pass's, once per
frame: applied at each tap instead, the kernel ran slower (benchmarks/results.md, thirty-fourth session).

`phase_interleave`, for the upsampling ConvTranspose1d (kernel 2s, stride s) in its polyphase form:
a 2-tap conv with s * C_out output channels, whose row c * s + j holds phase j of channel c. cuDNN
runs the widest transposed conv (2048 -> 1024 channels) on a generic fp32 engine; as a conv it is
an implicit GEMM (benchmarks/kernel_vae_polyphase.py compares the two at every level). The kernel
puts phase j of frame t at sample t * s + j and adds the bias, one pass:

    y [B, C * s, T]  ->  out [B, C, T * s],  out[b, c, t * s + j] = y[b, c * s + j, t] + bias[c]

`conv_tanh`: the decoder's last conv (to one channel) and its tanh, one pass.

The activations are fp32, or bf16 / fp16 for a decoder cast to that precision
(`AudioVAE.set_decode_precision`); every kernel computes in fp32 and stores in the activations' dtype. The taps are
summed in another order than PyTorch's kernel, so results agree to rounding. Grid and allocations
depend on shapes only: CUDA graphs capture it.
"""

from __future__ import annotations

import torch

from ._triton import HAVE_TRITON as _HAVE_TRITON
from ._triton import available, interpreted, tl, triton  # noqa: F401 - available: callers ask it here

BLOCK_C, BLOCK_T, NUM_WARPS = 8, 256, 4
UNIT_BLOCK_CO = 128
# unit_tail's (BLOCK_CI, BLOCK_T, num_warps) by the unit's channels, up to the key (the fastest single
# launch of a sweep at 64 streams x 4 patches, benchmarks/kernel_vae_blocks.py --unit)
UNIT_LAUNCHES = {32: (32, 64, 4), 64: (16, 32, 4), 128: (16, 64, 8)}
UNIT_MAX_CHANNELS = 128  # wider residual units run dwconv_snake, cuDNN's pointwise conv and skip_add
# Residual units of at least ROW_ALIGN_FROM channels that run after a look-back pass in rows (not from their
# raw input, below; not channels-last, UNIT_CL_CHANNELS) get that pass's output (the depthwise kernels'
# input) in rows of a multiple of ROW_ALIGN elements (`snake_extend`'s row_align): triton specializes on
# strides divisible by 16 and can then vectorize the accesses at aligned offsets.
# unit_tail at 32 channels ran slower on such rows (benchmarks/kernel_vae_blocks.py --bandwidth --row-align).
ROW_ALIGN, ROW_ALIGN_FROM = 16, 64
# Residual units that run from their raw input (`residual_unit`: the first snake applied to each tap as
# it is loaded, the stream keeping raw frames) instead of after a look-back pass (`snake_extend`): those
# wider than UNIT_MAX_CHANNELS if SNAKE_ON_LOAD_WIDE, and those of up to SNAKE_ON_LOAD_UP_TO channels that
# do not run channels-last (UNIT_CL_CHANNELS goes first).
# unit_tail at 64 and 128 channels runs slower so (benchmarks/kernel_vae_blocks.py --bandwidth). Read at
# each forward: a stream's saved frames are raw or snaked as this says, so change it only between streams.
SNAKE_ON_LOAD_WIDE, SNAKE_ON_LOAD_UP_TO = True, 32
# fp32 operands' product in unit_tail and unit_cl: "bf16x3" (each operand split into two bf16 parts, three
# bf16 products: about 16 bits of mantissa, errors ~1e-4 where the decoder's TF32 convs round at 1e-3), faster
# than "tf32x3" (three TF32 products, as exact as fp32); triton's plain "tf32" is further from fp32 than
# cuDNN's TF32 convs. "ieee" on ROCm (not measured there) and in triton's CPU interpreter (`_dot_precision`).
UNIT_DOT_PRECISION = "bf16x3" if torch.version.hip is None else "ieee"
# Residual units of these widths run channels-last (`unit_cl`): their block's upsampling writes its output
# so, and the block's last unit writes contiguous rows again. Read at each forward: a stream's saved frames
# for these units are the look-back pass's (snaked), so change it only between streams.
UNIT_CL_CHANNELS = (32, 64)
UNIT_CL_LAUNCHES = {32: (128, 32, 8), 64: (64, 64, 4)}  # (BLOCK_T, BLOCK_CO, num_warps) by channels
# (BLOCK_C, BLOCK_T) of the passes that write channels-last for unit_cl: phase_interleave, and snake_extend
# from channels-last input
CL_BLOCKS = (32, 64)
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


if _HAVE_TRITON:

    @triton.jit
    def _snake(x, a, FAST_SIN: tl.constexpr):
        """snake(x) = x + sin(a x)^2 / (a + 1e-9), in fp32. The sine is the GPU's sin.approx, one
        instruction where libdevice's precise sine reduces the range and evaluates a polynomial; its
        error (~1e-6 at arguments of a few units, growing with their size) is far below the rounding
        of the TF32 convs around it."""
        if FAST_SIN:
            s = tl.inline_asm_elementwise("sin.approx.f32 $0, $1;", "=r,r", [a * x], dtype=tl.float32,
                                          is_pure=True, pack=1)
        else:  # triton's CPU interpreter runs no PTX
            s = tl.sin(a * x)
        return x + (1.0 / (a + 1e-9)) * (s * s)

    @triton.jit
    def _tap(src, f, ci_ok, t_ok, prev, t0, LB: tl.constexpr, a_pre, FAST_SIN: tl.constexpr,
             PRE_SNAKE: tl.constexpr):
        """Frames f of a depthwise conv's input for one tap, [BLOCK_C, BLOCK_T] (rows of channels ci).
        PRE_SNAKE: src and prev are the rows of the unit's input x [.., T] and of the stream's saved
        frames [.., LB] of it (raw: the snake is applied here); frame f < 0 is prev's frame LB + f.
        Else src is the rows of xp = [saved | snake(x)] and f its frame."""
        if PRE_SNAKE:
            v = tl.load(src + f[None, :], mask=ci_ok[:, None] & t_ok & (f >= 0)[None, :], other=0.0).to(tl.float32)
            if t0 < LB:  # only a chunk's first frames reach back into the saved ones
                v += tl.load(prev + (f + LB)[None, :], mask=ci_ok[:, None] & (f < 0)[None, :],
                             other=0.0).to(tl.float32)
            return _snake(v, a_pre, FAST_SIN)
        return tl.load(src + f[None, :], mask=ci_ok[:, None] & t_ok, other=0.0).to(tl.float32)

    @triton.jit
    def _keep_tail(src, prev, tail, ci_ok, T, LB: tl.constexpr, BLOCK_L: tl.constexpr):
        """tail [.., LB] = the last LB frames of [prev | x] (raw), the saved frames of the next chunk."""
        i = tl.arange(0, BLOCK_L)
        f = T - LB + i
        ok = ci_ok[:, None] & (i < LB)[None, :]
        v = tl.load(src + f[None, :], mask=ok & (f >= 0)[None, :], other=0.0)
        v += tl.load(prev + (f + LB)[None, :], mask=ok & (f < 0)[None, :], other=0.0)
        tl.store(tail + i[None, :], v, mask=ok)

    @triton.jit
    def _dwconv_snake_kernel(
        xp_ptr, w_ptr, bias_ptr, alpha_ptr, y_ptr, prev_ptr, pre_alpha_ptr, tail_ptr,
        C, T, sxb, sxc, syb, syc, spb, spc,
        K: tl.constexpr, DIL: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_T: tl.constexpr,
        FAST_SIN: tl.constexpr, PRE_SNAKE: tl.constexpr, BLOCK_L: tl.constexpr,
    ):
        LB: tl.constexpr = (K - 1) * DIL
        b = tl.program_id(0)
        c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        t0 = tl.program_id(2) * BLOCK_T
        t = t0 + tl.arange(0, BLOCK_T)
        c_ok = c < C
        t_ok = (t < T)[None, :]
        src = xp_ptr + b * sxb + c[:, None] * sxc
        prev = prev_ptr + b * spb + c[:, None] * spc
        if PRE_SNAKE:
            a_pre = tl.load(pre_alpha_ptr + c, mask=c_ok, other=1.0).to(tl.float32)[:, None]
        else:  # (unused)
            a_pre = tl.full([BLOCK_C, 1], 1.0, tl.float32)
        acc = tl.zeros([BLOCK_C, BLOCK_T], tl.float32)
        for k in tl.static_range(K):  # output t reads conv-input frames t .. t + (K-1) * DIL (x's t - LB ..)
            w = tl.load(w_ptr + c * K + k, mask=c_ok, other=0.0).to(tl.float32)
            f = t - (K - 1 - k) * DIL if PRE_SNAKE else t + k * DIL
            acc += w[:, None] * _tap(src, f, c_ok, t_ok, prev, t0, LB, a_pre, FAST_SIN, PRE_SNAKE)
        acc += tl.load(bias_ptr + c, mask=c_ok, other=0.0).to(tl.float32)[:, None]
        a = tl.load(alpha_ptr + c, mask=c_ok, other=1.0).to(tl.float32)[:, None]
        tl.store(y_ptr + b * syb + c[:, None] * syc + t[None, :], _snake(acc, a, FAST_SIN), mask=c_ok[:, None] & t_ok)
        if PRE_SNAKE:
            if tl.program_id(2) == 0:
                _keep_tail(src, prev, tail_ptr + (b * C + c[:, None]) * LB, c_ok, T, LB, BLOCK_L)

    @triton.jit
    def _unit_tail_kernel(
        xp_ptr, x_ptr, dw_ptr, dwb_ptr, alpha_ptr, pw_ptr, pwb_ptr, out_ptr, prev_ptr, pre_alpha_ptr, tail_ptr,
        C, T, spb, spc, sxb, sxc, svb, svc,
        K: tl.constexpr, DIL: tl.constexpr, BLOCK_CO: tl.constexpr, BLOCK_CI: tl.constexpr,
        BLOCK_T: tl.constexpr, FAST_SIN: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
        PRE_SNAKE: tl.constexpr, BLOCK_L: tl.constexpr,
    ):
        LB: tl.constexpr = (K - 1) * DIL
        t0 = tl.program_id(0) * BLOCK_T  # time on the grid's unbounded axis
        t = t0 + tl.arange(0, BLOCK_T)
        b = tl.program_id(1)
        co = tl.program_id(2) * BLOCK_CO + tl.arange(0, BLOCK_CO)
        t_ok = (t < T)[None, :]
        co_ok = co < C
        keeps_tail = (tl.program_id(0) == 0) & (tl.program_id(2) == 0)
        acc = tl.zeros([BLOCK_CO, BLOCK_T], tl.float32)
        for ci0 in range(0, C, BLOCK_CI):
            ci = ci0 + tl.arange(0, BLOCK_CI)
            ci_ok = ci < C
            m = ci_ok[:, None] & t_ok
            # PRE_SNAKE: the taps read x and the saved frames (xp_ptr unused); else xp
            src = (x_ptr + b * sxb + ci[:, None] * sxc) if PRE_SNAKE else (xp_ptr + b * spb + ci[:, None] * spc)
            prev = prev_ptr + b * svb + ci[:, None] * svc
            if PRE_SNAKE:
                a_pre = tl.load(pre_alpha_ptr + ci, mask=ci_ok, other=1.0).to(tl.float32)[:, None]
            else:  # (unused)
                a_pre = tl.full([BLOCK_CI, 1], 1.0, tl.float32)
            y = tl.zeros([BLOCK_CI, BLOCK_T], tl.float32)
            for k in range(K):  # a loop, not unrolled: one tap's addresses in registers at a time
                w = tl.load(dw_ptr + ci * K + k, mask=ci_ok, other=0.0).to(tl.float32)
                f = t - (K - 1 - k) * DIL if PRE_SNAKE else t + k * DIL
                y += w[:, None] * _tap(src, f, ci_ok, t_ok, prev, t0, LB, a_pre, FAST_SIN, PRE_SNAKE)
            y += tl.load(dwb_ptr + ci, mask=ci_ok, other=0.0).to(tl.float32)[:, None]
            a = tl.load(alpha_ptr + ci, mask=ci_ok, other=1.0).to(tl.float32)[:, None]
            y = tl.where(m, _snake(y, a, FAST_SIN), 0.0)  # channels past C add nothing to the product
            pw = tl.load(pw_ptr + co[:, None] * C + ci[None, :], mask=co_ok[:, None] & ci_ok[None, :], other=0.0)
            acc = tl.dot(pw.to(DOT_DTYPE), y.to(DOT_DTYPE), acc, input_precision=DOT_PRECISION)
            if PRE_SNAKE:
                if keeps_tail:
                    _keep_tail(src, prev, tail_ptr + (b * C + ci[:, None]) * LB, ci_ok, T, LB, BLOCK_L)
        acc += tl.load(pwb_ptr + co, mask=co_ok, other=0.0).to(tl.float32)[:, None]
        mask = co_ok[:, None] & t_ok
        acc += tl.load(x_ptr + b * sxb + co[:, None] * sxc + t[None, :], mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + (b * C + co[:, None]) * T + t[None, :], acc, mask=mask)

    @triton.jit
    def _unit_cl_kernel(
        xp_ptr, x_ptr, dw_ptr, dwb_ptr, alpha_ptr, pw_ptr, pwb_ptr, out_ptr,
        T, sqb, sqt, sxb, sxt, sob, soc, sot,
        C: tl.constexpr, K: tl.constexpr, DIL: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_CO: tl.constexpr,
        FAST_SIN: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    ):
        t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)  # time on the grid's unbounded axis
        b = tl.program_id(1)
        c = tl.arange(0, C)
        t_ok = (t < T)[:, None]
        y = tl.zeros([BLOCK_T, C], tl.float32)
        for k in range(K):  # output t reads xp's frames t .. t + (K-1) * DIL: whole rows of C channels
            w = tl.load(dw_ptr + c * K + k).to(tl.float32)
            y += w[None, :] * tl.load(xp_ptr + b * sqb + c[None, :] + (t + k * DIL)[:, None] * sqt, mask=t_ok,
                                      other=0.0).to(tl.float32)
        y += tl.load(dwb_ptr + c).to(tl.float32)[None, :]
        y = _snake(y, tl.load(alpha_ptr + c).to(tl.float32)[None, :], FAST_SIN).to(DOT_DTYPE)
        for co0 in tl.static_range(0, C, BLOCK_CO):  # output channels in blocks: the weight's registers
            co = co0 + tl.arange(0, BLOCK_CO)
            w_t = tl.load(pw_ptr + co[None, :] * C + c[:, None]).to(DOT_DTYPE)  # [C_in, BLOCK_CO]
            acc = tl.dot(y, w_t, input_precision=DOT_PRECISION)
            acc += tl.load(pwb_ptr + co).to(tl.float32)[None, :]
            acc += tl.load(x_ptr + b * sxb + co[None, :] + t[:, None] * sxt, mask=t_ok, other=0.0).to(tl.float32)
            tl.store(out_ptr + b * sob + co[None, :] * soc + t[:, None] * sot, acc, mask=t_ok)

    @triton.jit
    def _snake_extend_kernel(
        prev_ptr, x_ptr, alpha_ptr, full_ptr, tail_ptr, scale_ptr, shift_ptr,
        C, L, T, spb, spc, sxb, sxc, sxt, sab, sfb, sfc, sft,
        BLOCK_C: tl.constexpr, BLOCK_T: tl.constexpr, FAST_SIN: tl.constexpr, AFFINE: tl.constexpr,
    ):
        b = tl.program_id(0)
        c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        t = tl.program_id(2) * BLOCK_T + tl.arange(0, BLOCK_T)  # frame of full = [prev | snake(x)]
        n = L + T
        c_ok = (c < C)[:, None]
        from_prev = (t < L)[None, :]
        in_range = (t < n)[None, :]
        old = tl.load(prev_ptr + b * spb + c[:, None] * spc + t[None, :], mask=c_ok & from_prev,
                      other=0.0).to(tl.float32)
        x = tl.load(x_ptr + b * sxb + c[:, None] * sxc + (t - L)[None, :] * sxt, mask=c_ok & in_range & ~from_prev,
                    other=0.0).to(tl.float32)
        if AFFINE:  # the sample-rate condition before the snake, rounded after each op as PyTorch's two ops round
            sc = tl.load(scale_ptr + b * sab + c, mask=c < C, other=1.0).to(tl.float32)[:, None]
            sh = tl.load(shift_ptr + b * sab + c, mask=c < C, other=0.0).to(tl.float32)[:, None]
            x = (x * sc).to(x_ptr.dtype.element_ty).to(tl.float32)
            x = (x + sh).to(x_ptr.dtype.element_ty).to(tl.float32)
        a = tl.load(alpha_ptr + c, mask=c < C, other=1.0).to(tl.float32)[:, None]
        v = tl.where(from_prev, old, _snake(x, a, FAST_SIN))
        tl.store(full_ptr + b * sfb + c[:, None] * sfc + t[None, :] * sft, v, mask=c_ok & in_range)
        keep = t - T  # the last L frames are the stream's context for its next chunk
        tl.store(tail_ptr + (b * C + c[:, None]) * L + keep[None, :], v, mask=c_ok & in_range & (keep >= 0)[None, :])

    @triton.jit
    def _conv_tanh_kernel(xp_ptr, w_ptr, bias_ptr, out_ptr, C, T, spb, spc,
                          K: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_T: tl.constexpr):
        t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        b = tl.program_id(1)
        t_ok = (t < T)[None, :]
        acc = tl.zeros([BLOCK_C, BLOCK_T], tl.float32)
        for c0 in range(0, C, BLOCK_C):
            c = c0 + tl.arange(0, BLOCK_C)
            m = (c < C)[:, None] & t_ok
            row = xp_ptr + b * spb + c[:, None] * spc + t[None, :]
            for k in range(K):  # a loop, not unrolled: one tap's tile in registers at a time
                w = tl.load(w_ptr + c * K + k, mask=c < C, other=0.0).to(tl.float32)
                acc += w[:, None] * tl.load(row + k, mask=m, other=0.0).to(tl.float32)
        v = tl.sum(acc, axis=0) + tl.load(bias_ptr).to(tl.float32)
        e = tl.exp(-2.0 * tl.abs(v))  # tanh through exp(-2|v|) <= 1: never overflows
        y = (1.0 - e) / (1.0 + e)
        tl.store(out_ptr + b * T + t, tl.where(v < 0, -y, y), mask=t < T)

    @triton.jit
    def _skip_add_kernel(x_ptr, z_ptr, bias_ptr, out_ptr, C, T, BLOCK_C: tl.constexpr, BLOCK_T: tl.constexpr):
        b = tl.program_id(0)
        c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        t = tl.program_id(2) * BLOCK_T + tl.arange(0, BLOCK_T)
        mask = (c < C)[:, None] & (t < T)[None, :]
        at = (b * C + c[:, None]) * T + t[None, :]
        bias = tl.load(bias_ptr + c, mask=c < C, other=0.0).to(tl.float32)
        z = tl.load(z_ptr + at, mask=mask).to(tl.float32) + bias[:, None]
        tl.store(out_ptr + at, tl.load(x_ptr + at, mask=mask).to(tl.float32) + z, mask=mask)

    @triton.jit
    def _phase_interleave_kernel(y_ptr, bias_ptr, out_ptr, C, T, syb, syc, syt, sob, soc, sot, S: tl.constexpr,
                                 BLOCK_C: tl.constexpr, BLOCK_T: tl.constexpr):
        b = tl.program_id(0)
        c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        o = tl.program_id(2) * BLOCK_T + tl.arange(0, BLOCK_T)  # output sample = frame * S + phase
        n = T * S
        mask = (c < C)[:, None] & (o < n)[None, :]
        src = b * syb + (c[:, None] * S + (o % S)[None, :]) * syc + (o // S)[None, :] * syt
        bias = tl.load(bias_ptr + c, mask=c < C, other=0.0).to(tl.float32)
        v = tl.load(y_ptr + src, mask=mask).to(tl.float32) + bias[:, None]
        tl.store(out_ptr + b * sob + c[:, None] * soc + o[None, :] * sot, v, mask=mask)

    _INTERPRETED = interpreted(_dwconv_snake_kernel)  # triton's CPU interpreter (tests)
    _FAST_SIN = not _INTERPRETED and torch.version.hip is None  # PTX: NVIDIA only
    # triton's CPU interpreter (3.6) multiplies bf16 operands wrongly: there the product is fp32.
    _DOT_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}
    # what the interpreter's tl.dot takes as input_precision (its own list; None: compiled, any of triton's)
    _INTERPRETER_DOT_PRECISIONS = None
    if _INTERPRETED:
        from triton.runtime.interpreter import InterpreterOptions

        _DOT_DTYPES = dict.fromkeys(_DOT_DTYPES, tl.float32)
        _INTERPRETER_DOT_PRECISIONS = tuple(InterpreterOptions.allowed_dot_input_precisions)
else:
    _INTERPRETED = _FAST_SIN = False
    _INTERPRETER_DOT_PRECISIONS = None


def _lookback(prev, x, pre_alpha, K: int, dilation: int):
    """The PRE_SNAKE arguments of the depthwise kernels: (prev, pre_alpha, tail, prev's strides,
    BLOCK_L) for `residual_unit`, dummies (x, never read) for the xp forms."""
    C = x.shape[1]
    if prev is None:
        return x, x, x, 0, 0, 1
    L = (K - 1) * dilation
    assert prev.shape == (x.shape[0], C, L) and prev.dtype == x.dtype and prev.stride(2) == 1, (prev.shape, x.shape)
    tail = torch.empty_like(prev, memory_format=torch.contiguous_format)
    return prev, pre_alpha.reshape(C).contiguous(), tail, prev.stride(0), prev.stride(1), triton.next_power_of_2(L)


def dwconv_snake(xp, weight, bias, alpha, dilation: int, *, prev=None, pre_alpha=None):
    """See the module doc. weight: [C, 1, K]; bias: [C]; alpha: [1, C, 1] or [C] -> y [B, C, T].
    prev, pre_alpha: xp is the unit's input x [B, C, T] instead, and prev its saved frames [B, C, L]
    (raw): the kernel applies the unit's first snake (pre_alpha) to the taps it loads, and also
    returns the next chunk's saved frames -> (y, tail), see `residual_unit`."""
    if not _HAVE_TRITON:
        raise RuntimeError("triton is not installed")
    B, C, n = xp.shape
    K = weight.shape[-1]
    T = n if prev is not None else n - (K - 1) * dilation
    assert weight.shape == (C, 1, K) and bias.shape == (C,) and xp.dtype in DTYPES, (weight.shape, xp.dtype)
    assert T >= 0 and xp.stride(2) == 1, (xp.shape, xp.stride())
    prev_, pre_alpha, tail, spb, spc, block_l = _lookback(prev, xp, pre_alpha, K, dilation)
    y = torch.empty((B, C, T), dtype=xp.dtype, device=xp.device)
    if B and (T or prev is not None):
        grid = (B, triton.cdiv(C, BLOCK_C), max(1, triton.cdiv(T, BLOCK_T)))
        _dwconv_snake_kernel[grid](
            xp, weight.reshape(C, K).contiguous(), bias, alpha.reshape(C).contiguous(), y, prev_, pre_alpha, tail,
            C, T, xp.stride(0), xp.stride(1), y.stride(0), y.stride(1), spb, spc,
            K=K, DIL=dilation, BLOCK_C=BLOCK_C, BLOCK_T=BLOCK_T, FAST_SIN=_FAST_SIN, PRE_SNAKE=prev is not None,
            BLOCK_L=block_l, num_warps=NUM_WARPS,
        )
    return y if prev is None else (y, tail)


def unit_tail(xp, x, dw_weight, dw_bias, alpha, pw_weight, pw_bias, dilation: int, *, prev=None, pre_alpha=None):
    """See the module doc. dw_weight [C, 1, K], dw_bias [C], alpha [1, C, 1] or [C] (the second
    snake's), pw_weight [C, C, 1], pw_bias [C] -> out [B, C, T], contiguous.
    prev, pre_alpha: xp is None; the taps read x and prev (raw) and take the first snake (pre_alpha)
    -> (out, tail), as `dwconv_snake`'s."""
    if not _HAVE_TRITON:
        raise RuntimeError("triton is not installed")
    B, C, T = x.shape
    K = dw_weight.shape[-1]
    assert (xp is None) == (prev is not None), "either xp or prev"
    if xp is None:
        xp = x
    else:
        assert xp.shape == (B, C, T + (K - 1) * dilation) and xp.dtype == x.dtype, (xp.shape, x.shape, xp.dtype)
    assert dw_weight.shape == (C, 1, K) and dw_bias.shape == pw_bias.shape == (C,), (dw_weight.shape, C)
    assert pw_weight.shape == (C, C, 1) and x.dtype in DTYPES, (pw_weight.shape, x.dtype)
    assert xp.stride(2) == 1 and x.stride(2) == 1, (x.shape, xp.shape, x.stride())
    prev_, pre_alpha, tail, svb, svc, block_l = _lookback(prev, x, pre_alpha, K, dilation)
    out = torch.empty((B, C, T), dtype=x.dtype, device=x.device)
    if B and (T or prev is not None):
        width = max(16, triton.next_power_of_2(C))  # tl.dot takes blocks of 16 and more
        block_ci, block_t, warps = next((v for c, v in sorted(UNIT_LAUNCHES.items()) if C <= c),
                                        UNIT_LAUNCHES[max(UNIT_LAUNCHES)])
        block_co, block_ci = min(UNIT_BLOCK_CO, width), min(block_ci, width)
        if _INTERPRETED:
            block_t = max(block_t, 256)  # the interpreter runs each program in Python: fewer, longer blocks
        grid = (max(1, triton.cdiv(T, block_t)), B, triton.cdiv(C, block_co))
        _unit_tail_kernel[grid](
            xp, x, dw_weight.reshape(C, K).contiguous(), dw_bias, alpha.reshape(C).contiguous(),
            pw_weight.reshape(C, C).contiguous(), pw_bias, out, prev_, pre_alpha, tail,
            C, T, xp.stride(0), xp.stride(1), x.stride(0), x.stride(1), svb, svc,
            K=K, DIL=dilation, BLOCK_CO=block_co, BLOCK_CI=block_ci, BLOCK_T=block_t, FAST_SIN=_FAST_SIN,
            DOT_DTYPE=_DOT_DTYPES[x.dtype], DOT_PRECISION=_dot_precision(x.dtype),
            PRE_SNAKE=prev is not None, BLOCK_L=block_l, num_warps=warps,
        )
    return out if prev is None else (out, tail)


def _dot_precision(dtype) -> str:
    """tl.dot's input_precision for operands of `dtype`: UNIT_DOT_PRECISION for fp32 where it is taken (not
    every one is by triton's interpreter), else "ieee"."""
    taken = _INTERPRETER_DOT_PRECISIONS
    if dtype != torch.float32 or (taken is not None and UNIT_DOT_PRECISION not in taken):
        return "ieee"
    return UNIT_DOT_PRECISION


def unit_cl(xp, x, dw_weight, dw_bias, alpha, pw_weight, pw_bias, dilation: int, rows_out: bool = False):
    """`unit_tail` channels-last (see the module doc). xp [B, C, L + T] = [saved | snake(x)] laid out
    channels-last (`snake_extend(channels_last=True)`), x [B, C, T] the unit's input, channels-last
    (x.stride(1) == 1), weights as unit_tail's -> out [B, C, T], channels-last, or contiguous rows with
    rows_out. C one of UNIT_CL_LAUNCHES."""
    if not _HAVE_TRITON:
        raise RuntimeError("triton is not installed")
    B, C, T = x.shape
    K = dw_weight.shape[-1]
    assert C in UNIT_CL_LAUNCHES and x.dtype in DTYPES and x.stride(1) == 1, (C, x.dtype, x.stride())
    assert xp.shape == (B, C, T + (K - 1) * dilation) and xp.stride(1) == 1 and xp.dtype == x.dtype, \
        (xp.shape, xp.stride(), x.shape)
    assert dw_weight.shape == (C, 1, K) and dw_bias.shape == pw_bias.shape == (C,), (dw_weight.shape, C)
    assert pw_weight.shape == (C, C, 1), pw_weight.shape
    if rows_out:
        out = torch.empty((B, C, T), dtype=x.dtype, device=x.device)
    else:
        out = torch.empty((B, T, C), dtype=x.dtype, device=x.device).transpose(1, 2)
    block_t, block_co, warps = UNIT_CL_LAUNCHES[C]
    block_co = min(block_co, C)
    # the kernel masks no channel, and tl.dot takes blocks of 16 and more
    assert C & (C - 1) == 0 and C % block_co == 0 and block_co >= 16, (C, block_co)
    if out.numel():
        if _INTERPRETED:
            block_t = max(block_t, 256)  # the interpreter runs each program in Python: fewer, longer blocks
        _unit_cl_kernel[(triton.cdiv(T, block_t), B)](
            xp, x, dw_weight.reshape(C, K).contiguous(), dw_bias, alpha.reshape(C).contiguous(),
            pw_weight.reshape(C, C).contiguous(), pw_bias, out,
            T, xp.stride(0), xp.stride(2), x.stride(0), x.stride(2), *out.stride(),
            C=C, K=K, DIL=dilation, BLOCK_T=block_t, BLOCK_CO=block_co, FAST_SIN=_FAST_SIN,
            DOT_DTYPE=_DOT_DTYPES[x.dtype], DOT_PRECISION=_dot_precision(x.dtype), num_warps=warps,
        )
    return out


def residual_unit(prev, x, pre_alpha, dw_weight, dw_bias, alpha, pw_weight, pw_bias, dilation: int):
    """A whole depthwise residual unit from its raw input: prev [B, C, L] (the stream's saved frames
    of x: its last L = 6 * dilation input frames, raw; zeros one-shot), x [B, C, T] contiguous
    -> (x + pointwise(snake(dwconv(snake([prev | x])))), tail [B, C, L] = the last L frames of
    [prev | x]). The first snake (pre_alpha) is applied to each tap as it is loaded, so no pass
    writes the snaked look-back input. Up to UNIT_MAX_CHANNELS channels in one kernel (`unit_tail`),
    wider units as dwconv_snake, cuDNN's pointwise conv and skip_add."""
    if x.shape[1] <= UNIT_MAX_CHANNELS:
        return unit_tail(None, x, dw_weight, dw_bias, alpha, pw_weight, pw_bias, dilation, prev=prev,
                         pre_alpha=pre_alpha)
    y, tail = dwconv_snake(x, dw_weight, dw_bias, alpha, dilation, prev=prev, pre_alpha=pre_alpha)
    z = torch.nn.functional.conv1d(y, pw_weight) if y.shape[-1] else y  # (cuDNN takes no empty input)
    return skip_add(x, z, pw_bias), tail


def unit_snake_on_load(channels: int) -> bool:
    """Whether a residual unit of `channels` that does not run channels-last (`unit_channels_last`) runs as
    `residual_unit` (SNAKE_ON_LOAD_WIDE, SNAKE_ON_LOAD_UP_TO)."""
    return SNAKE_ON_LOAD_WIDE if channels > UNIT_MAX_CHANNELS else channels <= SNAKE_ON_LOAD_UP_TO


def unit_channels_last(channels: int) -> bool:
    """Whether a residual unit of `channels` runs channels-last (`unit_cl`, UNIT_CL_CHANNELS)."""
    return channels in UNIT_CL_CHANNELS and channels in UNIT_CL_LAUNCHES


def unit_row_align(channels: int) -> int:
    """`snake_extend`'s row_align for a residual unit of `channels` (ROW_ALIGN_FROM)."""
    return ROW_ALIGN if channels >= ROW_ALIGN_FROM else 1


def snake_extend(prev, x, alpha, affine=None, channels_last: bool = False, row_align: int = 1):
    """prev [B, C, L] (a stream's saved frames), x [B, C, T] (any strides), alpha [1, C, 1] or [C]
    -> (full [B, C, L + T] = cat(prev, snake(x)), tail [B, C, L] = its last L frames), one pass.

    affine: (scale, shift), each [1, C] or [B, C] (per stream): x * scale + shift goes into the
    snake instead of x (the decoder's sample-rate condition, `SampleRateCondition.affine`).
    channels_last: full laid out [B, L + T, C] in memory (strides (C * (L + T), 1, C)), as a conv with
    a channels-last weight takes it (cuDNN would otherwise copy it so); tail stays contiguous.
    row_align: full's row stride a multiple of this many elements (a view of a buffer whose last dim is
    padded past L + T). triton specializes on strides divisible by 16: with 16, this kernel's stores and
    its readers' loads at 16-byte-aligned offsets can be vectorized. For readers that take a strided
    input (the kernels here), not for cuDNN's convs (they would copy it)."""
    if not _HAVE_TRITON:
        raise RuntimeError("triton is not installed")
    B, C, T = x.shape
    L = prev.shape[-1]
    assert prev.shape[:2] == (B, C) and prev.dtype == x.dtype in DTYPES, (prev.shape, x.shape, prev.dtype, x.dtype)
    assert prev.stride(2) == 1, prev.stride()
    assert row_align >= 1 and (row_align == 1 or not channels_last), (row_align, channels_last)
    if channels_last:
        full = torch.empty((B, L + T, C), dtype=x.dtype, device=x.device).transpose(1, 2)
    else:
        width = -(-(L + T) // row_align) * row_align
        full = torch.empty((B, C, width), dtype=x.dtype, device=x.device)[..., :L + T]
    tail = torch.empty((B, C, L), dtype=x.dtype, device=x.device)
    scale = shift = x
    sab = 0
    if affine is not None:
        scale, shift = (a.contiguous() for a in affine)
        assert scale.shape == shift.shape and scale.shape in ((1, C), (B, C)), (scale.shape, shift.shape, B, C)
        assert scale.dtype == shift.dtype == x.dtype, (scale.dtype, x.dtype)
        sab = 0 if scale.shape[0] == 1 else C  # one row for every stream, or one per stream
    if B == 0 or L + T == 0:
        return full, tail
    block_c, block_t = CL_BLOCKS if channels_last and x.stride(1) == 1 else (BLOCK_C, BLOCK_T)
    grid = (B, triton.cdiv(C, block_c), triton.cdiv(L + T, block_t))
    _snake_extend_kernel[grid](
        prev, x, alpha.reshape(C).contiguous(), full, tail, scale, shift,
        C, L, T, prev.stride(0), prev.stride(1), *x.stride(), sab, *full.stride(),
        BLOCK_C=block_c, BLOCK_T=block_t, FAST_SIN=_FAST_SIN, AFFINE=affine is not None, num_warps=NUM_WARPS,
    )
    return full, tail


def conv_tanh(xp, weight, bias):
    """The decoder's last layer: a causal conv to one channel and its tanh. xp [B, C, K - 1 + T] (the
    conv's input with its look-back frames in front), weight [1, C, K], bias [1] -> [B, 1, T] =
    tanh(conv(xp) + bias), one pass (cuDNN's conv with a single output channel barely uses the GPU)."""
    if not _HAVE_TRITON:
        raise RuntimeError("triton is not installed")
    B, C, n = xp.shape
    K = weight.shape[-1]
    T = n - (K - 1)
    assert weight.shape == (1, C, K) and bias.shape == (1,) and xp.dtype in DTYPES, (weight.shape, bias.shape)
    assert T >= 0 and xp.stride(2) == 1, (xp.shape, xp.stride())
    out = torch.empty((B, 1, T), dtype=xp.dtype, device=xp.device)
    if out.numel():
        block_t = 1024 if _INTERPRETED else BLOCK_T
        grid = (triton.cdiv(T, block_t), B)
        _conv_tanh_kernel[grid](xp, weight.reshape(C, K).contiguous(), bias, out, C, T, xp.stride(0), xp.stride(1),
                                K=K, BLOCK_C=BLOCK_C, BLOCK_T=block_t, num_warps=NUM_WARPS)
    return out


def skip_add(x, z, bias):
    """x, z [B, C, T] contiguous, bias [C] -> x + (z + bias), one pass."""
    if not _HAVE_TRITON:
        raise RuntimeError("triton is not installed")
    B, C, T = x.shape
    assert z.shape == x.shape and bias.shape == (C,) and x.is_contiguous() and z.is_contiguous(), \
        (x.shape, z.shape, bias.shape)
    out = torch.empty_like(x)
    if x.numel():
        grid = (B, triton.cdiv(C, BLOCK_C), triton.cdiv(T, BLOCK_T))
        _skip_add_kernel[grid](x, z, bias, out, C, T, BLOCK_C=BLOCK_C, BLOCK_T=BLOCK_T, num_warps=NUM_WARPS)
    return out


def phase_interleave(y, bias, stride: int, channels_last: bool = False):
    """y [B, C * stride, T] (phase j of channel c in row c * stride + j; any strides: cuDNN returns
    channels-last), bias [C] -> [B, C, T * stride], out[..., t * stride + j] = y[:, c * stride + j, t]
    + bias[c], one pass. channels_last: out laid out [B, T * stride, C] in memory (for `unit_cl`)."""
    if not _HAVE_TRITON:
        raise RuntimeError("triton is not installed")
    B, CS, T = y.shape
    C = CS // stride
    assert CS == C * stride and bias.shape == (C,), (y.shape, bias.shape, stride)
    if channels_last:
        out = torch.empty((B, T * stride, C), dtype=y.dtype, device=y.device).transpose(1, 2)
        block_c, block_t = CL_BLOCKS
    else:
        out = torch.empty((B, C, T * stride), dtype=y.dtype, device=y.device)
        block_c, block_t = BLOCK_C, BLOCK_T
    if out.numel():
        grid = (B, triton.cdiv(C, block_c), triton.cdiv(T * stride, block_t))
        _phase_interleave_kernel[grid](y, bias, out, C, T, *y.stride(), *out.stride(), S=stride,
                                       BLOCK_C=block_c, BLOCK_T=block_t, num_warps=NUM_WARPS)
    return out

