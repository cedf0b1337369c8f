"""An inverse STFT that CUDA graphs can capture: `torch.istft` checks its window envelope on the host (a
device-to-host read), which a graph capture refuses. Same framing as `torch.istft(..., center=True)`."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def istft(spectrum: Tensor, n_fft: int, hop: int, window: Tensor) -> Tensor:
    """Complex one-sided `spectrum [B, n_fft // 2 + 1, frames]` → audio `[B, hop * (frames - 1)]`: each
    frame's inverse FFT, windowed, overlap-added and divided by the summed squared window, centre padding
    removed."""
    frames = spectrum.shape[-1]
    length = n_fft + hop * (frames - 1)
    segments = torch.fft.irfft(spectrum, n=n_fft, dim=1) * window[:, None]
    fold = dict(output_size=(1, length), kernel_size=(1, n_fft), stride=(1, hop))
    audio = F.fold(segments, **fold).reshape(spectrum.shape[0], length)
    envelope = F.fold(window.square()[None, :, None].expand(1, n_fft, frames), **fold).reshape(1, length)
    half = n_fft // 2
    return audio[:, half : length - half] / envelope[:, half : length - half]
