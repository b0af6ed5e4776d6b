"""build_prompt (model/prompt.py), position by position, in VoxCPM2's four modes: what the model and the
prefix cache read (tests/test_model_parity.py holds whole generations to the reference)."""

import pytest
import torch

from voxcpm_triton.checks import CONTEXT_PATCHES
from voxcpm_triton.model.prompt import AUDIO_START, REF_AUDIO_END, REF_AUDIO_START, build_prompt

P, D = 4, 3
IDS = [7, 8]


def feats(n, start):
    return torch.arange(start, start + n * P * D, dtype=torch.float32).reshape(n, P, D)


def check(prompt, tokens, text, audio_at: dict, context):
    """audio_at: first position -> the [n, P, D] features placed there (zeros elsewhere)."""
    T = len(tokens)
    assert prompt.tokens.dtype == torch.int64 and prompt.tokens.tolist() == tokens
    assert prompt.text_mask.dtype == prompt.audio_mask.dtype == prompt.feats.dtype == torch.float32
    assert prompt.text_mask.tolist() == [float(t) for t in text]
    assert prompt.audio_mask.tolist() == [1.0 - t for t in text]
    want = torch.zeros(T, P, D)
    for start, f in audio_at.items():
        want[start:start + len(f)] = f
    assert torch.equal(prompt.feats, want)
    assert prompt.context.shape[1:] == (P, D) and torch.equal(prompt.context, context)
    assert len(prompt) == T and prompt.n_target_tokens == 2


def test_zero_shot():
    check(build_prompt(IDS, 2, None, None, P, D), IDS + [AUDIO_START], [1, 1, 1], {}, torch.zeros(0, P, D))


def test_reference_audio_ends_in_text_so_it_primes_no_context():
    ref = feats(2, 0)
    check(build_prompt(IDS, 2, ref, None, P, D), [REF_AUDIO_START, 0, 0, REF_AUDIO_END] + IDS + [AUDIO_START],
          [1, 0, 0, 1, 1, 1, 1], {1: ref}, torch.zeros(0, P, D))


def test_continuation_primes_its_last_prompt_patches():
    pr = feats(CONTEXT_PATCHES + 1, 100)
    n = len(pr)
    check(build_prompt(IDS, 2, None, pr, P, D), IDS + [AUDIO_START] + [0] * n, [1, 1, 1] + [0] * n, {3: pr},
          pr[-CONTEXT_PATCHES:])


def test_combined_context_reaches_into_the_reference_patches():
    ref, pr = feats(3, 0), feats(1, 500).double()  # another dtype: stored as float32
    check(build_prompt(IDS, 2, ref, pr, P, D), [REF_AUDIO_START, 0, 0, 0, REF_AUDIO_END] + IDS + [AUDIO_START, 0],
          [1, 0, 0, 0, 1, 1, 1, 1, 0], {1: ref, 8: pr.float()}, torch.cat([ref, pr.float()])[-CONTEXT_PATCHES:])


def test_an_empty_prompt_audio_leaves_the_prompt_ending_in_text():
    check(build_prompt(IDS, 2, None, feats(0, 0), P, D), IDS + [AUDIO_START], [1, 1, 1], {}, torch.zeros(0, P, D))


@pytest.mark.parametrize("shape", [(2, 1, D), (2, P, D + 1), (2, P)])
def test_features_of_another_shape_are_refused(shape):
    with pytest.raises(ValueError, match="audio features"):
        build_prompt(IDS, 2, torch.zeros(shape), None, P, D)


def test_resample_factors_stay_small_for_awkward_rates():
    """A reference at 383999 Hz (gcd 1 with 16000) made resample_poly build a 7.7M-tap filter:
    1.4 s of vae_encoder CPU for 1000 samples, stalling every other request."""
    import numpy as np

    from voxcpm_triton.checks import RESAMPLE_MAX_DOWN, resample, resample_factors

    up, down = resample_factors(383999, 16000)
    assert down <= RESAMPLE_MAX_DOWN and up <= RESAMPLE_MAX_DOWN
    for rate, exact in ((44100, (160, 441)), (22050, (320, 441)), (48000, (1, 3)), (8000, (2, 1)),
                        (384000, (1, 24)), (11025, (640, 441))):
        assert resample_factors(rate, 16000) == exact
    out = resample(np.full(3840, 0.01, np.float32), 383999, 16000)
    assert out.dtype == np.float32 and abs(len(out) - 160) <= 1
