"""Prompt construction for VoxCPM2's four modes, and the audio checks behind it.

The prompt is one sequence of positions, each either a text token (text_mask=1)
or an audio latent patch (audio_mask=1):

    zero-shot      text+[101]
    reference      [103] ref patches [104]  text+[101]
    continuation   (prompt_text+text)+[101]  prompt patches
    combined       [103] ref patches [104]  (prompt_text+text)+[101]  prompt patches

A leading "(description)" in the text is VoxCPM2 voice design; it is plain text
to the model. Reference audio is padded on the right, prompt audio on the left,
to a whole number of patches, as the reference does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import torch

AUDIO_START, AUDIO_END, REF_AUDIO_START, REF_AUDIO_END = 101, 102, 103, 104
# Trailing prompt patches that prime the streaming VAE decode in continuation modes
# (the reference's streaming_prefix_len - 1).
CONTEXT_PATCHES = 3
MAX_SAMPLE_RATE = 384_000
MIN_SAMPLE_RATE = 1_000


def clean_text(text: str) -> str:
    """What the reference's VoxCPM.generate does to the target text before tokenizing."""
    return re.sub(r"\s+", " ", text.replace("\n", " "))


def check_waveform(audio, sample_rate, name: str) -> np.ndarray:
    """Validate a mono waveform and return it as float32 numpy."""
    if sample_rate is None:
        raise ValueError(f"{name}: a sample rate is required with the audio")
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, (int, np.integer)):
        raise ValueError(f"{name}: sample rate must be an integer, got {sample_rate!r}")
    if not MIN_SAMPLE_RATE <= int(sample_rate) <= MAX_SAMPLE_RATE:
        raise ValueError(f"{name}: sample rate {sample_rate} is outside [{MIN_SAMPLE_RATE}, {MAX_SAMPLE_RATE}] Hz")
    if torch.is_tensor(audio):
        audio = audio.detach().cpu().numpy()
    audio = np.asarray(audio)
    if audio.ndim == 2 and 1 in audio.shape:
        audio = audio.reshape(-1)
    if audio.ndim != 1:
        raise ValueError(f"{name}: expected a mono waveform (1-D), got shape {tuple(audio.shape)}")
    if audio.size == 0:
        raise ValueError(f"{name}: audio is empty")
    if not np.issubdtype(audio.dtype, np.floating):
        raise ValueError(f"{name}: expected float samples, got {audio.dtype}")
    audio = audio.astype(np.float32)
    if not np.isfinite(audio).all():
        raise ValueError(f"{name}: audio contains NaN or Inf")
    return audio


def resample(audio: np.ndarray, src_rate: int, dst_rate: int) -> np.ndarray:
    if int(src_rate) == int(dst_rate):
        return audio
    from math import gcd

    from scipy.signal import resample_poly

    g = gcd(int(src_rate), int(dst_rate))
    return resample_poly(audio, int(dst_rate) // g, int(src_rate) // g).astype(np.float32)


@dataclass
class Prompt:
    tokens: torch.Tensor  # [T] int64
    text_mask: torch.Tensor  # [T] float
    audio_mask: torch.Tensor  # [T] float
    feats: torch.Tensor  # [T, P, D] float32
    context: torch.Tensor  # [C, P, D]: trailing prompt patches (continuation modes) that prime the VAE
    n_target_tokens: int  # tokens of the target text alone (sets the default max length)

    def __len__(self):
        return int(self.tokens.numel())


def build_prompt(text_ids: list[int], n_target_tokens: int, ref_feat: torch.Tensor | None,
                 prompt_feat: torch.Tensor | None, patch_size: int, feat_dim: int) -> Prompt:
    """text_ids: tokenizer(prompt_text + text) (continuation) or tokenizer(text); feats are [n, P, D]."""
    tokens, tmask, amask, feats = [], [], [], []

    def add(tok, feat, is_text):
        n = len(tok)
        tokens.append(torch.as_tensor(tok, dtype=torch.int64))
        tmask.append(torch.full((n,), 1.0 if is_text else 0.0))
        amask.append(torch.full((n,), 0.0 if is_text else 1.0))
        feats.append(feat if feat is not None else torch.zeros(n, patch_size, feat_dim))

    if ref_feat is not None:
        add([REF_AUDIO_START], None, True)
        add([0] * ref_feat.size(0), ref_feat.float(), False)
        add([REF_AUDIO_END], None, True)
    add(list(text_ids) + [AUDIO_START], None, True)
    if prompt_feat is not None:
        add([0] * prompt_feat.size(0), prompt_feat.float(), False)
    tokens, tmask, amask, feats = torch.cat(tokens), torch.cat(tmask), torch.cat(amask), torch.cat(feats)
    # The reference takes the context from all audio positions (so a 1-patch prompt
    # in combined mode also pulls in reference patches), and only when the prompt ends in audio.
    context = feats[amask > 0][-CONTEXT_PATCHES:] if amask[-1] > 0 else torch.zeros(0, patch_size, feat_dim)
    return Prompt(tokens, tmask, amask, feats, context, n_target_tokens)


def default_max_len(n_target_tokens: int, cap: int = 4096) -> int:
    """The reference's length limit: 6 patches per target token + 10, at most `cap` (VoxCPM.generate's max_len)."""
    return min(int(n_target_tokens * 6.0 + 10), cap)
