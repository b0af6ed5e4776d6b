"""Request checks in one place for the offline API, the engine and the server: parameter limits,
text cleanup, waveform checks, resampling, length defaults.

Torch-free so the light serving processes (orchestrators, tokenizer) can use it.
"""

from __future__ import annotations

import math
import numbers
import re
import secrets
import unicodedata

import numpy as np

# Names of stored voices and LoRA adapters (a file or directory name each).
NAME_RE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,63}")
NAME_RULE = "1 to 64 characters of A-Z a-z 0-9 _ . -, not starting with '.'"
# Trailing prompt patches that prime the streaming VAE decode in continuation modes
# (the reference's streaming_prefix_len - 1).
CONTEXT_PATCHES = 3
MAX_SAMPLE_RATE = 384_000
MIN_SAMPLE_RATE = 1_000

CFG_RANGE = (0.0, 20.0)
TIMESTEPS_RANGE = (1, 100)
# A request's defaults, as the reference's generate() has them.
DEFAULT_CFG_VALUE = 2.0
DEFAULT_TIMESTEPS = 10
DEFAULT_MIN_LENGTH = 2
MAX_TEXT_BYTES = 4096
SEED_RANGE = (-(2**63), 2**63 - 1)


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def check_generation(min_len, max_len, cfg_value, inference_timesteps, capacity: int, max_len_default: bool = False,
                     room: str = "the model's context leaves (its length minus the prompt)"):
    """Raise ValueError naming the first bad parameter. `capacity`: positions left in the KV cache,
    which `room` says how; `max_len_default`: max_len is the default for the text, not the caller's."""
    if not _is_int(min_len) or min_len < 0:
        raise ValueError(f"min_len must be a non-negative integer, got {min_len!r}")
    if not _is_int(max_len) or max_len < 1:
        raise ValueError(f"max_len must be a positive integer, got {max_len!r}")
    if min_len > max_len:
        raise ValueError(f"min_len ({min_len}) is larger than " + (
            f"the default max_len for this text ({max_len}); send max_len too" if max_len_default
            else f"max_len ({max_len})"))
    if max_len > capacity:  # (a default max_len is at least min_len: then min_len is the one too long)
        raise ValueError(f"{'min_len' if max_len_default else 'max_len'} {max_len} is more than the {capacity} "
                         f"positions {room}")
    try:
        cfg = float(cfg_value)
    except (TypeError, ValueError):
        raise ValueError(f"cfg_value must be a number, got {cfg_value!r}") from None
    if not math.isfinite(cfg) or not CFG_RANGE[0] <= cfg <= CFG_RANGE[1]:
        raise ValueError(f"cfg_value must be within [{CFG_RANGE[0]}, {CFG_RANGE[1]}], got {cfg_value!r}")
    if not _is_int(inference_timesteps) or not TIMESTEPS_RANGE[0] <= inference_timesteps <= TIMESTEPS_RANGE[1]:
        raise ValueError(f"inference_timesteps must be an integer within {list(TIMESTEPS_RANGE)}, "
                         f"got {inference_timesteps!r}")


def draw_seed() -> int:
    """The seed of a request that gives none: random, non-negative, within SEED_RANGE."""
    return secrets.randbits(63)


def check_seed(seed) -> int:
    if not _is_int(seed) or not SEED_RANGE[0] <= int(seed) <= SEED_RANGE[1]:
        raise ValueError(f"seed must be a 64-bit integer, got {seed!r}")
    return int(seed)


INVISIBLE = ("Cf", "Mn", "Me")  # format characters and marks, which only change the character before them


def blank(text: str) -> bool:
    """Nothing to speak: only whitespace, invisible format characters (zero-width spaces and joiners,
    a byte order mark) and marks with nothing to mark (what is left of an emoji once its pictures
    are gone: joiners, variation selectors, a keycap's enclosing mark)."""
    return all(ch.isspace() or unicodedata.category(ch) in INVISIBLE for ch in text)


def clean_text(text: str) -> str:
    """What the reference's VoxCPM.generate does to the target text before tokenizing."""
    return re.sub(r"\s+", " ", text.replace("\n", " "))


def check_waveform(audio, sample_rate, name: str, rate_name: str | None = None,
                   max_seconds: float | None = None) -> np.ndarray:
    """Validate a mono waveform and return it as float32 numpy: the offline API's audio, and the
    server's (`rate_name` names its sample-rate input; `max_seconds` bounds its length)."""
    if sample_rate is None:
        raise ValueError(f"{name} needs {rate_name or 'a sample rate'}")
    rate_name = rate_name or f"{name}'s sample rate"
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, (int, np.integer)):
        raise ValueError(f"{rate_name} must be an integer, got {sample_rate!r}")
    if not MIN_SAMPLE_RATE <= int(sample_rate) <= MAX_SAMPLE_RATE:
        raise ValueError(f"{rate_name} {sample_rate} is outside [{MIN_SAMPLE_RATE}, {MAX_SAMPLE_RATE}] Hz")
    if hasattr(audio, "detach"):  # a torch tensor
        audio = audio.detach().cpu().numpy()
    audio = np.asarray(audio)
    if audio.ndim == 2 and 1 in audio.shape:
        audio = audio.reshape(-1)
    if audio.ndim != 1:
        raise ValueError(f"{name} must be a mono waveform (1-D), got shape {list(audio.shape)}")
    if audio.size == 0:
        raise ValueError(f"{name} is empty")
    if max_seconds is not None and audio.size > max_seconds * int(sample_rate):
        limit = int(max_seconds * int(sample_rate))
        raise ValueError(f"{name} is {audio.size} samples ({audio.size / int(sample_rate):.6g} s) at "
                         f"{int(sample_rate)} Hz; the limit is {max_seconds:g} s, {limit} samples")
    if not np.issubdtype(audio.dtype, np.floating):
        raise ValueError(f"{name} must hold float samples, got {audio.dtype}")
    audio = audio.astype(np.float32)
    if not np.isfinite(audio).all():
        raise ValueError(f"{name} contains NaN or Inf")
    return audio


RESAMPLE_MAX_DOWN = 1000


def resample_factors(src_rate: int, dst_rate: int) -> tuple[int, int]:
    """(up, down) for resample_poly. An awkward rate (383999 Hz: gcd 1) would make a filter of
    millions of taps and seconds of CPU for a few samples; the ratio is approximated with a
    denominator of at most RESAMPLE_MAX_DOWN (every common rate stays exact; 383999 is off by 3 ppm)."""
    from fractions import Fraction

    r = Fraction(int(dst_rate), int(src_rate)).limit_denominator(RESAMPLE_MAX_DOWN)
    return max(r.numerator, 1), r.denominator


def resample(audio: np.ndarray, src_rate: int, dst_rate: int) -> np.ndarray:
    if int(src_rate) == int(dst_rate):
        return audio
    from scipy.signal import resample_poly

    up, down = resample_factors(src_rate, dst_rate)
    return resample_poly(audio, up, down).astype(np.float32)


# The reference's bad-case retry (VoxCPM.generate, retry_badcase): a whole utterance of at least
# BADCASE_RATIO patches per target token (its stop head did not fire in time) is synthesized again
# with new noise, RETRY_MAX_TIMES tries in all, and the last try is kept whatever its length.
BADCASE_RATIO = 6.0
RETRY_MAX_TIMES = 3


def shown(value, limit: int = 80) -> str:
    """`value` quoted for an error message, a string cut to `limit` characters: a client's megabyte-long
    name must not come back in an error (gRPC refuses an error message over its 16 KiB metadata limit)."""
    if not isinstance(value, str) or len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}... ({len(value)} characters)"


def context_room(n_prompt: int, max_positions: int, min_len=1) -> int:
    """The positions the model's context leaves after a prompt; a ValueError unless they are room
    for at least min_len patches (at least one)."""
    need = min_len if _is_int(min_len) and min_len > 1 else 1
    if n_prompt + need > max_positions:
        left = max(max_positions - n_prompt, 0)
        raise ValueError(f"the text and prompt take {n_prompt} of the model's {max_positions} positions, leaving "
                         + ("none" if left == 0 else f"{left}, fewer than min_len {min_len},")
                         + " to generate: shorten the text, the prompt text or the prompt audio")
    return max_positions - n_prompt


def default_max_len(n_target_tokens: int, capacity: int | None = None, cap: int = 4096) -> int:
    """The reference's length limit: 6 patches per target token + 10, at most `cap` (VoxCPM.generate's
    max_len), and at most `capacity` (the positions the context leaves after the prompt) where given:
    a long text is not refused for a limit its caller never set."""
    n = min(int(n_target_tokens * BADCASE_RATIO + 10), cap)
    return n if capacity is None else min(n, capacity)


def is_badcase(n_patches: int, n_target_tokens: int) -> bool:
    """The reference's rule: generated patches >= BADCASE_RATIO x target text tokens."""
    return n_patches >= n_target_tokens * BADCASE_RATIO


def can_retry(min_len: int, n_target_tokens: int) -> bool:
    """Whether a retry could end under the bad-case length: the stop head fires at step min_len + 1
    at the earliest (min_len + 2 patches). A longer MIN_LENGTH forces a "bad" length on every try,
    so such a request is not retried (where the reference would retry it in vain)."""
    return not is_badcase(min_len + 2, n_target_tokens)


def retry_seed(seed: int, attempt: int) -> int:
    """The seed of try `attempt` (0: the request's own): seed + attempt, wrapped into int64."""
    return (int(seed) + attempt - SEED_RANGE[0]) % 2**64 + SEED_RANGE[0]
