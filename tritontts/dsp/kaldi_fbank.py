"""Kaldi log-mel filterbank features in plain torch, equal to `torchaudio.compliance.kaldi.fbank`.

Only what CosyVoice's speaker embedder uses is configurable; the rest is torchaudio's defaults: povey window,
DC offset removed per frame, pre-emphasis 0.97, FFT size rounded up to a power of two, frames snipped at the
edges, power spectrum, Kaldi mel scale `1127 ln(1 + f / 700)`, `log(max(x, float32 eps))`, no energy term.
Samples are taken as they come (floats in [-1, 1] give smaller energies than Kaldi's int16 scale).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor

_FLOAT32_EPS = torch.finfo(torch.float32).eps


@dataclass(frozen=True)
class FbankOptions:
    num_mel_bins: int = 80
    sample_frequency: float = 16000.0
    frame_length_ms: float = 25.0
    frame_shift_ms: float = 10.0
    preemphasis: float = 0.97
    low_freq: float = 20.0
    high_freq: float = 0.0

    @property
    def window_size(self) -> int:
        return int(self.sample_frequency * self.frame_length_ms * 0.001)

    @property
    def window_shift(self) -> int:
        return int(self.sample_frequency * self.frame_shift_ms * 0.001)

    @property
    def padded_window_size(self) -> int:
        return 1 << (self.window_size - 1).bit_length()


def kaldi_mel(freq: Tensor | float) -> Tensor | float:
    if isinstance(freq, Tensor):
        return 1127.0 * (1.0 + freq / 700.0).log()
    return 1127.0 * math.log(1.0 + freq / 700.0)


@lru_cache(maxsize=8)
def _mel_banks(options: FbankOptions) -> Tensor:
    """`[padded_window_size // 2 + 1, num_mel_bins]` triangles, equally spaced on the Kaldi mel scale."""
    nyquist = 0.5 * options.sample_frequency
    high_freq = options.high_freq if options.high_freq > 0 else options.high_freq + nyquist
    if not 0.0 <= options.low_freq < high_freq <= nyquist:
        raise ValueError(f"bad fbank band: low_freq={options.low_freq}, high_freq={high_freq}")
    num_fft_bins = options.padded_window_size // 2
    fft_bin_width = options.sample_frequency / options.padded_window_size
    mel_low, mel_high = kaldi_mel(options.low_freq), kaldi_mel(high_freq)
    delta = (mel_high - mel_low) / (options.num_mel_bins + 1)
    edges = mel_low + delta * torch.arange(options.num_mel_bins + 2, dtype=torch.float32)
    left, center, right = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    mel = kaldi_mel(fft_bin_width * torch.arange(num_fft_bins, dtype=torch.float32))[None, :]
    up = (mel - left) / (center - left)
    down = (right - mel) / (right - center)
    banks = torch.clamp(torch.minimum(up, down), min=0.0)
    return F.pad(banks, (0, 1)).T.float().contiguous()


def fbank_num_frames(num_samples: int, options: FbankOptions = FbankOptions()) -> int:
    """Frames of `kaldi_fbank` (snip_edges): `1 + (num_samples - 400) // 160` at 16 kHz, 0 if shorter."""
    if num_samples < options.window_size:
        return 0
    return 1 + (num_samples - options.window_size) // options.window_shift


def kaldi_fbank(wav: Tensor, options: FbankOptions = FbankOptions()) -> Tensor:
    """Mono waveform `[L]` → fp32 log-mel filterbank `[fbank_num_frames(L), num_mel_bins]` (dither 0)."""
    if wav.ndim != 1:
        raise ValueError(f"kaldi_fbank takes one mono waveform [L], got shape {tuple(wav.shape)}")
    num_frames = fbank_num_frames(wav.shape[0], options)
    if num_frames == 0:
        raise ValueError(f"kaldi_fbank needs at least {options.window_size} samples, got {wav.shape[0]}")
    wav = wav.float()
    frames = wav.unfold(0, options.window_size, options.window_shift)[:num_frames]
    frames = frames - frames.mean(dim=1, keepdim=True)
    previous = F.pad(frames.unsqueeze(0), (1, 0), mode="replicate").squeeze(0)[:, :-1]
    frames = frames - options.preemphasis * previous
    window = torch.hann_window(options.window_size, periodic=False, device=wav.device).pow(0.85)
    frames = F.pad(frames * window, (0, options.padded_window_size - options.window_size))
    power = torch.fft.rfft(frames).abs().pow(2.0)
    mel_energies = power @ _mel_banks(options).to(wav.device)
    return torch.clamp(mel_energies, min=_FLOAT32_EPS).log()
