"""The VAE decoder's Triton kernels (`kernels.vae`) against the PyTorch layers.

Compiled on a CUDA machine; elsewhere under triton's CPU interpreter (TRITON_INTERPRET=1, set by
conftest.py); fails where triton is not installed (setup.sh installs it). The PyTorch decoder it replaces is checked
against the official one in test_audio_vae.py.
"""

from __future__ import annotations

import pytest
import torch

from tests.conftest import require_module

require_module("triton", "requirements-test.txt")

from voxcpm_triton.model.audio_vae import (  # noqa: E402
    AudioVAE, AudioVAEConfig, CausalConvTranspose1d, DecoderBlock, ResidualUnit, SampleRateCondition, Snake1d,
    _Stream, snake,
)
from voxcpm_triton.kernels import vae as vae_kernels  # noqa: E402
from voxcpm_triton.kernels.vae import (  # noqa: E402
    conv_tanh, dwconv_snake, phase_interleave, residual_unit, skip_add, snake_extend, unit_cl, unit_tail,
)

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
# The polyphase upsampling conv and cuDNN's transposed conv may both use TF32 on a GPU (PyTorch's
# default for convs), each rounding differently. Exact fp32 on the CPU.
TOL = 2e-3 if DEV.type == "cuda" else 1e-5
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")


def _randomize(module, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("alpha"):
                p.copy_(0.5 + torch.rand(p.shape, generator=g))
            else:
                p.copy_(0.3 * torch.randn(p.shape, generator=g) / max(1, p[0].numel()) ** 0.5)
    return module


@pytest.mark.parametrize("C,T,dilation,with_prev", [(20, 3, 9, True), (20, 300, 3, True), (5, 130, 1, True),
                                                     (20, 40, 9, False)])
def test_kernel_matches_the_layers(C, T, dilation, with_prev):
    """The unit's conv and second snake on the conv's padded input (the stream's saved frames, or
    zeros): fewer frames than the look-back, several time blocks, a partial channel block."""
    unit = _randomize(ResidualUnit(C, dilation, groups=C), seed=C + T).to(DEV)
    _, conv, snake2, _ = unit.block
    g = torch.Generator().manual_seed(T)
    x = torch.randn(2, C, T, generator=g).to(DEV)
    prev = torch.randn(2, C, conv.left_pad, generator=g).to(DEV) if with_prev else None
    want = snake2(conv(x, _Stream([prev]) if with_prev else None))
    xp = torch.cat([prev, x], -1) if with_prev else torch.nn.functional.pad(x, (conv.left_pad, 0))
    y = dwconv_snake(xp, conv.weight, conv.bias, snake2.alpha, dilation)
    assert y.shape == want.shape
    assert (y - want).abs().max().item() <= 1e-5


@pytest.mark.parametrize("C,T,dilation,block_co", [(20, 3, 9, 128), (40, 300, 3, 16), (64, 70, 1, 128),
                                                    (33, 200, 1, 16)])
def test_unit_tail_is_the_rest_of_the_unit(C, T, dilation, block_co, monkeypatch):
    """Depthwise conv, its snake, the pointwise conv and the skip in one kernel against the unit's
    layers from its padded input: fewer frames than the look-back and a partial channel block
    (20 channels in one block of 32), several output channel blocks (40 and 33 in blocks of 16, each
    making the depthwise conv again; 33 also in input blocks of 16, the last one partial), several
    time blocks (300 frames: more than the interpreter's block of 256), whole blocks (64)."""
    monkeypatch.setattr(vae_kernels, "UNIT_BLOCK_CO", block_co)
    unit = _randomize(ResidualUnit(C, dilation, groups=C), seed=C + T).to(DEV)
    snake1, conv, snake2, pointwise = unit.block
    g = torch.Generator().manual_seed(T)
    x = torch.randn(2, C, T, generator=g).to(DEV)
    prev = torch.randn(2, C, conv.left_pad, generator=g).to(DEV)
    xp = torch.cat([prev, snake1(x)], -1)
    want = x + pointwise(snake2(conv(xp[..., conv.left_pad:], _Stream([prev]))))
    got = unit_tail(xp, x, conv.weight, conv.bias, snake2.alpha, pointwise.weight, pointwise.bias, dilation)
    assert got.shape == want.shape and got.is_contiguous()
    assert want.abs().max().item() > 0.1
    assert (got - want).abs().max().item() <= TOL * max(1.0, want.abs().max().item())


@pytest.mark.parametrize("C,T,dilation,unit_max,block_co,block_t", [
    (20, 3, 9, 128, 128, None), (40, 300, 3, 128, 128, None), (33, 200, 1, 128, 16, None), (20, 120, 9, 128, 128, 16),
    (20, 3, 9, 8, 128, None), (20, 300, 3, 8, 128, None), (20, 120, 9, 8, 128, 16),
    (20, 0, 3, 128, 128, None), (20, 0, 3, 8, 128, None)])
def test_residual_unit_runs_from_the_raw_input(C, T, dilation, unit_max, block_co, block_t, monkeypatch):
    """`residual_unit`: the first snake applied to the taps as they load, from the unit's raw input and
    the stream's raw saved frames, against the unit's layers; its tail is exactly the last frames of
    [saved | x], the next chunk's saved frames. In `unit_tail` (up to unit_max channels) and in
    dwconv_snake + pointwise + skip_add (wider); fewer frames than the look-back (3 < 6 * 9), several
    time blocks (300 frames, the interpreter's blocks of 256), time blocks of 16 frames (block_t), four of
    which reach back into the 54 saved frames, several output channel blocks (33 in blocks of 16, the tail
    written by the first), a partial channel block, and no frames at all (the tail is prev)."""
    monkeypatch.setattr(vae_kernels, "UNIT_MAX_CHANNELS", unit_max)
    monkeypatch.setattr(vae_kernels, "UNIT_BLOCK_CO", block_co)
    if block_t:  # the interpreter's own launches take blocks of 256 frames
        monkeypatch.setattr(vae_kernels, "_INTERPRETED", False)
        monkeypatch.setattr(vae_kernels, "UNIT_LAUNCHES", {128: (16, block_t, 4)})
        monkeypatch.setattr(vae_kernels, "BLOCK_T", block_t)
    unit = _randomize(ResidualUnit(C, dilation, groups=C), seed=C + T).to(DEV)
    snake1, conv, snake2, pointwise = unit.block
    g = torch.Generator().manual_seed(T + 1)
    x = torch.randn(2, C, T, generator=g).to(DEV)
    prev = torch.randn(2, C, conv.left_pad, generator=g).to(DEV)
    got, tail = residual_unit(prev, x, snake1.alpha, conv.weight, conv.bias, snake2.alpha, pointwise.weight,
                              pointwise.bias, dilation)
    assert got.shape == x.shape and got.is_contiguous()
    assert torch.equal(tail, torch.cat([prev, x], -1)[..., -conv.left_pad:])
    if T:  # (PyTorch's conv takes no empty input)
        want = x + pointwise(snake2(conv(snake1(x), _Stream([snake1(prev)]))))
        assert want.abs().max().item() > 0.1
        assert (got - want).abs().max().item() <= TOL * max(1.0, want.abs().max().item())


@pytest.mark.parametrize("C,T,dilation,rows_out,block_co", [(32, 3, 9, False, 32), (32, 300, 3, True, 16),
                                                             (64, 70, 1, False, 64), (64, 300, 9, True, 32)])
def test_unit_cl_is_the_rest_of_the_unit_channels_last(C, T, dilation, rows_out, block_co, monkeypatch):
    """`unit_cl` after the look-back pass, both channels-last (`snake_extend` from a channels-last unit
    input), against the unit's layers: fewer frames than the look-back (3 < 6 * 9), several time blocks
    (300 frames: more than the interpreter's block of 256), several output channel blocks (32 in blocks of
    16, 64 in blocks of 32), channels-last output and contiguous rows."""
    monkeypatch.setattr(vae_kernels, "UNIT_CL_LAUNCHES", {C: (64, block_co, 4)})
    unit = _randomize(ResidualUnit(C, dilation, groups=C), seed=C + T).to(DEV)
    snake1, conv, snake2, pointwise = unit.block
    g = torch.Generator().manual_seed(T)
    x = torch.randn(2, C, T, generator=g).to(DEV)
    prev = torch.randn(2, C, conv.left_pad, generator=g).to(DEV)  # saved frames, snaked (as the pass keeps them)
    x_cl = x.transpose(1, 2).contiguous().transpose(1, 2)
    xp, tail = snake_extend(prev, x_cl, snake1.alpha, channels_last=True)
    rows, rows_tail = snake_extend(prev, x, snake1.alpha)
    assert xp.stride(1) == 1 and torch.equal(xp, rows) and torch.equal(tail, rows_tail)
    got = unit_cl(xp, x_cl, conv.weight, conv.bias, snake2.alpha, pointwise.weight, pointwise.bias, dilation,
                  rows_out=rows_out)
    assert got.shape == x.shape and (got.is_contiguous() if rows_out else got.stride(1) == 1)
    want = x + pointwise(snake2(conv(snake1(x), _Stream([prev]))))
    assert want.abs().max().item() > 0.1
    assert (got - want).abs().max().item() <= TOL * max(1.0, want.abs().max().item())


@pytest.mark.parametrize("condition", [False, True])
def test_a_decoder_block_with_channels_last_units_matches_the_layers(condition, monkeypatch):
    """A whole decoder block whose units run channels-last (its upsampling writing channels-last, each
    unit's look-back pass and `unit_cl`, the last unit writing rows) against the same block's PyTorch
    layers, one-shot and streamed in uneven chunks (one of fewer frames than the widest look-back), the
    stream's saved frames carried from chunk to chunk; with the sample-rate condition in its first pass.
    Weights at full gain, so that the units' part of the output is large (in the decoder tests the signal
    fades block by block)."""
    monkeypatch.setattr(vae_kernels, "UNIT_CL_CHANNELS", (32,))
    monkeypatch.setattr(vae_kernels, "UNIT_CL_LAUNCHES", {32: (64, 16, 4)})
    blocks = []
    for kernels in (False, True):
        vae = AudioVAE(AudioVAEConfig.from_dict(REALISH), triton_kernels=kernels).eval().to(DEV)
        block = vae.decoder.model[2]  # 64 -> 32 channels, stride 8
        g = torch.Generator().manual_seed(7)
        with torch.no_grad():
            for name, p in block.named_parameters():
                p.copy_(0.5 + torch.rand(p.shape, generator=g) if name.endswith("alpha")
                        else torch.randn(p.shape, generator=g) / max(1, p[0].numel()) ** 0.5)
        blocks.append(block)
    plain, fused = blocks
    assert fused.units_channels_last and not plain.units_channels_last
    g = torch.Generator().manual_seed(8)
    x = torch.randn(2, 64, 9, generator=g).to(DEV)
    affine = (1 + 0.3 * torch.randn(2, 64, generator=g).to(DEV), 0.3 * torch.randn(2, 64, generator=g).to(DEV)) \
        if condition else None
    x_in = x * affine[0][..., None] + affine[1][..., None] if condition else x
    want = plain(x_in)
    up_only = plain.block[1](plain.block[0](x_in))  # the block without its units
    assert (want - up_only).abs().max().item() > 0.3 * want.abs().max().item()  # the units' part is large
    tol = TOL * max(1.0, want.abs().max().item())
    assert (fused(x, None, affine) - want).abs().max().item() <= tol
    # the stream's saved frames, in the order the block takes them: the upsampling's frame, each unit's look-back
    state = [torch.zeros(2, 64, 1, device=DEV)] + [torch.zeros(2, 32, 6 * d, device=DEV) for d in (1, 3, 9)]
    parts = []
    for a, b in ((0, 1), (1, 7), (7, 9)):  # 1 frame -> 8 samples: fewer than the unit of dilation 9 looks back (54)
        st = _Stream(state)
        parts.append(fused(x[..., a:b], st, affine))
        state = st.next
    assert (torch.cat(parts, -1) - want).abs().max().item() <= tol


@pytest.mark.parametrize("C,L,T,scale", [(20, 54, 3, 1), (5, 6, 300, 1), (9, 18, 18, 1), (9, 18, 300, 100)])
def test_snake_extend_is_cat_of_the_saved_frames_and_the_snake(C, L, T, scale):
    """Fewer new frames than saved ones (the tail then holds saved frames), several time blocks,
    a partial channel block; x strided along batch and channels as a sliced activation is. scale 100:
    sine arguments in the hundreds, where the GPU's approximate sine is least accurate."""
    g = torch.Generator().manual_seed(C * T)
    prev = torch.randn(2, C, L, generator=g).to(DEV)
    x = scale * torch.randn(3, C + 1, T, generator=g).to(DEV)[1:, :C]
    alpha = (0.5 + torch.rand(1, C, 1, generator=g)).to(DEV)
    want = torch.cat([prev, snake(x, alpha)], -1)
    full, tail = snake_extend(prev, x, alpha)
    assert full.shape == want.shape and tail.shape == prev.shape and tail.is_contiguous()
    assert (full - want).abs().max().item() <= 1e-5 * max(1.0, want.abs().max().item())
    assert torch.equal(tail, full[..., -L:])
    cl, cl_tail = snake_extend(prev, x, alpha, channels_last=True)
    assert cl.stride() == (C * (L + T), 1, C) and torch.equal(cl, full) and torch.equal(cl_tail, tail)
    aligned, a_tail = snake_extend(prev, x, alpha, row_align=16)  # rows padded to a multiple of 16 elements
    width = -(-(L + T) // 16) * 16
    assert aligned.stride() == (C * width, width, 1) and aligned.shape == full.shape
    assert torch.equal(aligned, full) and torch.equal(a_tail, tail)
    x_cl = x.transpose(1, 2).contiguous().transpose(1, 2)  # x channels-last (a channels-last unit's output)
    for channels_last in (False, True):
        from_cl, from_cl_tail = snake_extend(prev, x_cl, alpha, channels_last=channels_last)
        assert torch.equal(from_cl, full) and torch.equal(from_cl_tail, tail)


@pytest.mark.parametrize("rows", [1, 2])
def test_snake_extend_applies_the_sample_rate_condition_first(rows):
    """affine: x * scale + shift before the snake, one (scale, shift) for every stream or one per stream."""
    g = torch.Generator().manual_seed(rows)
    B, C, L, T = 2, 9, 1, 300
    prev, x = torch.randn(B, C, L, generator=g).to(DEV), torch.randn(B, C, T, generator=g).to(DEV)
    alpha = (0.5 + torch.rand(1, C, 1, generator=g)).to(DEV)
    scale, shift = (0.5 + torch.rand(rows, C, generator=g)).to(DEV), torch.randn(rows, C, generator=g).to(DEV)
    want = torch.cat([prev, snake(x * scale[..., None] + shift[..., None], alpha)], -1)
    full, tail = snake_extend(prev, x, alpha, (scale, shift))
    assert (full - want).abs().max().item() <= 1e-5 * max(1.0, want.abs().max().item())
    assert torch.equal(tail, full[..., -L:])
    plain, _ = snake_extend(prev, x, alpha)
    assert (plain - full).abs().max().item() > 0.1  # the condition did something


@pytest.mark.parametrize("C,T", [(32, 3), (20, 700), (40, 1500)])
def test_conv_tanh_is_the_last_conv_and_its_tanh(C, T):
    """A partial and several channel blocks, several time blocks; arguments large enough to saturate."""
    g = torch.Generator().manual_seed(C + T)
    xp = (3 * torch.randn(2, C, T + 6, generator=g)).to(DEV)
    w, b = (torch.randn(1, C, 7, generator=g) / C ** 0.5).to(DEV), torch.randn(1, generator=g).to(DEV)
    want = torch.tanh(torch.nn.functional.conv1d(xp.double().cpu(), w.double().cpu(), b.double().cpu()))
    got = conv_tanh(xp, w, b)
    assert got.shape == want.shape == (2, 1, T)
    assert (got.double().cpu() - want).abs().max().item() <= 1e-5
    assert want.abs().max().item() > 0.99


def test_skip_add_is_the_residual_with_the_pointwise_bias():
    g = torch.Generator().manual_seed(5)
    x, z = torch.randn(2, 2, 9, 300, generator=g).to(DEV)
    bias = torch.randn(9, generator=g).to(DEV)
    assert (skip_add(x, z, bias) - (x + (z + bias[:, None]))).abs().max().item() <= 1e-6


@pytest.mark.parametrize("C_in,C_out,stride,T", [(6, 5, 8, 3), (16, 8, 2, 300), (4, 3, 5, 1),
                                                  (512, 2, 2, 3)])  # 512: the channels-last weight
def test_polyphase_upsampling_is_the_transposed_conv(C_in, C_out, stride, T):
    """One-shot (zeros before the first frame) and streamed in two chunks (the saved frame)."""
    up = _randomize(CausalConvTranspose1d(C_in, C_out, stride), seed=stride).to(DEV)
    x = torch.randn(2, C_in, T + 2, generator=torch.Generator().manual_seed(T)).to(DEV)
    want = up(x)
    assert want.shape == (2, C_out, (T + 2) * stride)
    tol = TOL * max(1.0, want.abs().max().item())  # TF32 rounds relative to the sums' size
    up.polyphase = True
    assert (up(x) - want).abs().max().item() <= tol
    st = _Stream([torch.zeros(2, C_in, 1, device=DEV)])
    first = up(x[..., :T], st)
    second = up(x[..., T:], _Stream(st.next))
    assert (torch.cat([first, second], -1) - want).abs().max().item() <= tol


@pytest.mark.parametrize("C_in", [16, 512])  # 512: the look-back pass writes channels-last, as the weight is
def test_polyphase_upsampling_with_its_snake_deferred(C_in):
    """The snake before the upsampling conv applied in its look-back pass (`snake_extend`), against
    the snake then the transposed conv; one-shot and streamed."""
    up = _randomize(CausalConvTranspose1d(C_in, 3, 2), seed=C_in).to(DEV)
    act = _randomize(Snake1d(C_in), seed=C_in + 1).to(DEV)
    object.__setattr__(up, "pre_snake", act)
    x = torch.randn(2, C_in, 7, generator=torch.Generator().manual_seed(C_in)).to(DEV)
    want = up(x)  # the plain path applies the deferred snake itself
    tol = TOL * max(1.0, want.abs().max().item())
    up.polyphase = True
    assert up.channels_last == (C_in >= 512)
    assert (up(x) - want).abs().max().item() <= tol
    st = _Stream([torch.zeros(2, C_in, 1, device=DEV)])
    first = up(x[..., :3], st)
    assert (torch.cat([first, up(x[..., 3:], _Stream(st.next))], -1) - want).abs().max().item() <= tol


def test_polyphase_weight_follows_the_weight():
    up = CausalConvTranspose1d(3, 2, 2).to(DEV)
    w = up.phase_weight()
    assert up.phase_weight() is w  # built once
    with torch.no_grad():
        up.weight.mul_(2)
    assert torch.equal(up.phase_weight(), 2 * w)


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("out_channels_last", [False, True])
def test_phase_interleave(channels_last, out_channels_last):
    y = torch.randn(2, 3 * 4, 5, generator=torch.Generator().manual_seed(1)).to(DEV)
    if channels_last:  # cuDNN's output layout for a channels-last weight
        y = y.transpose(1, 2).contiguous().transpose(1, 2)
    bias = torch.randn(3, generator=torch.Generator().manual_seed(2)).to(DEV)
    want = y.reshape(2, 3, 4, 5).transpose(2, 3).reshape(2, 3, 20) + bias[:, None]
    got = phase_interleave(y, bias, 4, channels_last=out_channels_last)
    assert torch.equal(got, want)
    assert got.stride() == ((60, 1, 3) if out_channels_last else (60, 20, 1))


REALISH = dict(encoder_dim=4, encoder_rates=[2, 5, 8, 8], latent_dim=8, decoder_dim=64,
               decoder_rates=[8, 6, 5, 2, 2, 2], depthwise=True, sr_bin_boundaries=[20000, 30000, 40000])


@pytest.mark.parametrize("on_load,channels_last", [(True, False), (False, False), (True, True)])
def test_decoder_with_the_kernel_matches_without(on_load, channels_last, monkeypatch):
    """The whole decoder: one-shot, and streamed in uneven chunks (states through the kernel). Its
    units of 32 and 16 channels run three kernels, the narrower ones `unit_tail`: both paths. on_load:
    all but the 8-channel units run from their raw input (`residual_unit`, the stream keeping raw
    frames); else none. Units of 4 channels and more that do not read look-back rows padded to 16
    elements, the narrower ones (unit_tail) plain rows. channels_last: the units of 32 and 16 channels
    run `unit_cl` instead (their blocks' upsampling writing channels-last, their last unit rows)."""
    monkeypatch.setattr(vae_kernels, "UNIT_MAX_CHANNELS", 8)
    monkeypatch.setattr(vae_kernels, "ROW_ALIGN_FROM", 4)
    monkeypatch.setattr(vae_kernels, "SNAKE_ON_LOAD_WIDE", on_load)
    monkeypatch.setattr(vae_kernels, "SNAKE_ON_LOAD_UP_TO", 4 if on_load else 0)
    monkeypatch.setattr(vae_kernels, "UNIT_CL_CHANNELS", (32, 16) if channels_last else ())
    monkeypatch.setattr(vae_kernels, "UNIT_CL_LAUNCHES", {16: (64, 16, 4), 32: (64, 16, 4)})
    plain = _randomize(AudioVAE(AudioVAEConfig.from_dict(REALISH)), seed=1).eval().to(DEV)
    fused = _randomize(AudioVAE(AudioVAEConfig.from_dict(REALISH), triton_kernels=True), seed=1).eval().to(DEV)
    units = [m for m in fused.modules() if getattr(m, "fused", False)]
    assert len(units) == 18  # 6 blocks x 3 units
    on = sum(vae_kernels.unit_snake_on_load(u.block[0].alpha.shape[1]) for u in units)
    assert on == (15 if on_load else 0)  # all but 3 units of 8 channels
    assert sum(getattr(m, "polyphase", False) for m in fused.modules()) == 6
    # The snakes before the upsampling convs and the last conv run in those convs' look-back pass,
    # and the last conv applies the tanh.
    assert sum(getattr(m, "deferred", False) for m in fused.modules()) == 8
    assert all(b.takes_condition for b in fused.decoder.model if isinstance(b, DecoderBlock))
    assert sum(b.units_channels_last for b in fused.decoder.model if isinstance(b, DecoderBlock)) == \
        (2 if channels_last else 0)
    assert fused.state_dict().keys() == plain.state_dict().keys()  # checkpoints load as they did
    z = torch.randn(2, 8, 5, generator=torch.Generator().manual_seed(11)).to(DEV)
    want = plain.decode(z)
    assert want.abs().max().item() > 1e-3  # not a trivially silent decoder
    assert (fused.decode(z) - want).abs().max().item() <= TOL
    state, parts = fused.new_stream_state(2), []
    for a, b in ((0, 1), (1, 2), (2, 5)):
        audio, state = fused.decode_chunk(z[..., a:b], state)
        parts.append(audio)
    assert (torch.cat(parts, -1) - want).abs().max().item() <= TOL


@pytest.mark.parametrize("kernel", ["dwconv_snake", "unit_tail"])
def test_the_depthwise_kernels_read_padded_lookback_rows(kernel):
    """xp as `snake_extend(row_align=16)` hands it over (rows of 64 elements holding 55 frames) gives
    exactly what the same frames give contiguous: the kernels take its row stride."""
    C, T, d = 20, 37, 3
    g = torch.Generator().manual_seed(5)
    xp, x = torch.randn(2, C, T + 6 * d, generator=g).to(DEV), torch.randn(2, C, T, generator=g).to(DEV)
    padded = torch.full((2, C, 64), float("nan"), device=DEV)[..., :T + 6 * d].copy_(xp)
    w, b = torch.randn(C, 1, 7, generator=g).to(DEV) / 3, torch.randn(C, generator=g).to(DEV)
    alpha, pw, pb = (0.5 + torch.rand(C, generator=g)).to(DEV), torch.randn(C, C, 1, generator=g).to(DEV) / 5, b
    run = (lambda xp: dwconv_snake(xp, w, b, alpha, d)) if kernel == "dwconv_snake" else \
        (lambda xp: unit_tail(xp, x, w, b, alpha, pw, pb, d))
    assert padded.stride(1) == 64 and not padded.is_contiguous()
    assert torch.equal(run(padded), run(xp))


def test_aligned_rows_and_snake_on_load_decode_the_same_audio(monkeypatch):
    """The whole decoder, streamed (the stream's saved frames snaked, or raw), with every unit on padded
    look-back rows, with none, and with every unit run from its raw input (`residual_unit`): the same
    audio, bit for bit. (No unit channels-last: they take neither setting.)"""
    monkeypatch.setattr(vae_kernels, "UNIT_CL_CHANNELS", ())
    monkeypatch.setattr(vae_kernels, "UNIT_MAX_CHANNELS", 8)
    fused = _randomize(AudioVAE(AudioVAEConfig.from_dict(REALISH), triton_kernels=True), seed=1).eval().to(DEV)
    z = torch.randn(2, 8, 3, generator=torch.Generator().manual_seed(13)).to(DEV)
    audio = []
    for align_from, on_load in ((1, False), (10**9, False), (1, True)):
        monkeypatch.setattr(vae_kernels, "ROW_ALIGN_FROM", align_from)
        monkeypatch.setattr(vae_kernels, "SNAKE_ON_LOAD_WIDE", on_load)
        monkeypatch.setattr(vae_kernels, "SNAKE_ON_LOAD_UP_TO", 10**9 if on_load else 0)
        state, parts = fused.new_stream_state(2), []
        for a, b in ((0, 1), (1, 3)):
            chunk, state = fused.decode_chunk(z[..., a:b], state)
            parts.append(chunk)
        audio.append(torch.cat(parts, -1))
    assert audio[0].abs().max().item() > 1e-3
    assert all(torch.equal(a, audio[0]) for a in audio[1:])


@pytest.mark.parametrize("cond", [{}, {"cond_out_layer": True}])
def test_decoder_with_the_kernels_takes_a_sample_rate_per_stream(cond, monkeypatch):
    """The sample-rate condition applied in the upsampling convs' look-back pass: a rate per stream
    (their own scale and shift rows), one-shot and streamed. A condition with an out layer is more
    than an affine: it keeps running as a layer of its own."""
    cfg = AudioVAEConfig.from_dict(dict(REALISH, **cond))
    plain = _randomize(AudioVAE(cfg), seed=2).eval().to(DEV)
    fused = _randomize(AudioVAE(cfg, triton_kernels=True), seed=2).eval().to(DEV)
    z = torch.randn(2, 8, 4, generator=torch.Generator().manual_seed(12)).to(DEV)
    sr = torch.tensor([16000, 48000], device=DEV)
    want = plain.decode(z, sr)
    # the rates condition differently (less so through the out layer's conv)
    assert (want - plain.decode(z)).abs().max().item() > (1e-4 if cond else 1e-3)
    if not cond:  # the fused path is taken, not the condition's own forward
        monkeypatch.setattr(SampleRateCondition, "forward", lambda *a: pytest.fail("condition ran on its own"))
    assert (fused.decode(z, sr) - want).abs().max().item() <= TOL
    state, parts = fused.new_stream_state(2), []
    for a, b in ((0, 1), (1, 4)):
        audio, state = fused.decode_chunk(z[..., a:b], state, sr)
        parts.append(audio)
    assert (torch.cat(parts, -1) - want).abs().max().item() <= TOL


def test_the_last_tanh_runs_again_when_its_conv_stops_applying_it():
    vae = AudioVAE(AudioVAEConfig.from_dict(REALISH), triton_kernels=True)
    conv, tanh = vae.decoder.model[-2], vae.decoder.model[-1]
    assert conv.tanh_after and tanh.deferred
    conv.tanh_after = False
    x = torch.randn(3)
    assert not tanh.deferred and torch.equal(tanh(x), torch.tanh(x))


def test_only_depthwise_units_are_fused():
    cfg = dict(REALISH, depthwise=False, decoder_dim=16, decoder_rates=[2, 2], encoder_rates=[2, 2])
    vae = AudioVAE(AudioVAEConfig.from_dict(cfg), triton_kernels=True)
    assert not any(getattr(m, "fused", False) for m in vae.modules())


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_decoder_at_a_lower_precision_is_close_to_fp32(precision):
    """`set_decode_precision`: the kernels and the PyTorch layers in bf16 / fp16 (weights, activations,
    stream state) against the fp32 decoder, one-shot and streamed; the audio comes back in fp32."""
    plain = _randomize(AudioVAE(AudioVAEConfig.from_dict(REALISH)), seed=1).eval().to(DEV)
    z = torch.randn(2, 8, 5, generator=torch.Generator().manual_seed(11)).to(DEV)
    want = plain.decode(z)
    tol = {"bf16": 2e-2, "fp16": 3e-3}[precision] * want.abs().max().item()
    for kernels in (False, True):
        low = _randomize(AudioVAE(AudioVAEConfig.from_dict(REALISH), triton_kernels=kernels), seed=1).eval().to(DEV)
        low.set_decode_precision(precision)
        assert low.decode_dtype == {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
        assert low.encoder.block[0].weight.dtype == torch.float32  # the encoder stays as it was
        one_shot = low.decode(z)
        assert one_shot.dtype == torch.float32
        err = (one_shot - want).abs().max().item()
        assert 0 < err <= tol, (kernels, err, tol)
        state, parts = low.new_stream_state(2), []
        for a, b in ((0, 1), (1, 2), (2, 5)):
            assert all(s.dtype == low.decode_dtype for s in state)
            audio, state = low.decode_chunk(z[..., a:b], state)
            parts.append(audio)
        # Streamed in chunks, the same decoder gives its one-shot audio (the state carries every frame).
        same = 1e-6 if DEV.type == "cpu" else 1e-2  # a GPU picks conv kernels per length
        assert (torch.cat(parts, -1) - one_shot).abs().max().item() <= same * want.abs().max().item(), kernels


def test_decode_precision_is_set_once_and_state_must_match_it():
    vae = AudioVAE(AudioVAEConfig.from_dict(REALISH))
    with pytest.raises(ValueError, match="fp8"):
        vae.set_decode_precision("fp8")
    fp32_state = vae.new_stream_state(1)
    vae.set_decode_precision("bf16").set_decode_precision("bf16")  # the same again is no change
    with pytest.raises(ValueError, match="already"):
        vae.set_decode_precision("fp16")
    with pytest.raises(ValueError, match="stream state tensor 0 is torch.float32"):
        vae.decode_chunk(torch.zeros(1, 8, 1), fp32_state)


def test_a_deferred_snake_still_runs_when_polyphase_is_turned_off():
    """The snakes before the upsampling convs are deferred to them; the transposed conv's plain path
    applies them too."""
    plain = _randomize(AudioVAE(AudioVAEConfig.from_dict(REALISH)), seed=1).eval().to(DEV)
    fused = _randomize(AudioVAE(AudioVAEConfig.from_dict(REALISH), triton_kernels=True), seed=1).eval().to(DEV)
    for m in fused.modules():
        if isinstance(m, CausalConvTranspose1d):
            m.polyphase = False
    z = torch.randn(2, 8, 3, generator=torch.Generator().manual_seed(4)).to(DEV)
    want = plain.decode(z)
    assert (fused.decode(z) - want).abs().max().item() <= TOL * max(1.0, want.abs().max().item())
