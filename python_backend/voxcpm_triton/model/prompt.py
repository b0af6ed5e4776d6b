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

from dataclasses import dataclass

import torch

from ..checks import CONTEXT_PATCHES

# The special tokens around the audio parts of a prompt (the reference tokenizer's ids).
AUDIO_START, REF_AUDIO_START, REF_AUDIO_END = 101, 103, 104


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
    """text_ids: tokenizer(prompt_text + text) (continuation) or tokenizer(text); feats are [n, P, D].
    Built in Python lists first, then a few tensors: it runs on the serving thread of every request."""
    tokens, is_text, audio = [], [], []  # audio: (first position, [n, P, D]) of each audio part

    def add(tok, feat=None):
        if feat is not None:
            if tuple(feat.shape[1:]) != (patch_size, feat_dim):  # the slice assignment below would broadcast it
                raise ValueError(f"audio features must be [n, {patch_size}, {feat_dim}], got {list(feat.shape)}")
            audio.append((len(tokens), feat.float()))
        is_text.extend([feat is None] * len(tok))
        tokens.extend(tok)

    if ref_feat is not None:
        add([REF_AUDIO_START])
        add([0] * ref_feat.size(0), ref_feat)
        add([REF_AUDIO_END])
    add(list(text_ids) + [AUDIO_START])
    if prompt_feat is not None:
        add([0] * prompt_feat.size(0), prompt_feat)
    tmask = torch.tensor(is_text, dtype=torch.float32)
    feats = torch.zeros(len(tokens), patch_size, feat_dim)
    for start, f in audio:
        feats[start:start + f.size(0)] = f
    # The reference takes the context from all audio positions (so a 1-patch prompt
    # in combined mode also pulls in reference patches), and only when the prompt ends in audio.
    context = (torch.cat([f for _, f in audio])[-CONTEXT_PATCHES:] if not is_text[-1]
               else torch.zeros(0, patch_size, feat_dim))
    return Prompt(torch.tensor(tokens, dtype=torch.int64), tmask, 1.0 - tmask, feats, context, n_target_tokens)
