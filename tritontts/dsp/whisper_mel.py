"""Whisper's 128-bin log-mel spectrogram (the speech tokenizer's input) in plain torch.

Same formula as `whisper.log_mel_spectrogram(audio, n_mels=128)`: centered STFT (reflect padding, periodic
Hann window, n_fft 400, hop 160 at 16 kHz), the last frame dropped, power spectrum through librosa's slaney
filters, `log10(clamp(x, 1e-10))`, floored at its maximum minus 8, then `(x + 4) / 4`.
"""

from __future__ import annotations

from functools import lru_cache

import torch
from torch import Tensor

from tritontts.dsp.mel import mel_filterbank

WHISPER_SAMPLE_RATE = 16000
WHISPER_N_FFT = 400
WHISPER_HOP = 160


@lru_cache(maxsize=4)
def _whisper_filters(n_mels: int) -> Tensor:
    """`[n_mels, n_fft // 2 + 1]`, equal to `librosa.filters.mel(sr=16000, n_fft=400, n_mels=n_mels)`."""
    fb = mel_filterbank(
        WHISPER_N_FFT // 2 + 1,
        0.0,
        WHISPER_SAMPLE_RATE / 2,
        n_mels,
        WHISPER_SAMPLE_RATE,
        norm="slaney",
        mel_scale="slaney",
    )
    return fb.T.contiguous()


def whisper_num_frames(num_samples: int) -> int:
    """Frames of `whisper_log_mel` for a 16 kHz waveform of `num_samples`: 100 per second, rounded down."""
    return num_samples // WHISPER_HOP


def whisper_log_mel(audio: Tensor, n_mels: int = 128) -> Tensor:
    """16 kHz mono audio `[L]` → fp32 `[n_mels, L // 160]` (the floor uses this utterance's maximum)."""
    if audio.ndim != 1:
        raise ValueError(f"whisper_log_mel takes one mono waveform [L], got shape {tuple(audio.shape)}")
    audio = audio.float()
    window = torch.hann_window(WHISPER_N_FFT, device=audio.device)
    stft = torch.stft(audio, WHISPER_N_FFT, WHISPER_HOP, window=window, center=True, return_complex=True)
    power = stft[..., :-1].abs() ** 2
    mel = _whisper_filters(n_mels).to(audio.device) @ power
    log_spec = torch.clamp(mel, min=1e-10).log10()
    log_spec = torch.maximum(log_spec, log_spec.max() - 8.0)
    return (log_spec + 4.0) / 4.0
