"""VoxCPM2 `config.json`, parsed and validated.

Field names and defaults follow the official config (and the reference's
pydantic models), so a real checkpoint's config loads unchanged. Every value
that would make the model ill-formed is rejected with the field's dotted path.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Mapping, Optional

# The dtype names a config (and the API) may use, as the reference spells them -> torch's name.
DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
          "float16": "float16", "fp16": "float16"}
COND_TYPES = ("scale_bias", "scale_bias_init", "add", "concat")  # the AudioVAE's conditioning


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass
class AudioVAEConfig:
    encoder_dim: int = 128
    encoder_rates: list = field(default_factory=lambda: [2, 5, 8, 8])
    latent_dim: int = 64
    decoder_dim: int = 2048
    decoder_rates: list = field(default_factory=lambda: [8, 6, 5, 2, 2, 2])
    depthwise: bool = True
    sample_rate: int = 16000
    out_sample_rate: int = 48000
    use_noise_block: bool = False
    sr_bin_boundaries: Optional[list] = field(default_factory=lambda: [20000, 30000, 40000])
    cond_type: str = "scale_bias"
    cond_dim: int = 128
    cond_out_layer: bool = False

    def __post_init__(self):
        self.validate()

    @classmethod
    def from_dict(cls, d: Mapping) -> "AudioVAEConfig":
        if not isinstance(d, Mapping):
            raise ValueError(f"AudioVAE config must be a mapping, got {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown AudioVAE config field(s): {unknown}")
        return cls(**dict(d))

    def to_dict(self) -> dict:
        return asdict(self)

    def validate(self) -> None:
        for name in ("encoder_dim", "latent_dim", "decoder_dim", "sample_rate", "out_sample_rate", "cond_dim"):
            v = getattr(self, name)
            if not _is_int(v) or v <= 0:
                raise ValueError(f"AudioVAE config field {name!r} must be a positive int, got {v!r}")
        for name in ("encoder_rates", "decoder_rates"):
            v = getattr(self, name)
            if not isinstance(v, (list, tuple)) or len(v) == 0 or not all(_is_int(r) and r > 0 for r in v):
                raise ValueError(f"AudioVAE config field {name!r} must be a non-empty list of positive ints, got {v!r}")
            setattr(self, name, list(v))
        for name in ("depthwise", "use_noise_block", "cond_out_layer"):
            v = getattr(self, name)
            if not isinstance(v, bool):
                raise ValueError(f"AudioVAE config field {name!r} must be a bool, got {v!r}")
        if self.use_noise_block:
            # The noise block injects torch.randn noise; it is a training-time
            # feature and would make decoding non-deterministic.
            raise ValueError("AudioVAE config field 'use_noise_block'=True is not supported for inference")
        b = self.sr_bin_boundaries
        if b is not None:
            if (
                not isinstance(b, (list, tuple))
                or len(b) == 0
                or not all(_is_int(x) and x > 0 for x in b)
                or any(x >= y for x, y in zip(b, b[1:]))
            ):
                raise ValueError(
                    "AudioVAE config field 'sr_bin_boundaries' must be None or a non-empty, strictly "
                    f"increasing list of positive ints, got {b!r}"
                )
            self.sr_bin_boundaries = list(b)
        if self.cond_type not in COND_TYPES:
            raise ValueError(f"AudioVAE config field 'cond_type' must be one of {COND_TYPES}, got {self.cond_type!r}")
        if self.cond_type == "concat" and not self.cond_out_layer:
            raise ValueError("AudioVAE config field 'cond_out_layer' must be True when cond_type='concat'")
        if self.decoder_dim // 2 ** len(self.decoder_rates) < 1:
            raise ValueError(
                f"AudioVAE config field 'decoder_dim'={self.decoder_dim} is too small: each of the "
                f"{len(self.decoder_rates)} decoder_rates stages halves the channels"
            )


class ConfigError(ValueError):
    pass


def _check(cond: bool, path: str, msg: str):
    if not cond:
        raise ConfigError(f"config.json: {path}: {msg}")


def _from_dict(cls, d: Any, path: str, required: tuple[str, ...] = ()):
    """Build dataclass `cls` from dict `d`, rejecting unknown keys and wrong types."""
    _check(isinstance(d, dict), path, f"expected an object, got {type(d).__name__}")
    names = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - set(names))
    _check(not unknown, path, f"unknown field(s) {unknown}")
    for r in required:
        _check(r in d, f"{path}.{r}", "missing required field")
    kwargs = {}
    for k, v in d.items():
        ftype = str(names[k].type)
        p = f"{path}.{k}"
        if ftype.startswith("int") and v is not None:
            _check(isinstance(v, int) and not isinstance(v, bool), p, f"expected an integer, got {v!r}")
        elif ftype.startswith("float"):
            _check(isinstance(v, (int, float)) and not isinstance(v, bool), p, f"expected a number, got {v!r}")
            v = float(v)
        elif ftype.startswith("bool"):
            _check(isinstance(v, bool), p, f"expected true/false, got {v!r}")
        kwargs[k] = v
    return cls(**kwargs)


@dataclass
class RopeScaling:
    type: str
    long_factor: list
    short_factor: list
    original_max_position_embeddings: int


@dataclass
class LMConfig:
    """MiniCPM4 settings. The residual LM, LocEnc and LocDiT are copies of it with a few fields replaced."""

    bos_token_id: int
    eos_token_id: int
    hidden_size: int
    intermediate_size: int
    max_position_embeddings: int
    num_attention_heads: int
    num_hidden_layers: int
    num_key_value_heads: int
    rms_norm_eps: float
    rope_scaling: Any
    vocab_size: int
    scale_emb: float
    dim_model_base: int
    scale_depth: float
    rope_theta: float
    use_mup: bool = True  # the reference's default
    kv_channels: int | None = None
    no_rope: bool = False

    @property
    def head_dim(self) -> int:
        return self.kv_channels if self.kv_channels else self.hidden_size // self.num_attention_heads

    def derive(self, **changes) -> "LMConfig":
        return dataclasses.replace(self, **changes)


@dataclass
class CfmConfig:
    sigma_min: float = 1e-6
    solver: str = "euler"
    t_scheduler: str = "log-norm"
    training_cfg_rate: float = 0.1
    inference_cfg_rate: float = 1.0
    reg_loss_type: str = "l1"
    ratio_r_neq_t_range: list = field(default_factory=lambda: [0.25, 0.75])
    noise_cond_prob_range: list = field(default_factory=lambda: [0.0, 0.0])
    noise_cond_scale: float = 0.0


@dataclass
class EncoderConfig:
    hidden_dim: int = 1024
    ffn_dim: int = 4096
    num_heads: int = 16
    num_layers: int = 4
    kv_channels: int | None = None


@dataclass
class DiTConfig:
    cfm_config: Any = None
    hidden_dim: int = 1024
    ffn_dim: int = 4096
    num_heads: int = 16
    num_layers: int = 4
    kv_channels: int | None = None
    dit_mean_mode: bool = False


@dataclass
class VoxCPM2Config:
    lm_config: LMConfig
    encoder_config: EncoderConfig
    dit_config: DiTConfig
    audio_vae_config: AudioVAEConfig
    patch_size: int = 4
    feat_dim: int = 64
    residual_lm_num_layers: int = 8
    residual_lm_no_rope: bool = False
    scalar_quantization_latent_dim: int = 512
    scalar_quantization_scale: int = 9
    max_length: int = 8192
    device: str = "cuda"
    dtype: str = "bfloat16"
    architecture: str = "voxcpm2"

    # Sub-model configs, derived the way the reference derives them.
    def residual_lm(self) -> LMConfig:
        return self.lm_config.derive(
            num_hidden_layers=self.residual_lm_num_layers, vocab_size=0, no_rope=self.residual_lm_no_rope
        )

    def local_encoder(self) -> LMConfig:
        e = self.encoder_config
        return self.lm_config.derive(
            hidden_size=e.hidden_dim, intermediate_size=e.ffn_dim, num_attention_heads=e.num_heads,
            num_hidden_layers=e.num_layers, kv_channels=e.kv_channels, vocab_size=0,
        )

    def local_dit(self) -> LMConfig:
        d = self.dit_config
        return self.lm_config.derive(
            hidden_size=d.hidden_dim, intermediate_size=d.ffn_dim, num_attention_heads=d.num_heads,
            num_hidden_layers=d.num_layers, kv_channels=d.kv_channels, vocab_size=0,
        )

    @classmethod
    def from_dict(cls, d: dict) -> "VoxCPM2Config":
        _check(isinstance(d, dict), "<root>", "expected a JSON object")
        d = dict(d)
        for sub in ("lm_config", "encoder_config", "dit_config"):
            _check(sub in d, sub, "missing required field")
            _check(isinstance(d[sub], dict), sub, f"expected an object, got {type(d[sub]).__name__}")
        lm = dict(d.pop("lm_config"))
        _check("rope_scaling" in lm, "lm_config.rope_scaling", "missing required field")
        lm["rope_scaling"] = _from_dict(
            RopeScaling, lm["rope_scaling"], "lm_config.rope_scaling",
            required=("type", "long_factor", "short_factor", "original_max_position_embeddings"),
        )
        lm_required = tuple(f.name for f in dataclasses.fields(LMConfig)
                            if f.default is dataclasses.MISSING)
        lm_cfg = _from_dict(LMConfig, lm, "lm_config", required=lm_required)
        enc = _from_dict(EncoderConfig, d.pop("encoder_config"), "encoder_config")
        dit = dict(d.pop("dit_config"))
        _check("cfm_config" in dit, "dit_config.cfm_config", "missing required field")
        dit["cfm_config"] = _from_dict(CfmConfig, dit["cfm_config"], "dit_config.cfm_config")
        dit_cfg = _from_dict(DiTConfig, dit, "dit_config")
        vae_raw = d.pop("audio_vae_config", None)
        try:
            vae = AudioVAEConfig.from_dict(vae_raw) if vae_raw is not None else AudioVAEConfig()
        except ValueError as e:
            raise ConfigError(f"config.json: audio_vae_config: {e}") from None
        cfg = _from_dict(cls, {**d, "lm_config": lm_cfg, "encoder_config": enc, "dit_config": dit_cfg,
                               "audio_vae_config": vae}, "<root>")
        cfg.validate()
        return cfg

    @classmethod
    def from_file(cls, path: str) -> "VoxCPM2Config":
        try:
            with open(path, encoding="utf-8") as f:
                raw = json.load(f)
        except ValueError as e:  # JSONDecodeError, or an integer past Python's digit limit
            raise ConfigError(f"{path}: not valid JSON: {e}") from None
        return cls.from_dict(raw)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def validate(self):
        lm = self.lm_config
        _check(self.architecture == "voxcpm2", "architecture", f"expected 'voxcpm2', got {self.architecture!r}")
        _check(self.dtype in DTYPES, "dtype", f"must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        for name in ("patch_size", "feat_dim", "residual_lm_num_layers", "scalar_quantization_latent_dim",
                     "scalar_quantization_scale", "max_length"):
            _check(getattr(self, name) > 0, name, f"must be positive, got {getattr(self, name)}")
        _check(self.feat_dim == self.audio_vae_config.latent_dim, "feat_dim",
               f"must equal audio_vae_config.latent_dim ({self.audio_vae_config.latent_dim}), got {self.feat_dim}")
        _check(lm.vocab_size > 104, "lm_config.vocab_size",
               f"must exceed 104 (VoxCPM2's audio marker tokens 101-104), got {lm.vocab_size}")
        _check(lm.rms_norm_eps > 0, "lm_config.rms_norm_eps", "must be positive")
        _check(lm.rope_theta > 0, "lm_config.rope_theta", "must be positive")
        _check(lm.max_position_embeddings >= self.max_length, "lm_config.max_position_embeddings",
               f"must be at least max_length ({self.max_length})")
        rs = lm.rope_scaling
        _check(rs.type in ("longrope",), "lm_config.rope_scaling.type", f"only 'longrope' is supported, got {rs.type!r}")
        _check(rs.original_max_position_embeddings > 0, "lm_config.rope_scaling.original_max_position_embeddings",
               "must be positive")
        scale = lm.max_position_embeddings / rs.original_max_position_embeddings
        _check(1 + math.log(scale) / math.log(max(rs.original_max_position_embeddings, 2)) > 0,
               "lm_config.rope_scaling.original_max_position_embeddings", "gives a non-positive LongRoPE scale")
        subs = [("lm_config", lm), ("residual LM", self.residual_lm()),
                ("encoder_config", self.local_encoder()), ("dit_config", self.local_dit())]
        for path, c in subs:
            for name in ("hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers",
                         "num_key_value_heads"):
                _check(getattr(c, name) > 0, f"{path} {name}", f"must be positive, got {getattr(c, name)}")
            _check(c.num_attention_heads % c.num_key_value_heads == 0, f"{path} num_attention_heads",
                   f"{c.num_attention_heads} is not a multiple of num_key_value_heads {c.num_key_value_heads}")
            _check(c.head_dim > 0 and c.head_dim % 2 == 0, f"{path} kv_channels",
                   f"head dim must be even and positive, got {c.head_dim}")
            if not c.no_rope:
                for fname in ("long_factor", "short_factor"):
                    factors = getattr(rs, fname)
                    _check(isinstance(factors, list) and len(factors) == c.head_dim // 2
                           and all(isinstance(x, (int, float)) and x > 0 for x in factors),
                           f"lm_config.rope_scaling.{fname}",
                           f"needs {c.head_dim // 2} positive numbers for {path} (head dim {c.head_dim})")
        _check(self.dit_config.hidden_dim % 2 == 0, "dit_config.hidden_dim", "must be even (sinusoidal time embedding)")
        _check(not self.dit_config.dit_mean_mode, "dit_config.dit_mean_mode", "mean mode is not supported for inference")
        _check(self.dit_config.cfm_config.solver == "euler", "dit_config.cfm_config.solver",
               f"only 'euler' is supported, got {self.dit_config.cfm_config.solver!r}")
