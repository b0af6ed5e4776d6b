"""Request parameter limits, checked in one place for the offline API, the engine and the server."""

from __future__ import annotations

import math
import numbers

CFG_RANGE = (0.0, 20.0)
TIMESTEPS_RANGE = (1, 100)
MAX_TEXT_BYTES = 4096
SEED_RANGE = (-(2**63), 2**63 - 1)


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def check_generation(min_len, max_len, cfg_value, inference_timesteps, capacity: int):
    """Raise ValueError naming the first bad parameter. `capacity`: positions left in the KV cache."""
    if not _is_int(min_len) or min_len < 0:
        raise ValueError(f"min_len must be a non-negative integer, got {min_len!r}")
    if not _is_int(max_len) or max_len < 1:
        raise ValueError(f"max_len must be a positive integer, got {max_len!r}")
    if min_len > max_len:
        raise ValueError(f"min_len ({min_len}) is larger than max_len ({max_len})")
    if max_len > capacity:
        raise ValueError(f"max_len {max_len} is more than the {capacity} positions the model's context leaves "
                         "(its length minus the prompt)")
    try:
        cfg = float(cfg_value)
    except (TypeError, ValueError):
        raise ValueError(f"cfg_value must be a number, got {cfg_value!r}") from None
    if not math.isfinite(cfg) or not CFG_RANGE[0] <= cfg <= CFG_RANGE[1]:
        raise ValueError(f"cfg_value must be within [{CFG_RANGE[0]}, {CFG_RANGE[1]}], got {cfg_value!r}")
    if not _is_int(inference_timesteps) or not TIMESTEPS_RANGE[0] <= inference_timesteps <= TIMESTEPS_RANGE[1]:
        raise ValueError(f"inference_timesteps must be an integer within {list(TIMESTEPS_RANGE)}, "
                         f"got {inference_timesteps!r}")


def check_seed(seed) -> int:
    if not _is_int(seed) or not SEED_RANGE[0] <= int(seed) <= SEED_RANGE[1]:
        raise ValueError(f"seed must be a 64-bit integer, got {seed!r}")
    return int(seed)
