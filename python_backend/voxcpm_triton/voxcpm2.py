"""The offline API shared by the engine, the tests and the benchmarks (its loading: loading.py).

    m = VoxCPM2.from_pretrained(path, device="cpu", dtype="float32")
    lat = m.generate_latents("Hello.", seed=1)   # [steps, P, D]
    wav = m.decode(lat)                          # float32 at m.sample_rate

Generation here is single-request with a contiguous KV cache; the engine runs
the same `VoxCPM2Model.prefill` / `decode_step` over a paged cache.
"""

from __future__ import annotations


import numpy as np
import torch
import torch.nn.functional as F

from . import checks
from .audio.patches import encode_patches
from .checks import (DEFAULT_CFG_VALUE, DEFAULT_MIN_LENGTH, DEFAULT_TIMESTEPS, blank, check_waveform, clean_text,
                     default_max_len, resample)
from .formats.checkpoint import load_model_weights, meta_model
from .formats.checkpoint_layout import checkpoint_files
from .formats.text_normalize import normalize_target
from .formats.tokenizer import TextTokenizer
from .loading import load_audio_vae, resolve_attention, resolve_device, resolve_dtype
from .lora_adapters import AdapterSet
from .model.audio_vae import AudioVAE, patch_frames
from .model.config import VoxCPM2Config
from .model.local_modules import CfmSchedule
from .model.lora import linear_shapes
from .model.minicpm import LongRoPE, fuse_projections
from .model.network import VoxCPM2Model
from .model.noise import noise_for_steps
from .model.precision import quantize_model_fp8, resolve_precision
from .model.prompt import Prompt, build_prompt


class ContiguousKVCache:
    """Batch-1 KV cache for one LM: all layers, positions 0..max_len-1."""

    def __init__(self, n_layers, n_kv_heads, head_dim, max_len, dtype, device):
        self.k = torch.zeros(n_layers, 1, max_len, n_kv_heads, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.length = 0

    def __call__(self, layer, q, k, v):
        start, n = self.length, q.size(1)
        self.k[layer, :, start:start + n] = k
        self.v[layer, :, start:start + n] = v
        keys = self.k[layer, :, :start + n].transpose(1, 2)
        vals = self.v[layer, :, :start + n].transpose(1, 2)
        # Prefill starts at 0 (plain causal); decode adds one token that sees everything.
        assert start == 0 or n == 1
        out = F.scaled_dot_product_attention(q.transpose(1, 2), keys, vals, is_causal=n > 1, enable_gqa=True)
        return out.transpose(1, 2)

    def advance(self, n: int):
        self.length += n


class VoxCPM2:
    def __init__(self, cfg: VoxCPM2Config, model: VoxCPM2Model, vae: AudioVAE, tokenizer: TextTokenizer,
                 device: torch.device, dtype: torch.dtype, precision: str = "bf16"):
        self.cfg, self.model, self.vae, self.tokenizer = cfg, model, vae, tokenizer
        self.device, self.dtype, self.precision = device, dtype, precision
        # The backends the network was built with (`from_pretrained`); the engine follows them.
        self.attention, self.compiled = model.attention, model.compiled
        self.patch_size, self.feat_dim = cfg.patch_size, cfg.feat_dim
        self.loras: AdapterSet | None = None  # LoRA adapters (from_pretrained's lora_dir)

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_pretrained(cls, path: str, device: str | None = None, dtype: str | None = None,
                        attention: str = "auto", compile: bool = False, precision: str = "bf16",
                        lora_dir: str | None = None, max_loras: int | None = None,
                        max_lora_rank: int | None = None, reserve_lora_targets: str | None = None,
                        lora_names: list | None = None, vae: AudioVAE | None = None) -> "VoxCPM2":
        """attention: the Triton kernels' pair (LocDiT/LocEnc attention here, paged decode attention in
        the engine) or PyTorch's: "auto" (Triton on CUDA where `kernels._triton.available()`, else
        PyTorch), "triton" (an error where they cannot run), "torch". compile (CUDA only):
        torch.compile what a decode step runs (`VoxCPM2Model`), ahead of the engine's graph capture.
        precision (`model.precision`): "bf16", the linear weights in `dtype`; or "fp8", e4m3 weights with
        per-channel scales and per-token activation scales (a CUDA GPU of compute capability >= 8.9,
        dtype bfloat16; the VAE stays fp32). All three are fixed here, for this object's life
        (`self.attention`, `self.compiled`, `self.precision`).

        lora_dir: a directory of LoRA adapters in the official format, one subfolder each (its name is
        the adapter's: `generate_latents(..., lora=NAME)`), loaded into `self.loras`
        (`lora_adapters.AdapterSet`); a broken one is logged and left out (`self.loras.errors`).
        max_loras, max_lora_rank: the slot tables' size (default: what the adapters found need);
        reserve_lora_targets: None, or what the tables also cover, for adapters added later (a
        server): "default", the official default targets; "all", every layer an adapter may target.
        lora_names: only these adapters of lora_dir, in this order (default: all, by name).

        vae: this checkpoint's AudioVAE, already built (`load_audio_vae` with decoding backends, as the
        served decoder uses it); default: loaded here, plain."""
        files = checkpoint_files(path)
        cfg = VoxCPM2Config.from_file(files["config"])
        dev = resolve_device(device)
        dt = resolve_dtype(dtype, dev)
        attention = resolve_attention(attention, dev)
        precision = resolve_precision(precision, dev, dt)
        if compile and dev.type != "cuda":
            raise ValueError(f"compile=True needs a CUDA device (device is {dev})")
        # Built on the meta device: a 2B-parameter model is not randomly initialised first.
        model = meta_model(cfg, attention=attention, compile=compile).to_empty(device=dev).to(dt)
        load_model_weights(model, files["model"])
        model.eval().requires_grad_(False)
        fuse_projections(model)  # q/k/v and gate/up as single GEMMs, under the official names
        linears = linear_shapes(model)  # what adapters are checked against, before any precision swap
        if precision == "fp8":  # before anything is compiled: the compiled code sees the e4m3 weights
            quantize_model_fp8(model)
        for m in model.modules():  # RoPE tables are plain fp32 attributes, which .to() leaves alone
            if isinstance(m, LongRoPE):
                m.to_device_(dev)
        if vae is None:
            _, vae = load_audio_vae(path, dev)  # the VAE stays fp32
        tokenizer = TextTokenizer.from_dir(path)
        vox = cls(cfg, model, vae, tokenizer, dev, dt, precision)
        if lora_dir:
            vox.loras = AdapterSet.load(lora_dir, linears, dt, dev, max_loras, max_lora_rank, reserve_lora_targets,
                                        only=lora_names)
        return vox

    @property
    def sample_rate(self) -> int:
        return self.vae.out_sample_rate

    @property
    def encode_sample_rate(self) -> int:
        return self.vae.sample_rate

    @property
    def patch_seconds(self) -> float:
        """The audio one generated patch decodes to."""
        return self.patch_size * self.vae.chunk_size / self.vae.sample_rate

    # ------------------------------------------------------------------ prompts
    @torch.inference_mode()
    def encode_audio(self, audio, sample_rate, pad: str, name: str = "audio") -> torch.Tensor:
        """Waveform -> latent patches [n, P, D]; padded ('left' or 'right') to whole patches."""
        wav = resample(check_waveform(audio, sample_rate, name), int(sample_rate), self.encode_sample_rate)
        return encode_patches(self.vae, self.patch_size, [wav], [pad])[0]

    def prepare_prompt(self, text: str, prompt_text=None, prompt_audio=None, prompt_sample_rate=None,
                       reference_audio=None, reference_sample_rate=None, normalize: bool = False) -> Prompt:
        """normalize: numbers, dates, currencies, units... in `text` (not `prompt_text`) written out
        as words first, as the reference's `generate(normalize=True)` (`formats.text_normalize`)."""
        for name, value in (("text", text), ("prompt_text", prompt_text)):
            if value is not None and not isinstance(value, str):
                raise TypeError(f"{name} must be a str, got {type(value).__name__}")
            if isinstance(value, str):
                try:
                    value.encode("utf-8")
                except UnicodeEncodeError as e:  # a lone surrogate: no text, and the tokenizer's TypeError hid it
                    raise ValueError(f"{name} is not valid text: a lone surrogate at character {e.start}") from None
        if not isinstance(normalize, bool):
            raise TypeError(f"normalize must be True or False, got {normalize!r}")
        text = clean_text(text)
        if blank(text):
            raise ValueError("text is empty")
        if normalize:
            text = normalize_target(text)
        if (prompt_audio is None) != (prompt_text is None):
            raise ValueError("prompt_audio and prompt_text must be given together")
        if prompt_text is not None and not isinstance(prompt_text, str):
            raise TypeError(f"prompt_text must be a str, got {type(prompt_text).__name__}")
        ref = prm = None
        if reference_audio is not None:
            ref = self.encode_audio(reference_audio, reference_sample_rate, "right", "reference_audio")
        if prompt_audio is not None:
            prm = self.encode_audio(prompt_audio, prompt_sample_rate, "left", "prompt_audio")
        full_text = (prompt_text + text) if prm is not None else text
        prompt = build_prompt(self.tokenizer(full_text), len(self.tokenizer(text)), ref, prm,
                              self.patch_size, self.feat_dim)
        checks.context_room(len(prompt), self.cfg.max_length)  # raises where the prompt leaves no room
        return prompt

    # ------------------------------------------------------------------ generation
    @torch.inference_mode()
    def prefill(self, prompt: Prompt, capacity: int, lora: str | None = None):
        """Run both LMs over the prompt into fresh batch-1 caches of `capacity` positions, with LoRA
        adapter `lora` (a name in `self.loras`; None: the base model).

        -> (lm_hidden [1, H], residual_hidden [1, H], base KV cache, residual KV cache)."""
        dev, dt = self.device, self.dtype
        lm, res = self.cfg.lm_config, self.cfg.residual_lm()
        base_kv = ContiguousKVCache(lm.num_hidden_layers, lm.num_key_value_heads, lm.head_dim, capacity, dt, dev)
        res_kv = ContiguousKVCache(res.num_hidden_layers, res.num_key_value_heads, res.head_dim, capacity, dt, dev)
        T = len(prompt)
        lm_h, res_h = self.model.prefill(
            prompt.tokens[None].to(dev), prompt.text_mask[None].to(dev), prompt.audio_mask[None].to(dev),
            prompt.feats[None].to(dev), torch.arange(T, device=dev)[None], torch.tensor([T - 1], device=dev),
            base_kv, res_kv, lora=self._lora(lora, single=True))
        base_kv.advance(T)
        res_kv.advance(T)
        return lm_h, res_h, base_kv, res_kv

    @torch.inference_mode()
    def generate_latents(self, text, prompt_text=None, prompt_audio=None, prompt_sample_rate=None,
                         reference_audio=None, reference_sample_rate=None, min_len=DEFAULT_MIN_LENGTH,
                         max_len=None, cfg_value=DEFAULT_CFG_VALUE, inference_timesteps=DEFAULT_TIMESTEPS, seed=None, noise=None,
                         prompt: Prompt | None = None, retry_badcase: bool = False,
                         normalize: bool = False, lora: str | None = None) -> torch.Tensor:
        """Generated latent patches [steps, P, D] (the prompt's own patches excluded).

        lora: the name of a LoRA adapter loaded from `from_pretrained`'s lora_dir (None or "": the base
        model).

        normalize (off, as in the reference): `text` normalised first (see `prepare_prompt`).

        retry_badcase (off here, as in the reference's VoxCPM2Model; `generate` turns it on, as
        VoxCPM.generate does): a result of >= 6 patches per target token is made again, up to
        3 tries in all (`checks.RETRY_MAX_TIMES`), the last kept. Try a uses the noise of seed
        `checks.retry_seed(seed, a)` (seed + a), or a fresh seed each when `seed` is None. With
        explicit `noise` there is nothing new to draw: no retry."""
        if not isinstance(retry_badcase, bool):
            raise TypeError(f"retry_badcase must be True or False, got {retry_badcase!r}")
        lora = lora or None
        self._lora(lora)  # an unknown adapter is an error before any work
        if prompt is None:
            prompt = self.prepare_prompt(text, prompt_text, prompt_audio, prompt_sample_rate,
                                         reference_audio, reference_sample_rate, normalize)
        max_len_default = max_len is None
        capacity = checks.context_room(len(prompt), self.cfg.max_length, min_len)
        if max_len_default:
            max_len = default_max_len(prompt.n_target_tokens, capacity)
        checks.check_generation(min_len, max_len, cfg_value, inference_timesteps,
                                capacity=capacity, max_len_default=max_len_default)
        shape = (self.feat_dim, self.patch_size)
        if noise is not None:
            noise = torch.as_tensor(noise)
            if noise.dim() != 3 or tuple(noise.shape[1:]) != shape or noise.size(0) < max_len:
                raise ValueError(f"noise must be [>= {max_len}, {shape[0]}, {shape[1]}], got {list(noise.shape)}")
            if not torch.isfinite(noise).all():
                raise ValueError("noise holds inf or NaN values")
            return self._generate_once(prompt, min_len, max_len, cfg_value, inference_timesteps, noise, lora)
        if seed is not None:
            seed = checks.check_seed(seed)
        tries = checks.RETRY_MAX_TIMES if retry_badcase and checks.can_retry(min_len, prompt.n_target_tokens) else 1
        for attempt in range(tries):
            s = checks.retry_seed(seed, attempt) if seed is not None else checks.draw_seed()
            out = self._generate_once(prompt, min_len, max_len, cfg_value, inference_timesteps,
                                      noise_for_steps(s, max_len, shape), lora)
            if not checks.is_badcase(out.size(0), prompt.n_target_tokens):
                break
        return out

    def _generate_once(self, prompt: Prompt, min_len, max_len, cfg_value, inference_timesteps, noise, lora=None):
        """One try: patches until the stop head fires past min_len, or max_len of them."""
        m, dev, dt = self.model, self.device, self.dtype
        T = len(prompt)
        lm_h, res_h, base_kv, res_kv = self.prefill(prompt, T + max_len, lora)
        adapter = self._lora(lora)
        prev = prompt.feats[-1:].to(dev, dt)  # CFM condition: the last prompt position's patch
        schedule = CfmSchedule([int(inference_timesteps)], dt, dev)
        cfg_t = torch.tensor([float(cfg_value)], dtype=torch.float32, device=dev)  # the exact scale, any dtype
        patches = []
        for i in range(max_len):
            out = m.decode_step(lm_h, res_h, prev, noise[i:i + 1].to(dev), schedule, cfg_t,
                                torch.tensor([T + i], device=dev), base_kv, res_kv, lora=adapter)
            base_kv.advance(1)
            res_kv.advance(1)
            patches.append(out.patch)
            if i > min_len and bool(out.stop[0]):
                break
            lm_h, res_h, prev = out.lm_hidden, out.residual_hidden, out.patch
        return torch.cat(patches).float().cpu()

    def _lora(self, name: str | None, single: bool = False):
        """The network's `lora` argument for adapter `name`: None for the base model, else a
        `LoraBatch` of one row. ValueError for an unknown name."""
        if name is None:
            return None
        if not isinstance(name, str):
            raise TypeError(f"lora must be a str (an adapter's name), got {type(name).__name__}")
        if self.loras is None:
            raise ValueError(f"LoRA adapter {name!r} requested but no adapters are loaded "
                             "(from_pretrained's lora_dir)")
        return self.loras.batch([self.loras.slot(name)], single)

    # ------------------------------------------------------------------ audio
    @torch.inference_mode()
    def decode(self, latents: torch.Tensor, context: torch.Tensor | None = None) -> np.ndarray:
        """Latent patches [steps, P, D] -> mono float32 waveform at `sample_rate`.

        `context` (the prompt's trailing patches in continuation modes) primes the
        causal decoder; its audio is dropped, as the reference does.
        """
        shape = (self.patch_size, self.feat_dim)
        lat = torch.as_tensor(latents).float()
        if lat.dim() != 3 or tuple(lat.shape[1:]) != shape or lat.size(0) == 0:
            raise ValueError(f"latents must be [steps >= 1, {shape[0]}, {shape[1]}], got {list(lat.shape)}")
        if not torch.isfinite(lat).all():
            raise ValueError("latents hold inf or NaN values")
        n_ctx = 0
        if context is not None and len(context):
            ctx = torch.as_tensor(context).float()
            if ctx.dim() != 3 or tuple(ctx.shape[1:]) != shape or not torch.isfinite(ctx).all():
                raise ValueError(f"context must be finite [steps, {shape[0]}, {shape[1]}], got {list(ctx.shape)}")
            n_ctx = ctx.size(0)
            lat = torch.cat([ctx, lat])
        z = patch_frames(lat).to(self.device)
        wav = self.vae.decode(z)[0, 0]
        return wav[n_ctx * self.patch_size * self.vae.decode_chunk_size:].float().cpu().numpy()

    def generate(self, text: str, retry_badcase: bool = True, **kwargs) -> np.ndarray:
        """Text -> waveform, in one call (prompt context handled). retry_badcase is on, as in the
        reference's VoxCPM.generate (see generate_latents); normalize=True normalises `text` first
        (off by default, as there)."""
        names = ("prompt_text", "prompt_audio", "prompt_sample_rate", "reference_audio", "reference_sample_rate",
                 "normalize")
        prompt = self.prepare_prompt(text, **{k: kwargs.pop(k) for k in names if k in kwargs})
        lat = self.generate_latents(text, prompt=prompt, retry_badcase=retry_badcase, **kwargs)
        return self.decode(lat, context=prompt.context)

