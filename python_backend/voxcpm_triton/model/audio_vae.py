"""VoxCPM2 AudioVAE (V2): causal conv encoder/decoder with streaming decode.

Plain PyTorch re-implementation of ``voxcpm.modules.audiovae.audio_vae_v2``.
Parameter names and shapes follow the official checkpoint layout, except that
convolutions keep one plain ``weight`` instead of weight-norm's ``weight_g`` /
``weight_v`` pair: the norm is folded once at load time instead of being
recomputed on every forward.

The decoder is causal (left padding only), so it can decode latents chunk by
chunk. The streaming state is a list of plain tensors (the last few input
frames of every convolution that looks back), so the serving side can keep one
state per stream id and batch streams along dim 0 (see vae_streams.py).

Everything here runs in fp32, even when the LM runs in bf16; the decoder alone can be cast to
bf16 or fp16 (`set_decode_precision`, opt-in): it then takes and keeps its latents and stream state
in that dtype and still returns fp32 audio.
"""

from __future__ import annotations

import bisect
import math
from typing import Mapping, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import COND_TYPES, AudioVAEConfig

__all__ = [
    "AudioVAEConfig",
    "AudioVAE",
    "StreamState",
    "vae_state_dict_official",
    "COND_TYPES",
    "DECODE_PRECISIONS",
]

DECODE_PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

# One tensor [B, C_i, ctx_i] per look-back convolution of the decoder, in
# execution order.
StreamState = list




# --------------------------------------------------------------------------- #
# Layers. Every layer takes (x, st=None): st is the streaming cursor, None for
# one-shot calls (zero left padding).
# --------------------------------------------------------------------------- #


class _Stream:
    """Hands each look-back layer its saved context, in execution order, and
    collects the context for the next chunk."""

    __slots__ = ("prev", "next", "i")

    def __init__(self, prev: Sequence[Tensor]):
        self.prev = prev
        self.next: list = []
        self.i = 0

    def take(self, x: Tensor, ctx: int) -> Tensor:
        """The saved `ctx` frames that go in front of `x`; the caller `keep`s the new ones."""
        if self.i >= len(self.prev):
            raise ValueError(f"stream state has {len(self.prev)} tensors, the decoder needs more")
        prev = self.prev[self.i]
        if prev.shape != (x.shape[0], x.shape[1], ctx):
            raise ValueError(
                f"stream state tensor {self.i} has shape {tuple(prev.shape)}, expected "
                f"{(x.shape[0], x.shape[1], ctx)}"
            )
        if prev.dtype != x.dtype:
            raise ValueError(f"stream state tensor {self.i} is {prev.dtype}, the decoder runs in {x.dtype}")
        self.i += 1
        return prev

    def keep(self, tail: Tensor) -> None:
        self.next.append(tail)

    def extend(self, x: Tensor, ctx: int) -> Tensor:
        full = torch.cat((self.take(x, ctx), x), dim=-1)
        # contiguous(): a copy, so the state does not pin the whole activation.
        self.keep(full[..., -ctx:].contiguous())
        return full


def snake(x: Tensor, alpha: Tensor) -> Tensor:
    # x + sin^2(alpha*x)/alpha; the 1e-9 keeps alpha == 0 finite. Same
    # expression order as the reference so results match to rounding.
    return x + (alpha + 1e-9).reciprocal() * torch.sin(alpha * x).pow(2)


class Snake1d(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, channels, 1))
        self.fn = snake  # compile_snakes swaps in the fused kernel
        self.deferred = False  # the next layer applies it (`with_lookback`, AudioVAE(triton_kernels=True))

    def forward(self, x: Tensor, st: Optional[_Stream] = None) -> Tensor:
        return x if self.deferred else self.fn(x, self.alpha)


def through_lookback(x: Tensor, ctx: int, st: Optional[_Stream], run) -> Tensor:
    """run(prev) -> (out, tail), where prev is the `ctx` saved frames that go in front of x (the
    stream's, or zeros one-shot) and tail the ones to save for the next chunk (kept by the stream)."""
    prev = x.new_zeros(x.shape[0], x.shape[1], ctx) if st is None else st.take(x, ctx)
    out, tail = run(prev)
    if st is not None:
        st.keep(tail)
    return out


def with_lookback(x: Tensor, ctx: int, st: Optional[_Stream], pre_snake: Optional[Snake1d] = None,
                  affine: Optional[tuple] = None, channels_last: bool = False, row_align: int = 1) -> Tensor:
    """x with the `ctx` look-back frames of the conv it feeds in front: the stream's saved ones
    (the new ones kept for the next chunk), or zeros one-shot. pre_snake (the Triton path): the
    snake before the conv, deferred to here and applied in the same pass (`kernels.vae.snake_extend`);
    affine: the sample-rate condition before that snake, (scale, shift), applied in that pass too;
    channels_last: that pass writes the result channels-last (for a conv whose weight is, and `unit_cl`);
    row_align: that pass's rows padded to a multiple of this (for a Triton kernel that reads it)."""
    if pre_snake is None:
        assert affine is None, "the sample-rate condition is deferred only to a deferred snake"
        if not ctx:
            return x
        return F.pad(x, (ctx, 0)) if st is None else st.extend(x, ctx)
    from ..kernels.vae import snake_extend

    return through_lookback(x, ctx, st, lambda prev: snake_extend(prev, x, pre_snake.alpha, affine, channels_last,
                                                                  row_align))


class Tanh(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv: Optional["CausalConv1d"] = None  # the conv before it, which applies it while its `tanh_after`

    @property
    def deferred(self) -> bool:
        return self.conv is not None and self.conv.tanh_after

    def forward(self, x: Tensor, st: Optional[_Stream] = None) -> Tensor:
        return x if self.deferred else torch.tanh(x)


class CausalConv1d(nn.Module):
    """Conv1d padded on the left only (``left_pad`` frames).

    ``weight`` is the folded weight-norm weight (g * v / ||v||)."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        *,
        stride: int = 1,
        dilation: int = 1,
        groups: int = 1,
        bias: bool = True,
        left_pad: int = 0,
    ):
        super().__init__()
        self.in_channels, self.out_channels = in_channels, out_channels
        self.stride, self.dilation, self.groups = stride, dilation, groups
        self.left_pad = left_pad
        self.weight = nn.Parameter(torch.randn(out_channels, in_channels // groups, kernel_size) * 0.02)
        self.bias = nn.Parameter(torch.zeros(out_channels)) if bias else None
        self.pre_snake: Optional[Snake1d] = None  # see with_lookback
        self.tanh_after = False  # the Triton path: this conv (to one channel) and the Tanh after it, one kernel

    def padded(self, x: Tensor, st: Optional[_Stream] = None) -> Tensor:
        """x with its look-back frames in front: the stream's saved ones, or zeros (fresh stream
        state is all zeros, i.e. exactly this zero padding)."""
        return with_lookback(x, self.left_pad, st, self.pre_snake)

    def forward(self, x: Tensor, st: Optional[_Stream] = None) -> Tensor:
        if self.tanh_after:
            from ..kernels.vae import conv_tanh

            return conv_tanh(self.padded(x, st), self.weight, self.bias)
        return F.conv1d(self.padded(x, st), self.weight, self.bias, self.stride, 0, self.dilation, self.groups)


def _version(t: Tensor) -> Optional[int]:
    try:
        return t._version
    except RuntimeError:  # an inference tensor (loaded under inference_mode) keeps no version count
        return None


# Input channels from which an upsampling conv's polyphase form runs channels-last (`phase_weight`).
POLYPHASE_CHANNELS_LAST_FROM = 512


class CausalConvTranspose1d(nn.Module):
    """Upsampling ConvTranspose1d (kernel 2*stride) with the right tail trimmed
    so T input frames give exactly T*stride output samples."""

    def __init__(self, in_channels: int, out_channels: int, stride: int):
        super().__init__()
        kernel = 2 * stride
        self.in_channels, self.out_channels, self.stride = in_channels, out_channels, stride
        # Reference trims 2*ceil(s/2) - s%2 samples, which equals s for every s.
        self.trim = stride
        # Input frames older than the chunk whose taps still reach its outputs.
        self.ctx = (kernel - 1) // stride
        assert self.ctx * stride == self.trim  # one frame of look-back, trimmed like the right tail
        self.weight = nn.Parameter(torch.randn(in_channels, out_channels, kernel) * 0.02)
        self.bias = nn.Parameter(torch.zeros(out_channels))
        self.polyphase = False  # as a 2-tap conv + `kernels.vae.phase_interleave` (AudioVAE(triton_kernels=True))
        self.pre_snake: Optional[Snake1d] = None  # polyphase only, see with_lookback
        self._phase_w: tuple = (None, None)

    def phase_weight(self) -> Tensor:
        """The polyphase form's weight [C_out * s, C_in, 2]: row c * s + j holds the taps that make
        sample t * s + j, from frames t - 1 (weight tap j + s) and t (tap j). Built once per weight.

        Wide layers get it channels-last ([rows, 2, C_in] in memory): cuDNN then runs its GEMM
        kernels on it as it is, where a row-major weight is transposed on every call (the first
        layer's is large). Narrow layers run faster row-major: their activations, not the weight,
        are what channels-last would transpose; `POLYPHASE_CHANNELS_LAST_FROM` input channels is
        where channels-last starts to win (benchmarks/kernel_vae_polyphase.py, vae_pieces.py)."""
        key = (self.weight.device, self.weight.data_ptr(), _version(self.weight), self.channels_last)
        if self._phase_w[0] != key:
            s, w = self.stride, self.weight.detach().permute(1, 2, 0)  # [C_out, 2s, C_in]
            taps = torch.stack((w[:, s:], w[:, :s]), dim=2)  # [C_out, s, 2, C_in]
            rows = taps.reshape(self.out_channels * s, 2, self.in_channels).transpose(1, 2)
            self._phase_w = (key, rows if self.channels_last else rows.contiguous())
        return self._phase_w[1]

    @property
    def channels_last(self) -> bool:
        """Whether the polyphase form runs channels-last (weight and input: `phase_weight`)."""
        return self.in_channels >= POLYPHASE_CHANNELS_LAST_FROM

    def forward(self, x: Tensor, st: Optional[_Stream] = None, affine: Optional[tuple] = None,
                out_channels_last: bool = False) -> Tensor:
        """affine: the sample-rate condition's (scale, shift), applied before the deferred snake
        (polyphase only: `DecoderBlock.takes_condition`); out_channels_last (polyphase only): the output
        laid out [B, T, C] in memory, for residual units that run so (`DecoderBlock.units_channels_last`)."""
        if self.polyphase:
            from ..kernels.vae import phase_interleave

            # Frame t's samples need frames t - 1 and t: one frame of look-back (zeros when one-shot).
            x = with_lookback(x, self.ctx, st, self.pre_snake, affine, self.channels_last)
            # As conv2d over a [B, C, 1, T] view: conv1d makes a 3-D input contiguous first, which would
            # undo a channels-last one (and cuDNN would then copy it back to channels-last).
            y = F.conv2d(x.unsqueeze(2), self.phase_weight().unsqueeze(2)).squeeze(2)
            return phase_interleave(y, self.bias, self.stride, out_channels_last)
        assert affine is None, "the sample-rate condition is deferred only to the polyphase form"
        assert not out_channels_last, "a channels-last output comes only from the polyphase form"
        if self.pre_snake is not None:  # polyphase turned off after the snake was deferred to it
            x = snake(x, self.pre_snake.alpha)
        if st is None:
            y = F.conv_transpose1d(x, self.weight, self.bias, self.stride)
            return y[..., : y.shape[-1] - self.trim]
        # Recompute the overlap-add of the saved frame, then drop its own (already emitted)
        # samples on the left: stride samples, as many as the right trim, so conv_transpose's
        # symmetric padding drops both and the output stays contiguous (no strided copy later).
        x = st.extend(x, self.ctx)
        return F.conv_transpose1d(x, self.weight, self.bias, self.stride, padding=self.ctx * self.stride)


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int, groups: int):
        super().__init__()
        self.block = nn.ModuleList(
            [
                Snake1d(dim),
                # kernel 7, causal pad (7-1)*dilation
                CausalConv1d(dim, dim, 7, dilation=dilation, groups=groups, left_pad=6 * dilation),
                Snake1d(dim),
                CausalConv1d(dim, dim, 1),
            ]
        )
        self.fused = False  # the unit in Triton kernels (AudioVAE(triton_kernels=True))

    def forward(self, x: Tensor, st: Optional[_Stream] = None, channels_last: bool = False,
                rows_out: bool = True) -> Tensor:
        """channels_last (fused units, `DecoderBlock.units_channels_last`): x is laid out [B, T, C] in
        memory, and so is the output unless rows_out (then contiguous)."""
        if self.fused:
            from ..kernels import vae as kernels

            snake1, conv, snake2, pointwise = self.block
            if channels_last:  # after a look-back pass that writes channels-last: the stream keeps snaked frames
                xp = with_lookback(x, conv.left_pad, st, snake1, channels_last=True)
                return kernels.unit_cl(xp, x, conv.weight, conv.bias, snake2.alpha, pointwise.weight, pointwise.bias,
                                       conv.dilation, rows_out=rows_out)
            x = x.contiguous()
            if kernels.unit_snake_on_load(x.shape[1]):  # the stream keeps the unit's raw input frames
                return through_lookback(x, conv.left_pad, st, lambda prev: kernels.residual_unit(
                    prev, x, snake1.alpha, conv.weight, conv.bias, snake2.alpha, pointwise.weight, pointwise.bias,
                    conv.dilation))
            xp = with_lookback(x, conv.left_pad, st, snake1, row_align=kernels.unit_row_align(x.shape[1]))
            if x.shape[1] <= kernels.UNIT_MAX_CHANNELS:
                return kernels.unit_tail(xp, x, conv.weight, conv.bias, snake2.alpha, pointwise.weight,
                                         pointwise.bias, conv.dilation)
            y = kernels.dwconv_snake(xp, conv.weight, conv.bias, snake2.alpha, conv.dilation)
            return kernels.skip_add(x, F.conv1d(y, pointwise.weight), pointwise.bias)
        assert not channels_last, "only fused units run channels-last"
        y = x
        for layer in self.block:
            y = layer(y, st)
        return x + y


class EncoderBlock(nn.Module):
    def __init__(self, in_dim: int, out_dim: int, stride: int, groups: int):
        super().__init__()
        self.block = nn.ModuleList(
            [
                ResidualUnit(in_dim, 1, groups),
                ResidualUnit(in_dim, 3, groups),
                ResidualUnit(in_dim, 9, groups),
                Snake1d(in_dim),
                # kernel 2s, stride s; reference pad 2*ceil(s/2) - s%2 == s
                CausalConv1d(in_dim, out_dim, 2 * stride, stride=stride, left_pad=stride),
            ]
        )

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.block:
            x = layer(x)
        return x


class Encoder(nn.Module):
    def __init__(self, d_model: int, latent_dim: int, strides: Sequence[int], depthwise: bool):
        super().__init__()
        layers: list = [CausalConv1d(1, d_model, 7, left_pad=6)]
        for stride in strides:
            groups = d_model if depthwise else 1
            layers.append(EncoderBlock(d_model, 2 * d_model, stride, groups))
            d_model *= 2
        self.block = nn.ModuleList(layers)
        self.fc_mu = CausalConv1d(d_model, latent_dim, 3, left_pad=2)
        # Only the mean is used at inference; logvar stays so checkpoints load.
        self.fc_logvar = CausalConv1d(d_model, latent_dim, 3, left_pad=2)

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.block:
            x = layer(x)
        return self.fc_mu(x)


class DecoderBlock(nn.Module):
    def __init__(self, in_dim: int, out_dim: int, stride: int, groups: int):
        super().__init__()
        self.input_channels = in_dim
        self.block = nn.ModuleList(
            [
                Snake1d(in_dim),
                CausalConvTranspose1d(in_dim, out_dim, stride),
                ResidualUnit(out_dim, 1, groups),
                ResidualUnit(out_dim, 3, groups),
                ResidualUnit(out_dim, 9, groups),
            ]
        )

    @property
    def takes_condition(self) -> bool:
        """Whether `forward` can apply a sample-rate condition's affine itself: its first snake is
        deferred to its upsampling conv's polyphase look-back pass, which then applies both."""
        snake1, up = self.block[0], self.block[1]
        return snake1.deferred and up.polyphase and up.pre_snake is snake1

    @property
    def units_channels_last(self) -> bool:
        """Whether the residual units run channels-last (`kernels.vae.unit_cl`, policy read at each forward):
        the upsampling writes its output so, and the last unit writes contiguous rows again."""
        up, units = self.block[1], self.block[2:]
        if not (up.polyphase and all(u.fused for u in units)):
            return False
        from ..kernels import vae as kernels

        return kernels.unit_channels_last(up.out_channels)

    def forward(self, x: Tensor, st: Optional[_Stream] = None, affine: Optional[tuple] = None) -> Tensor:
        """affine: a sample-rate condition's (scale, shift) for x, when `takes_condition`."""
        snake1, up, *units = self.block
        cl = self.units_channels_last
        x = up(snake1(x, st), st, affine, out_channels_last=cl)
        for i, unit in enumerate(units):
            x = unit(x, st, channels_last=cl, rows_out=i == len(units) - 1)
        return x


class SampleRateCondition(nn.Module):
    """Per-channel conditioning on the bucketized output sample rate, applied
    before each decoder block."""

    def __init__(self, dim: int, buckets: int, cond_type: str, cond_dim: int, out_layer: bool):
        super().__init__()
        self.cond_type = cond_type
        out_in = dim
        if cond_type in ("scale_bias", "scale_bias_init"):
            self.scale_embed = nn.Embedding(buckets, dim)
            self.bias_embed = nn.Embedding(buckets, dim)
            nn.init.ones_(self.scale_embed.weight)
            nn.init.zeros_(self.bias_embed.weight)
        elif cond_type == "add":
            self.cond_embed = nn.Embedding(buckets, dim)
            nn.init.zeros_(self.cond_embed.weight)
        else:  # concat
            self.cond_embed = nn.Embedding(buckets, cond_dim)
            out_in = dim + cond_dim
        if out_layer:
            self.out_layer = nn.ModuleList([Snake1d(out_in), CausalConv1d(out_in, dim, 1)])
        else:
            self.out_layer = None

    @property
    def is_affine(self) -> bool:
        """Whether the condition is x * scale + shift per channel alone (`affine`)."""
        return self.cond_type in ("scale_bias", "scale_bias_init") and self.out_layer is None

    def affine(self, sr_idx: Tensor) -> tuple:
        """(scale, shift), each [1 or B, C], of an `is_affine` condition: for a layer that applies it
        in a pass of its own (`DecoderBlock.takes_condition`)."""
        return self.scale_embed(sr_idx), self.bias_embed(sr_idx)

    def forward(self, x: Tensor, sr_idx: Tensor) -> Tensor:
        # sr_idx: [1] (shared) or [B]; embeddings broadcast over time.
        if self.cond_type == "concat":
            c = self.cond_embed(sr_idx).unsqueeze(-1)
            x = torch.cat((x, c.expand(x.shape[0], -1, x.shape[-1])), dim=1)
        elif self.cond_type == "add":
            x = x + self.cond_embed(sr_idx).unsqueeze(-1)
        else:
            x = x * self.scale_embed(sr_idx).unsqueeze(-1) + self.bias_embed(sr_idx).unsqueeze(-1)
        if self.out_layer is not None:
            for layer in self.out_layer:
                x = layer(x)  # kernel-1 conv: no look-back, no stream state
        return x


class Decoder(nn.Module):
    def __init__(self, cfg: AudioVAEConfig):
        super().__init__()
        lat, ch = cfg.latent_dim, cfg.decoder_dim
        if cfg.depthwise:
            layers: list = [
                CausalConv1d(lat, lat, 7, groups=lat, left_pad=6),
                CausalConv1d(lat, ch, 1),
            ]
        else:
            layers = [CausalConv1d(lat, ch, 7, left_pad=6)]
        for i, stride in enumerate(cfg.decoder_rates):
            in_dim, out_dim = ch // 2**i, ch // 2 ** (i + 1)
            layers.append(DecoderBlock(in_dim, out_dim, stride, out_dim if cfg.depthwise else 1))
        layers += [Snake1d(out_dim), CausalConv1d(out_dim, 1, 7, left_pad=6), Tanh()]
        self.model = nn.ModuleList(layers)

        if cfg.sr_bin_boundaries is None:
            self.sr_bin_boundaries = None
            self.sr_cond_model = None
        else:
            # Persistent int32 buffer, as in the official checkpoint.
            self.register_buffer("sr_bin_boundaries", torch.tensor(cfg.sr_bin_boundaries, dtype=torch.int32))
            buckets = len(cfg.sr_bin_boundaries) + 1
            self.sr_cond_model = nn.ModuleList(
                [
                    SampleRateCondition(m.input_channels, buckets, cfg.cond_type, cfg.cond_dim, cfg.cond_out_layer)
                    if isinstance(m, DecoderBlock)
                    else None
                    for m in layers
                ]
            )

    def forward(self, x: Tensor, sr_idx: Optional[Tensor], st: Optional[_Stream] = None) -> Tensor:
        for i, layer in enumerate(self.model):
            cond = self.sr_cond_model[i] if self.sr_cond_model is not None else None
            if cond is not None and cond.is_affine and layer.takes_condition:
                x = layer(x, st, cond.affine(sr_idx))  # in the block's first pass, not two of its own
                continue
            if cond is not None:
                x = cond(x, sr_idx)
            x = layer(x, st)
        return x


# --------------------------------------------------------------------------- #
# AudioVAE
# --------------------------------------------------------------------------- #

_WN_FORMS = (("weight_g", "weight_v"), ("parametrizations.weight.original0", "parametrizations.weight.original1"))
_OPTIONAL_KEYS = ("decoder.sr_bin_boundaries",)


def _conv_weight_keys(module: nn.Module) -> set:
    """State-dict keys of the conv weights the official model weight-normalizes."""
    return {
        (name + "." if name else "") + "weight"
        for name, m in module.named_modules()
        if isinstance(m, (CausalConv1d, CausalConvTranspose1d))
    }


def _fold_weight_norm(g: Tensor, v: Tensor) -> Tensor:
    # torch weight_norm(dim=0): w = g * v / ||v||, norm over all dims but 0.
    v = v.float()
    norm = torch.linalg.vector_norm(v.reshape(v.shape[0], -1), dim=1)
    return v * (g.float() / norm.reshape(g.shape))


class AudioVAE(nn.Module):
    def __init__(self, config: Union[AudioVAEConfig, Mapping, None] = None, triton_kernels: bool = False):
        """triton_kernels (GPU with triton, or triton's CPU interpreter in tests): each depthwise
        residual unit of the decoder in `kernels.vae`'s kernels (first snake with the stream state,
        depthwise conv + bias + second snake, pointwise bias + skip), each upsampling conv in
        its polyphase form (its block's sample-rate condition and first snake in its look-back
        pass), and the last conv with its tanh; non-depthwise residual units keep the PyTorch
        path. The caller checks that the kernels can run (`kernels.vae.available()`)."""
        super().__init__()
        if config is None:
            config = AudioVAEConfig()
        elif isinstance(config, Mapping):
            config = AudioVAEConfig.from_dict(config)
        else:
            config.validate()
        self.config = config
        self.sample_rate = config.sample_rate
        self.out_sample_rate = config.out_sample_rate
        self.latent_dim = config.latent_dim
        self.chunk_size = math.prod(config.encoder_rates)  # input samples per latent frame
        self.decode_chunk_size = math.prod(config.decoder_rates)  # output samples per latent frame

        self.encoder = Encoder(config.encoder_dim, config.latent_dim, config.encoder_rates, config.depthwise)
        self.decoder = Decoder(config)
        self.triton_kernels = bool(triton_kernels)
        for m in self.decoder.modules():
            if isinstance(m, ResidualUnit):
                m.fused = self.triton_kernels and m.block[1].groups == m.block[1].in_channels
            elif isinstance(m, CausalConvTranspose1d):
                m.polyphase = self.triton_kernels
        if self.triton_kernels:  # a snake right before a look-back conv runs in the conv's look-back pass
            for layers in [self.decoder.model] + [m.block for m in self.decoder.model if isinstance(m, DecoderBlock)]:
                for act, conv in zip(layers, layers[1:]):
                    if isinstance(act, Snake1d) and isinstance(conv, (CausalConv1d, CausalConvTranspose1d)) \
                            and (conv.left_pad if isinstance(conv, CausalConv1d) else conv.ctx) > 0:
                        object.__setattr__(conv, "pre_snake", act)  # a reference, not a submodule
                        act.deferred = True
            for conv, act in zip(self.decoder.model, self.decoder.model[1:]):  # the last conv and its tanh
                if isinstance(conv, CausalConv1d) and isinstance(act, Tanh) and conv.out_channels == 1 \
                        and conv.groups == conv.stride == conv.dilation == 1 and conv.bias is not None \
                        and conv.left_pad == conv.weight.shape[-1] - 1:
                    conv.tanh_after = True
                    object.__setattr__(act, "conv", conv)  # a reference, not a submodule
        if config.sr_bin_boundaries is not None:
            idx = bisect.bisect_left(config.sr_bin_boundaries, config.out_sample_rate)
            self.register_buffer("_default_sr_idx", torch.tensor([idx], dtype=torch.long), persistent=False)

        # Look-back convs of the decoder in execution order (the sr condition
        # layers only hold kernel-1 convs, so they never carry state).
        self._stream_layers = [
            m
            for m in self.decoder.model.modules()
            if (isinstance(m, CausalConv1d) and m.left_pad > 0) or isinstance(m, CausalConvTranspose1d)
        ]

    # -- helpers ------------------------------------------------------------

    @property
    def device(self) -> torch.device:
        return self.decoder.model[0].weight.device

    @property
    def decode_dtype(self) -> torch.dtype:
        return self.decoder.model[0].weight.dtype

    def set_decode_precision(self, precision: str) -> "AudioVAE":
        """Cast the decoder's weights (the encoder stays fp32) to `precision`, one of
        DECODE_PRECISIONS; its activations and stream state follow. Once, from the fp32 weights as
        loaded, and before anything holds stream state or CUDA graphs of this decoder (`VAEStreams`)."""
        if precision not in DECODE_PRECISIONS:
            raise ValueError(f"VAE decode precision must be one of {sorted(DECODE_PRECISIONS)}, got {precision!r}")
        dtype = DECODE_PRECISIONS[precision]
        if self.decode_dtype not in (torch.float32, dtype):
            raise ValueError(f"the VAE decoder is already {self.decode_dtype}: cast it once, from fp32")
        self.decoder.to(dtype)
        for m in self.decoder.modules():  # the polyphase weight is rebuilt from the cast weight
            if isinstance(m, CausalConvTranspose1d):
                m._phase_w = (None, None)
        return self

    def _sr_index(self, sr_cond, batch: int, device: torch.device) -> Optional[Tensor]:
        """Bucket index of the output sample rate ([1] or [B]); None without
        sample-rate conditioning (the condition is then ignored)."""
        bounds = self.config.sr_bin_boundaries
        if bounds is None:
            return None
        if sr_cond is None:
            return self._default_sr_idx
        if isinstance(sr_cond, int):
            return torch.tensor([bisect.bisect_left(bounds, sr_cond)], dtype=torch.long, device=device)
        sr = torch.as_tensor(sr_cond, device=device).reshape(-1)
        if sr.numel() not in (1, batch):
            raise ValueError(f"sr_cond has {sr.numel()} entries for a batch of {batch}")
        return torch.bucketize(sr, self.decoder.sr_bin_boundaries.to(sr.dtype))

    def _check_latents(self, z: Tensor) -> Tensor:
        if z.ndim != 3 or z.shape[1] != self.latent_dim:
            raise ValueError(f"latents must be [B, {self.latent_dim}, T], got {tuple(z.shape)}")
        return z.to(self.decode_dtype)

    # -- one-shot -----------------------------------------------------------

    @torch.no_grad()
    def encode(self, audio: Tensor, sample_rate: Optional[int] = None) -> Tensor:
        """audio [B, T] or [B, 1, T] at ``self.sample_rate`` -> mu [B, latent_dim, ceil(T/chunk_size)]."""
        if sample_rate is not None and sample_rate != self.sample_rate:
            raise ValueError(f"encode expects audio at {self.sample_rate} Hz, got {sample_rate}")
        if audio.ndim == 2:
            audio = audio.unsqueeze(1)
        if audio.ndim != 3 or audio.shape[1] != 1:
            raise ValueError(f"audio must be [B, T] or [B, 1, T], got {tuple(audio.shape)}")
        # Right-pad to a whole number of encoder hops, like the reference.
        audio = F.pad(audio.float(), (0, (-audio.shape[-1]) % self.chunk_size))
        return self.encoder(audio)

    @torch.no_grad()
    def decode(self, z: Tensor, sr_cond=None) -> Tensor:
        """z [B, latent_dim, T] -> audio [B, 1, T*decode_chunk_size].

        sr_cond: output sample rate (int, or tensor [1]/[B]); default out_sample_rate."""
        z = self._check_latents(z)
        return self.decoder(z, self._sr_index(sr_cond, z.shape[0], z.device)).float()

    # -- streaming ----------------------------------------------------------

    def stream_state_spec(self) -> list:
        """(channels, frames) of each state tensor, in order."""
        return [
            (m.in_channels, m.ctx if isinstance(m, CausalConvTranspose1d) else m.left_pad) for m in self._stream_layers
        ]

    def new_stream_state(self, batch: int = 1, device=None) -> StreamState:
        """All-zero state: equivalent to the one-shot decode's left zero padding."""
        device = self.device if device is None else device
        return [torch.zeros(batch, c, n, device=device, dtype=self.decode_dtype) for c, n in self.stream_state_spec()]

    @torch.no_grad()
    def decode_chunk(self, z_chunk: Tensor, state: StreamState, sr_cond=None) -> tuple:
        """Decode the next latent frames of B streams.

        z_chunk [B, latent_dim, t], state from new_stream_state / a previous call
        (batch B) -> (audio [B, 1, t*decode_chunk_size], new state). The input
        state is not modified."""
        z = self._check_latents(z_chunk)
        if len(state) != len(self._stream_layers):
            raise ValueError(f"stream state has {len(state)} tensors, expected {len(self._stream_layers)}")
        if z.shape[-1] == 0:
            return z.new_zeros(z.shape[0], 1, 0, dtype=torch.float32), list(state)
        st = _Stream(state)
        audio = self.decoder(z, self._sr_index(sr_cond, z.shape[0], z.device), st)
        return audio.float(), st.next

    def prime(self, state: StreamState, z_context: Tensor, sr_cond=None) -> StreamState:
        """Feed context latents (e.g. the prompt's trailing patches in
        continuation mode) through the stream and drop their audio."""
        return self.decode_chunk(z_context, state, sr_cond)[1]

    # -- checkpoints --------------------------------------------------------

    @classmethod
    def from_state_dict(cls, sd: Mapping, config: Union[AudioVAEConfig, Mapping, None] = None) -> "AudioVAE":
        vae = cls(config)
        vae.load_vae_state_dict(sd)
        return vae.eval()

    def load_vae_state_dict(self, sd: Mapping) -> None:
        """Load an official (weight_g/weight_v, or parametrizations.weight.original0/1)
        or plain-``weight`` state dict. Weight norm is folded here, in fp32.

        Raises ValueError naming every missing / unexpected / mis-shaped tensor."""
        if "state_dict" in sd and isinstance(sd["state_dict"], Mapping):
            sd = sd["state_dict"]
        own = self.state_dict()
        conv_w = _conv_weight_keys(self)
        used: set = set()
        missing, bad, new = [], [], {}

        def shape_ok(name: str, t: Tensor, shape) -> bool:
            if tuple(t.shape) != tuple(shape):
                bad.append(f"{name}: expected shape {tuple(shape)}, got {tuple(t.shape)}")
                return False
            return True

        for key, ref in own.items():
            if key in conv_w:
                base = key[: -len("weight")]
                forms = [(key,)] + [(base + g, base + v) for g, v in _WN_FORMS]
                present = [f for f in forms if any(n in sd for n in f)]
                if not present:
                    missing.append(f"{base}weight_g/{base}weight_v (or {key})")
                    continue
                used.update(n for f in present for n in f if n in sd)
                if len(present) > 1:
                    bad.append(f"{key}: given in more than one form: {[n for f in present for n in f if n in sd]}")
                    continue
                form = present[0]
                absent = [n for n in form if n not in sd]
                if absent:
                    missing.extend(absent)
                    continue
                if len(form) == 1:
                    if shape_ok(key, sd[key], ref.shape):
                        new[key] = sd[key].float()
                    continue
                g_name, v_name = form
                g_shape = (ref.shape[0],) + (1,) * (ref.ndim - 1)
                if shape_ok(v_name, sd[v_name], ref.shape) & shape_ok(g_name, sd[g_name], g_shape):
                    new[key] = _fold_weight_norm(sd[g_name], sd[v_name])
            elif key not in sd:
                if key not in _OPTIONAL_KEYS:
                    missing.append(key)
            else:
                used.add(key)
                t = sd[key]
                if shape_ok(key, t, ref.shape):
                    new[key] = t.float() if t.is_floating_point() else t
        unexpected = sorted(set(sd) - used)

        b_key = "decoder.sr_bin_boundaries"
        if b_key in new and new[b_key].tolist() != self.config.sr_bin_boundaries:
            bad.append(f"{b_key}: checkpoint has {new[b_key].tolist()}, config has {self.config.sr_bin_boundaries}")

        if missing or unexpected or bad:
            parts = []
            if missing:
                parts.append(f"missing tensors: {missing}")
            if unexpected:
                parts.append(f"unexpected tensors: {unexpected}")
            if bad:
                parts.append(f"bad tensors: {bad}")
            raise ValueError("AudioVAE state dict does not match the config: " + "; ".join(parts))
        self.load_state_dict(new, strict=False)  # only optional buffers can be absent here
        for m in self.modules():  # in place: an inference tensor's copy keeps its address and has no version
            if isinstance(m, CausalConvTranspose1d):
                m._phase_w = (None, None)


def vae_state_dict_official(vae: AudioVAE) -> dict:
    """State dict in the official layout: every conv weight w as weight_g =
    ||w|| (per dim-0 slice, shape [out, 1, 1]) and weight_v = w."""
    conv_w = _conv_weight_keys(vae)
    out = {}
    for key, t in vae.state_dict().items():
        t = t.detach().clone()
        if key in conv_w:
            base = key[: -len("weight")]
            w = t.float()
            g = torch.linalg.vector_norm(w.reshape(w.shape[0], -1), dim=1).reshape((w.shape[0],) + (1,) * (w.ndim - 1))
            # An all-zero slice would fold to 0/0; v=1 with g=0 folds to 0.
            v = torch.where(g == 0, torch.ones_like(w), w)
            out[base + "weight_g"] = g
            out[base + "weight_v"] = v
        else:
            out[key] = t
    return out


def patch_frames(patches: Tensor) -> Tensor:
    """Latent patches [n, P, D] -> the frames [1, D, n * P] the VAE decodes."""
    return patches.reshape(-1, patches.shape[-1]).T[None]


def compile_snakes(vae: AudioVAE, warm_up: bool = True) -> AudioVAE:
    """GPU: each decoder snake activation of `vae` as one fused kernel instead of seven elementwise
    passes over the activations (most of the decoder's memory traffic). One dynamic graph serves
    every channel count and length; warm-up compiles it before the first request. Applied once,
    by the loader (`loading.load_audio_vae(compile=True)`), to a VAE on its device."""
    compiled = torch.compile(snake, dynamic=True)

    def fused(x, alpha):
        # A Parameter's shape is static to dynamo, a plain tensor's is not; and strides are
        # guarded, so trimmed (strided) activations are made contiguous: few graphs in all.
        return compiled(x.contiguous(), alpha.detach())

    for m in vae.decoder.modules():
        if isinstance(m, Snake1d):
            m.fn = fused
    if warm_up:
        for batch in (1, 2):
            z = torch.zeros(batch, vae.latent_dim, 4, device=vae.device)
            vae.decode_chunk(z, vae.new_stream_state(batch))
    return vae
