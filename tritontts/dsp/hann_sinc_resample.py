"""Resampling as `torchaudio.transforms.Resample` does by default (Hann-windowed sinc, 6 zero crossings,
rolloff 0.99), which upstream CosyVoice2 uses to bring the 16 kHz prompt to 24 kHz for its prompt mel.

`tritontts.dsp.resample` keeps more of the band's edge out (Kaiser, rolloff 0.94); the prompt mel's top
bins (up to 8 kHz) differ between the two, so the CosyVoice2 front end uses this one.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor


@lru_cache(maxsize=16)
def _kernels(orig: int, new: int, lowpass_filter_width: int, rolloff: float) -> tuple[Tensor, int]:
    """`[new, 1, 2 * width + orig]` fp32 filters, one per output phase, and `width`."""
    base_freq = min(orig, new) * rolloff
    width = math.ceil(lowpass_filter_width * orig / base_freq)
    taps = torch.arange(-width, width + orig, dtype=torch.float64)[None, None] / orig
    t = (torch.arange(0, -new, -1, dtype=torch.float64)[:, None, None] / new + taps) * base_freq
    t = t.clamp(-lowpass_filter_width, lowpass_filter_width)
    window = torch.cos(t * math.pi / lowpass_filter_width / 2) ** 2
    t = t * math.pi
    sinc = torch.where(t == 0, torch.tensor(1.0, dtype=torch.float64), torch.sin(t) / t)
    return (sinc * window * (base_freq / orig)).float(), width


def hann_sinc_resample(
    wav: Tensor, orig_freq: int, new_freq: int, lowpass_filter_width: int = 6, rolloff: float = 0.99
) -> Tensor:
    """Resample `[..., L]` along the last axis to `ceil(L * new_freq / orig_freq)` samples (fp32)."""
    if orig_freq <= 0 or new_freq <= 0:
        raise ValueError(f"sample rates must be positive, got {orig_freq} and {new_freq}")
    if orig_freq == new_freq:
        return wav.float().clone()
    gcd = math.gcd(orig_freq, new_freq)
    orig, new = orig_freq // gcd, new_freq // gcd
    kernels, width = _kernels(orig, new, lowpass_filter_width, rolloff)
    shape = wav.shape
    flat = wav.reshape(-1, shape[-1]).float()
    padded = F.pad(flat, (width, width + orig))
    out = F.conv1d(padded[:, None], kernels.to(wav.device), stride=orig)
    out = out.transpose(1, 2).reshape(flat.shape[0], -1)
    target_length = math.ceil(new * shape[-1] / orig)
    return out[:, :target_length].reshape(*shape[:-1], target_length)
