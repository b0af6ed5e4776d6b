"""Request inputs checked without torch: text cleanup, waveform checks, resampling, length defaults.

Torch-free so the light serving processes (orchestrators, tokenizer) can use it.
"""

from __future__ import annotations

import re

import numpy as np

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
    if hasattr(audio, "detach"):  # a torch tensor
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


def default_max_len(n_target_tokens: int, cap: int = 4096) -> int:
    """The reference's length limit: 6 patches per target token + 10, at most `cap` (VoxCPM.generate's max_len)."""
    return min(int(n_target_tokens * 6.0 + 10), cap)
