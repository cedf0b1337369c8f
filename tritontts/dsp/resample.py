"""Band-limited resampling by a rational factor: Kaiser-windowed sinc, applied polyphase."""

from __future__ import annotations

import math
import sys
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

ZERO_CROSSINGS = 16
ROLLOFF = 0.94
KAISER_BETA = 8.6


@lru_cache(maxsize=32)
def _polyphase_kernels(orig: int, new: int) -> tuple[np.ndarray, int]:
    """One filter per output phase, each spanning `2 * width + orig` input samples, and `width`."""
    cutoff = min(orig, new) * ROLLOFF
    width = math.ceil(ZERO_CROSSINGS * orig / cutoff)
    taps = np.arange(-width, width + orig, dtype=np.float64) / orig
    phases = np.arange(0, -new, -1, dtype=np.float64)[:, None] / new
    t = (phases + taps[None, :]) * cutoff
    t = np.clip(t, -ZERO_CROSSINGS, ZERO_CROSSINGS)
    window = np.i0(KAISER_BETA * np.sqrt(1 - (t / ZERO_CROSSINGS) ** 2)) / np.i0(KAISER_BETA)
    kernels = np.sinc(t) * window * (cutoff / orig)
    return kernels, width


def _resample_numpy(wav: np.ndarray, orig_sr: int, target_sr: int) -> np.ndarray:
    g = math.gcd(orig_sr, target_sr)
    orig, new = orig_sr // g, target_sr // g
    kernels, width = _polyphase_kernels(orig, new)
    shape = wav.shape
    signal = wav.reshape(-1, shape[-1]).astype(np.float64)
    length = shape[-1]
    padded = np.pad(signal, ((0, 0), (width, width + orig)))
    frames = np.lib.stride_tricks.sliding_window_view(padded, kernels.shape[1], axis=-1)[:, ::orig]
    out = np.matmul(frames, kernels.T).reshape(signal.shape[0], -1)
    target_length = math.ceil(new * length / orig)
    return out[:, :target_length].reshape(*shape[:-1], target_length)


def resample(wav: np.ndarray | torch.Tensor, orig_sr: int, target_sr: int) -> np.ndarray | torch.Tensor:
    """Resample along the last axis; returns the input's type, dtype (and device for tensors).

    Output length is `ceil(len * target_sr / orig_sr)`; frequencies above 94% of the lower Nyquist rate are
    removed (Kaiser window, beta 8.6, 16 zero crossings each side). Imports no torch: a process that has none
    (a BLS stub) holds no tensor.
    """
    if orig_sr <= 0 or target_sr <= 0:
        raise ValueError(f"sample rates must be positive, got {orig_sr} and {target_sr}")
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(wav, torch.Tensor):
        if orig_sr == target_sr:
            return wav.clone()
        out = _resample_numpy(wav.detach().cpu().double().numpy(), orig_sr, target_sr)
        return torch.from_numpy(out).to(dtype=wav.dtype, device=wav.device)
    wav = np.asarray(wav)
    if orig_sr == target_sr:
        return wav.copy()
    out_dtype = wav.dtype if np.issubdtype(wav.dtype, np.floating) else np.float32
    return _resample_numpy(wav, orig_sr, target_sr).astype(out_dtype)
