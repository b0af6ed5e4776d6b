"""The VoxCPM2 network (`VoxCPM2Model`) and its batched prefill / decode step.

Module and parameter names are the reference's, so an official
`model.safetensors` loads with no renaming. The same two functions serve the
offline API (batch 1, contiguous KV cache) and the engine (many requests, paged
KV cache): what differs is only the attention backend they are given.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .config import VoxCPM2Config
from .local_modules import CFMSolver, CfmSchedule, LocalDiT, LocalEncoder
from .lora import LoraBatch, lora_linear
from .minicpm import MiniCPM


class ScalarQuantizer(nn.Module):
    """FSQ bottleneck on the base LM's audio positions: tanh, round to 1/scale, project back."""

    def __init__(self, dim: int, latent_dim: int, scale: int):
        super().__init__()
        self.scale = scale
        self.in_proj = nn.Linear(dim, latent_dim)
        self.out_proj = nn.Linear(latent_dim, dim)

    def forward(self, x):
        h = torch.tanh(self.in_proj(x))
        return self.out_proj(torch.round(h * self.scale) / self.scale)


@dataclass
class StepOutput:
    patch: torch.Tensor  # [B, P, D] the new latent patch
    stop: torch.Tensor  # [B] bool, the stop head's verdict for this step (before the LM step)
    lm_hidden: torch.Tensor  # [B, H] inputs of the next step
    residual_hidden: torch.Tensor  # [B, H]


ATTENTION_BACKENDS = ("torch", "triton")


class VoxCPM2Model(nn.Module):
    def __init__(self, cfg: VoxCPM2Config, attention: str = "torch", compile: bool = False):
        """attention: LocEnc and LocDiT attention, "torch" (RoPE, head folding and SDPA as separate
        kernels, `minicpm.local_attention`) or "triton" (whole layers as persistent Triton kernels where
        they fit, `kernels.persistent_layer`, else attention as one Triton kernel from the packed QKV
        projection, `kernels.local_attention`; GPU, or triton's CPU interpreter in tests).
        compile: torch.compile what a decode step runs (GPU, before CUDA-graph capture): LocEnc
        whole, each CFM Euler step whole (LocDiT and the CFG glue around it, `CFMSolver`), and in
        both LMs the layer math around attention (one compiled pair shared by all layers; paged
        attention and prefill's per-prompt loop stay eager). Their callers mark the batch (and
        prompt length) dimensions dynamic, so the first compile already serves every bucket, while
        all other sizes stay static for good kernels. Compiled lazily, on first call; the engine
        raises dynamo's recompile limit while it runs (`Engine`)."""
        super().__init__()
        if attention not in ATTENTION_BACKENDS:
            raise ValueError(f"attention must be one of {ATTENTION_BACKENDS}, got {attention!r}")
        self.cfg = cfg
        self.attention, self.compiled = attention, bool(compile)
        lm = cfg.lm_config
        h = lm.hidden_size
        self.patch_size, self.feat_dim = cfg.patch_size, cfg.feat_dim
        if attention == "triton":
            from ..kernels.persistent_layer import fused_local_layers as local_attn
        else:
            from .minicpm import local_attention as local_attn
        self.base_lm = MiniCPM(lm, compile_layers=compile)
        self.residual_lm = MiniCPM(cfg.residual_lm(), compile_layers=compile)
        self.feat_encoder = LocalEncoder(cfg.local_encoder(), cfg.feat_dim, local_attn, compile=compile)
        self.feat_decoder = CFMSolver(LocalDiT(cfg.local_dit(), cfg.feat_dim, local_attn),
                                      mean_mode=cfg.dit_config.dit_mean_mode, compile=compile)
        self.fsq_layer = ScalarQuantizer(h, cfg.scalar_quantization_latent_dim, cfg.scalar_quantization_scale)
        self.enc_to_lm_proj = nn.Linear(cfg.encoder_config.hidden_dim, h)
        self.lm_to_dit_proj = nn.Linear(h, cfg.dit_config.hidden_dim)
        self.res_to_dit_proj = nn.Linear(h, cfg.dit_config.hidden_dim)
        self.fusion_concat_proj = nn.Linear(2 * h, h)
        self.stop_proj = nn.Linear(h, h)
        self.stop_head = nn.Linear(h, 2, bias=False)
        self.text_scale = lm.scale_emb if lm.use_mup else 1.0

    def embed_patches(self, feats: torch.Tensor, lora: LoraBatch | None = None) -> torch.Tensor:
        """[B, T, P, D] -> [B, T, H]: LocEnc then projection into the LM's space (with `lora`'s
        adapter on the projection: a prefill's, or a decode step's, T = 1).

        LocEnc sees each patch on its own, so decode steps ([B, 1]) and prefills ([1, T]) both go
        in as [B * T, 1] patches: one dynamic dimension, compiled (if compiled) once for every count up to
        `persistent_layer.MAX_TOKENS` (LocEnc's layers in that kernel; `runs` pads the count) and once for more."""
        B, T = feats.shape[:2]
        # contiguous(): a decode step's patch is a transposed view; a prompt's feats are not.
        # detach(): no view either, whose base size torch.compile would guard on (see minicpm._as_non_views).
        flat = feats.reshape(B * T, 1, *feats.shape[2:]).contiguous().detach()
        torch._dynamo.maybe_mark_dynamic(flat, 0)
        op = None if lora is None else lora.op("enc_to_lm_proj")
        return lora_linear(self.enc_to_lm_proj, self.feat_encoder(flat), op).view(B, T, -1)

    def prefill(self, tokens, text_mask, audio_mask, feats, positions, last_index, base_backend, residual_backend,
                lora: LoraBatch | None = None):
        """Run both LMs over prompt positions (one or several packed prompts).

        tokens/text_mask/audio_mask/positions: [1, S]; feats: [1, S, P, D]; last_index: [N]
        (the last position of each prompt) -> (lm_hidden [N, H], residual_hidden [N, H]).
        lora: the prompts' adapter (`LoraBatch(..., single=True)`: one for all of them), or None.
        """
        dtype = self.fusion_concat_proj.weight.dtype
        tmask = text_mask.to(dtype)[..., None]
        amask = audio_mask.to(dtype)[..., None]
        feat_embed = self.embed_patches(feats.to(dtype), lora)
        text_embed = self.base_lm.embed_tokens(tokens) * self.text_scale
        x = tmask * text_embed + amask * feat_embed
        if lora is None:
            enc = self.base_lm(x, positions, base_backend)
        else:
            enc = self.base_lm(x, positions, base_backend, lora=lora.layers("base_lm", len(self.base_lm.layers)))
        enc = self.fsq_layer(enc) * amask + enc * tmask
        res_in = self._linear("fusion_concat_proj", torch.cat((enc, amask * feat_embed), dim=-1), lora)
        if lora is None:
            res = self.residual_lm(res_in, positions, residual_backend)
        else:
            res = self.residual_lm(res_in, positions, residual_backend,
                                   lora=lora.layers("residual_lm", len(self.residual_lm.layers)))
        return enc[0, last_index], res[0, last_index]

    def _linear(self, name: str, x: torch.Tensor, lora: LoraBatch | None) -> torch.Tensor:
        """The top-level projection `name` (the reference's), with `lora`'s adapter if it has one."""
        if lora is None:
            return getattr(self, name)(x)
        return lora_linear(getattr(self, name), x, lora.op(name))

    def stop_logits(self, lm_hidden: torch.Tensor, lora: LoraBatch | None = None) -> torch.Tensor:
        return self._linear("stop_head", F.silu(self._linear("stop_proj", lm_hidden, lora)), lora)

    def decode_step(self, lm_hidden, residual_hidden, prev_patch, noise, schedule: CfmSchedule, cfg_value,
                    positions, base_backend, residual_backend, teacher_patch=None,
                    lora: LoraBatch | None = None) -> StepOutput:
        """One autoregressive step for a batch of requests.

        lm_hidden/residual_hidden: [B, H]; prev_patch: [B, P, D] (the CFM condition);
        noise: [B, D, P] CFM start sample; cfg_value: [B]; positions: [B] (where this step's
        token goes in each request's KV cache). teacher_patch: feed this patch to the LMs instead
        of the sampled one (teacher forcing, for precision checks). lora: each row's adapter
        (`LoraBatch` over [B] slots), or None.
        """
        mu = torch.cat((self._linear("lm_to_dit_proj", lm_hidden, lora),
                        self._linear("res_to_dit_proj", residual_hidden, lora)), dim=-1)
        dit = None if lora is None else lora.dit(len(self.feat_decoder.estimator.decoder.layers))
        patch = self.feat_decoder.sample(noise.to(mu.dtype), mu, prev_patch.transpose(1, 2).to(mu.dtype),
                                         schedule, cfg_value, *(() if dit is None else (dit,))).transpose(1, 2)
        fed = patch if teacher_patch is None else teacher_patch.to(patch.dtype)
        emb = self.embed_patches(fed[:, None], lora)  # [B, 1, H]
        stop = self.stop_logits(lm_hidden, lora).argmax(-1) == 1
        pos = positions[:, None]
        if lora is None:
            new_lm = self.fsq_layer(self.base_lm(emb, pos, base_backend))
        else:
            new_lm = self.fsq_layer(self.base_lm(emb, pos, base_backend,
                                                 lora=lora.layers("base_lm", len(self.base_lm.layers))))
        res_in = self._linear("fusion_concat_proj", torch.cat((new_lm, emb), dim=-1), lora)
        if lora is None:
            new_res = self.residual_lm(res_in, pos, residual_backend)
        else:
            new_res = self.residual_lm(res_in, pos, residual_backend,
                                       lora=lora.layers("residual_lm", len(self.residual_lm.layers)))
        return StepOutput(patch, stop, new_lm[:, 0], new_res[:, 0])
