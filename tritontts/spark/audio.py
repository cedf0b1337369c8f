"""Reference-audio preparation for BiCodec: volume normalisation and the fixed-length speaker clip."""

from __future__ import annotations

import numpy as np


def volume_normalize(wav: np.ndarray, coeff: float = 0.2) -> np.ndarray:
    """Scale so the loud part (90th–99th percentile of |x| above 0.01) sits near `coeff`; peak ≤ 1."""
    magnitudes = np.sort(np.abs(wav))
    if magnitudes[-1] < 0.1:
        wav = wav / max(magnitudes[-1], 1e-3) * 0.1
    loud = magnitudes[magnitudes > 0.01]
    count = loud.shape[0]
    if count <= 10:
        return wav
    volume = np.mean(loud[int(0.9 * count) : int(0.99 * count)])
    wav = wav * np.clip(coeff / volume, a_min=0.1, a_max=10)
    peak = np.max(np.abs(wav))
    return wav / peak if peak > 1 else wav


def reference_clip(wav: np.ndarray, ref_segment_length: int) -> np.ndarray:
    """The first `ref_segment_length` samples, tiling the audio first when it is shorter."""
    if len(wav) == 0:
        raise ValueError("reference audio is empty")
    if len(wav) < ref_segment_length:
        wav = np.tile(wav, ref_segment_length // len(wav) + 1)
    return wav[:ref_segment_length]
