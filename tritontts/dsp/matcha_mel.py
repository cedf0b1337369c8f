"""The prompt mel of CosyVoice2's flow (matcha-TTS's `mel_spectrogram`) in plain torch.

Reflect padding of `(n_fft - hop) / 2` on both sides, an uncentered STFT with a periodic Hann window,
magnitude `sqrt(re^2 + im^2 + 1e-9)`, librosa's slaney filters, then `log(clamp(x, 1e-5))`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor

from tritontts.dsp.mel import mel_filterbank


@dataclass(frozen=True)
class MatchaMelConfig:
    """CosyVoice2's `feat_extractor` (cosyvoice2.yaml): 80 bins at 50 frames per second of 24 kHz audio."""

    n_fft: int = 1920
    num_mels: int = 80
    sampling_rate: int = 24000
    hop_size: int = 480
    win_size: int = 1920
    fmin: float = 0.0
    fmax: float = 8000.0


@lru_cache(maxsize=8)
def _filters(config: MatchaMelConfig) -> Tensor:
    """`[num_mels, n_fft // 2 + 1]`, equal to librosa's default (slaney) `filters.mel`."""
    fb = mel_filterbank(
        config.n_fft // 2 + 1,
        config.fmin,
        config.fmax,
        config.num_mels,
        config.sampling_rate,
        norm="slaney",
        mel_scale="slaney",
    )
    return fb.T.contiguous()


def matcha_num_frames(num_samples: int, config: MatchaMelConfig = MatchaMelConfig()) -> int:
    """Frames of `matcha_mel` for `num_samples` (with the defaults: `num_samples // 480`)."""
    padded = num_samples + 2 * ((config.n_fft - config.hop_size) // 2)
    return max(0, (padded - config.n_fft) // config.hop_size + 1)


def matcha_mel(audio: Tensor, config: MatchaMelConfig = MatchaMelConfig()) -> Tensor:
    """Audio `[..., L]` at `config.sampling_rate` → fp32 log-mel `[..., num_mels, matcha_num_frames(L)]`."""
    shape = audio.shape
    pad = (config.n_fft - config.hop_size) // 2
    flat = audio.reshape(-1, shape[-1]).float()
    if flat.shape[-1] <= pad:
        raise ValueError(f"matcha_mel needs more than {pad} samples, got {flat.shape[-1]}")
    flat = F.pad(flat.unsqueeze(1), (pad, pad), mode="reflect").squeeze(1)
    window = torch.hann_window(config.win_size, device=audio.device)
    spec = torch.stft(
        flat,
        config.n_fft,
        hop_length=config.hop_size,
        win_length=config.win_size,
        window=window,
        center=False,
        normalized=False,
        onesided=True,
        return_complex=True,
    )
    magnitude = torch.sqrt(spec.real**2 + spec.imag**2 + 1e-9)
    mel = torch.matmul(_filters(config).to(audio.device), magnitude)
    log_mel = torch.log(torch.clamp(mel, min=1e-5))
    return log_mel.reshape(*shape[:-1], *log_mel.shape[-2:])
