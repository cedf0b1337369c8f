"""Mel spectrogram in plain torch, equal to torchaudio's `MelSpectrogram` (centered STFT, reflect padding,
periodic Hann window, triangular filterbank on the slaney or htk mel scale)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

_SLANEY_F_SP = 200.0 / 3
_SLANEY_MIN_LOG_HZ = 1000.0
_SLANEY_MIN_LOG_MEL = _SLANEY_MIN_LOG_HZ / _SLANEY_F_SP
_SLANEY_LOGSTEP = math.log(6.4) / 27.0


def hz_to_mel(freq: float, mel_scale: str = "htk") -> float:
    if mel_scale == "htk":
        return 2595.0 * math.log10(1.0 + freq / 700.0)
    if freq < _SLANEY_MIN_LOG_HZ:
        return freq / _SLANEY_F_SP
    return _SLANEY_MIN_LOG_MEL + math.log(freq / _SLANEY_MIN_LOG_HZ) / _SLANEY_LOGSTEP


def mel_to_hz(mels: Tensor, mel_scale: str = "htk") -> Tensor:
    if mel_scale == "htk":
        return 700.0 * (10.0 ** (mels / 2595.0) - 1.0)
    linear = mels * _SLANEY_F_SP
    logarithmic = _SLANEY_MIN_LOG_HZ * torch.exp(_SLANEY_LOGSTEP * (mels - _SLANEY_MIN_LOG_MEL))
    return torch.where(mels >= _SLANEY_MIN_LOG_MEL, logarithmic, linear)


def mel_filterbank(
    n_freqs: int,
    f_min: float,
    f_max: float,
    n_mels: int,
    sample_rate: int,
    norm: str | None = None,
    mel_scale: str = "htk",
) -> Tensor:
    """`[n_freqs, n_mels]` triangular filters, as torchaudio's `melscale_fbanks` builds them."""
    if mel_scale not in ("htk", "slaney") or norm not in (None, "slaney"):
        raise ValueError(f"unsupported mel_scale={mel_scale!r} / norm={norm!r}")
    all_freqs = torch.linspace(0, sample_rate // 2, n_freqs)
    mel_points = torch.linspace(hz_to_mel(f_min, mel_scale), hz_to_mel(f_max, mel_scale), n_mels + 2)
    f_pts = mel_to_hz(mel_points, mel_scale)
    f_diff = f_pts[1:] - f_pts[:-1]
    slopes = f_pts.unsqueeze(0) - all_freqs.unsqueeze(1)
    down = -slopes[:, :-2] / f_diff[:-1]
    up = slopes[:, 2:] / f_diff[1:]
    fb = torch.clamp(torch.minimum(down, up), min=0.0)
    if norm == "slaney":
        fb = fb * (2.0 / (f_pts[2 : n_mels + 2] - f_pts[:n_mels])).unsqueeze(0)
    return fb


class _Window(nn.Module):
    def __init__(self, win_length: int) -> None:
        super().__init__()
        self.register_buffer("window", torch.hann_window(win_length, periodic=True))


class _FilterBank(nn.Module):
    def __init__(self, fb: Tensor) -> None:
        super().__init__()
        self.register_buffer("fb", fb)


class MelSpectrogram(nn.Module):
    """audio `[..., L]` → fp32 `[..., n_mels, L // hop_length + 1]` (computed in fp32 whatever the dtype).

    The window and filterbank are persistent buffers named like torchaudio's (`spectrogram.window`,
    `mel_scale.fb`), so a module holding this one has the same state_dict keys as one holding torchaudio's.
    """

    def __init__(
        self,
        sample_rate: int,
        n_fft: int,
        win_length: int | None,
        hop_length: int | None,
        f_min: float = 0.0,
        f_max: float | None = None,
        n_mels: int = 128,
        power: float = 2.0,
        norm: str | None = None,
        mel_scale: str = "htk",
    ) -> None:
        super().__init__()
        self.n_fft = n_fft
        self.win_length = win_length or n_fft
        self.hop_length = hop_length or self.win_length // 2
        self.power = power
        f_max = f_max if f_max is not None else sample_rate / 2
        self.spectrogram = _Window(self.win_length)
        self.mel_scale = _FilterBank(
            mel_filterbank(n_fft // 2 + 1, f_min, f_max, n_mels, sample_rate, norm=norm, mel_scale=mel_scale)
        )

    def _apply(self, fn, recurse=True):
        """Device moves apply; dtype casts do not (the window and filterbank stay fp32)."""
        super()._apply(fn, recurse)
        self.spectrogram.window = self.spectrogram.window.float()
        self.mel_scale.fb = self.mel_scale.fb.float()
        return self

    def forward(self, audio: Tensor) -> Tensor:
        shape = audio.shape
        window = self.spectrogram.window.float()
        spec = torch.stft(
            audio.reshape(-1, shape[-1]).float(),
            n_fft=self.n_fft,
            hop_length=self.hop_length,
            win_length=self.win_length,
            window=window,
            center=True,
            pad_mode="reflect",
            normalized=False,
            onesided=True,
            return_complex=True,
        ).abs()
        if self.power != 1.0:
            spec = spec.pow(self.power)
        mel = torch.matmul(spec.transpose(-1, -2), self.mel_scale.fb.float()).transpose(-1, -2)
        return mel.reshape(*shape[:-1], mel.shape[-2], mel.shape[-1])
