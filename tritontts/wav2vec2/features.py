"""Turning utterances into the normalised, right-padded batch wav2vec2 reads."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

NORM_EPS = 1e-7  # Wav2Vec2FeatureExtractor.zero_mean_unit_var_norm


def as_waveform_list(
    wavs: Sequence[np.ndarray | torch.Tensor] | torch.Tensor | np.ndarray,
) -> list[torch.Tensor]:
    """One 1-D float tensor per utterance; a 2-D array or tensor is a batch of equal-length utterances."""
    if isinstance(wavs, (torch.Tensor, np.ndarray)):
        wavs = [wavs] if wavs.ndim == 1 else list(wavs)
    out = []
    for i, wav in enumerate(wavs):
        tensor = torch.as_tensor(wav)
        if tensor.ndim != 1:
            raise ValueError(f"utterance {i} must be 1-D mono audio, got shape {tuple(tensor.shape)}")
        if tensor.numel() == 0:
            raise ValueError(f"utterance {i} is empty")
        out.append(tensor)
    if not out:
        raise ValueError("no utterances given")
    return out


def normalize_and_pad(
    wavs: Sequence[np.ndarray | torch.Tensor] | torch.Tensor | np.ndarray,
    device: torch.device | str = "cpu",
    normalize: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_values [B, S] float32, lengths [B]): each utterance zero-mean / unit-variance over its own samples,
    then right-padded with zeros, as `Wav2Vec2FeatureExtractor(do_normalize=True, padding=True)` does."""
    waveforms = as_waveform_list(wavs)
    lengths = torch.tensor([w.numel() for w in waveforms], dtype=torch.long)
    batch = torch.zeros(len(waveforms), int(lengths.max()), dtype=torch.float32, device=device)
    for row, wav in zip(batch, waveforms):
        wav = wav.to(device=device, dtype=torch.float32)
        if normalize:
            var, mean = torch.var_mean(wav, correction=0)
            wav = (wav - mean) / torch.sqrt(var + NORM_EPS)
        row[: wav.numel()] = wav
    return batch, lengths.to(device)
