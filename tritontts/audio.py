"""Reading and checking reference audio at the edge, before any model sees it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile

from tritontts.dsp.resample import resample


class AudioError(ValueError):
    """Audio that no model should be given; the message says what is wrong."""


@dataclass(frozen=True)
class AudioLimits:
    min_seconds: float = 0.1
    max_seconds: float = 30.0


def check_waveform(
    wav: np.ndarray, sample_rate: int, limits: AudioLimits = AudioLimits(), name: str = "audio"
) -> np.ndarray:
    """A 1-D float32 copy of `wav`, or an AudioError naming `name` and the problem."""
    wav = np.asarray(wav)
    if wav.ndim == 2 and 1 in wav.shape:
        wav = wav.reshape(-1)
    if wav.ndim != 1:
        raise AudioError(f"{name} must be mono (1-D samples), got shape {tuple(wav.shape)}")
    if wav.size == 0:
        raise AudioError(f"{name} is empty")
    if not np.issubdtype(wav.dtype, np.floating):
        raise AudioError(f"{name} must be float samples in [-1, 1], got dtype {wav.dtype}")
    if not np.all(np.isfinite(wav)):
        raise AudioError(f"{name} contains NaN or infinite samples")
    seconds = wav.size / sample_rate
    if seconds < limits.min_seconds:
        raise AudioError(f"{name} is {seconds:.3f} s long; at least {limits.min_seconds} s is needed")
    if seconds > limits.max_seconds:
        raise AudioError(f"{name} is {seconds:.1f} s long; at most {limits.max_seconds} s is accepted")
    return wav.astype(np.float32, copy=True)


def to_mono(wav: np.ndarray) -> np.ndarray:
    """The first channel of a [samples, channels] array, as upstream Spark-TTS reads files."""
    return wav[:, 0] if wav.ndim == 2 else wav


def load_wav(
    path: str | Path, target_rate: int, limits: AudioLimits = AudioLimits(), name: str | None = None
) -> np.ndarray:
    """Read an audio file as mono float32 at `target_rate`, checked against `limits`."""
    name = name or str(path)
    try:
        wav, rate = soundfile.read(str(path), dtype="float32", always_2d=False)
    except (RuntimeError, soundfile.LibsndfileError) as err:
        raise AudioError(f"cannot read {name}: {err}") from err
    wav = to_mono(wav)
    if rate != target_rate and wav.size:
        wav = resample(wav, rate, target_rate)
    return check_waveform(wav, target_rate, limits, name)
