"""Waveforms to the VAE's latent patches: a voice prompt or reference becomes what the decoder
conditions on (`vae_encoder`, the offline API)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from ..model.audio_vae import AudioVAE


@torch.inference_mode()
def encode_patches(vae: AudioVAE, patch_size: int, waves: list[np.ndarray], pads: list[str]) -> list[torch.Tensor]:
    """Waveforms already at the VAE's input rate -> latent patches [n, P, D] each.

    Each is padded to whole patches ('left' for continuation prompts, 'right' for
    references, as the reference does); equal lengths are encoded as one batch.
    """
    patch_len = patch_size * vae.chunk_size
    padded = []
    for w, side in zip(waves, pads):
        x = torch.from_numpy(np.ascontiguousarray(w, dtype=np.float32))
        extra = (-x.numel()) % patch_len
        padded.append(F.pad(x, (extra, 0) if side == "left" else (0, extra)))
    out: list = [None] * len(waves)
    dev = next(vae.parameters()).device
    for n in sorted({x.numel() for x in padded}):
        idx = [i for i, x in enumerate(padded) if x.numel() == n]
        z = vae.encode(torch.stack([padded[i] for i in idx]).to(dev))  # [B, D, frames]
        for j, i in enumerate(idx):
            out[i] = z[j].view(z.size(1), -1, patch_size).permute(1, 2, 0).float().cpu()
    return out
