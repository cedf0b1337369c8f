import math

import librosa
import numpy as np
import pytest
import torch
from tolerance import max_error, within

from tritontts.dsp.mel import MelSpectrogram, mel_filterbank


def _torchaudio_fbanks(n_freqs, f_min, f_max, n_mels, sample_rate, norm, mel_scale):
    """torchaudio.functional.melscale_fbanks, written out in numpy (float64)."""

    def hz_to_mel(f):
        if mel_scale == "htk":
            return 2595.0 * math.log10(1.0 + f / 700.0)
        mels = f / (200.0 / 3)
        if f >= 1000.0:
            mels = 1000.0 / (200.0 / 3) + math.log(f / 1000.0) / (math.log(6.4) / 27.0)
        return mels

    def mel_to_hz(m):
        if mel_scale == "htk":
            return 700.0 * (10.0 ** (m / 2595.0) - 1.0)
        freqs = m * (200.0 / 3)
        min_log_mel = 1000.0 / (200.0 / 3)
        log = m >= min_log_mel
        freqs[log] = 1000.0 * np.exp(math.log(6.4) / 27.0 * (m[log] - min_log_mel))
        return freqs

    all_freqs = np.linspace(0, sample_rate // 2, n_freqs)
    f_pts = mel_to_hz(np.linspace(hz_to_mel(f_min), hz_to_mel(f_max), n_mels + 2))
    f_diff = f_pts[1:] - f_pts[:-1]
    slopes = f_pts[None, :] - all_freqs[:, None]
    down = -slopes[:, :-2] / f_diff[:-1]
    up = slopes[:, 2:] / f_diff[1:]
    fb = np.maximum(0.0, np.minimum(down, up))
    if norm == "slaney":
        fb *= 2.0 / (f_pts[2 : n_mels + 2] - f_pts[:n_mels])
    return fb


@pytest.mark.parametrize("mel_scale", ["slaney", "htk"])
@pytest.mark.parametrize("norm", ["slaney", None])
def test_filterbank_matches_torchaudio_formula(mel_scale, norm):
    ours = mel_filterbank(513, 10.0, 8000.0, 128, 16000, norm=norm, mel_scale=mel_scale).numpy()
    ref = _torchaudio_fbanks(513, 10.0, 8000.0, 128, 16000, norm, mel_scale)
    assert ours.shape == (513, 128)
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=5e-5 * ref.max())


@pytest.mark.golden
@pytest.mark.parametrize("mel_scale", ["slaney", "htk"])
def test_mel_spectrogram_matches_librosa(mel_scale):
    rng = np.random.default_rng(0)
    audio = (0.1 * rng.standard_normal(16000 + 123)).astype(np.float32)
    ours = MelSpectrogram(
        16000, 1024, 640, 320, 10, None, n_mels=128, power=1.0, norm="slaney", mel_scale=mel_scale
    )
    mel = ours(torch.from_numpy(audio)).numpy()
    ref = librosa.feature.melspectrogram(
        y=audio.astype(np.float64),
        sr=16000,
        n_fft=1024,
        hop_length=320,
        win_length=640,
        window="hann",
        center=True,
        pad_mode="reflect",
        power=1.0,
        n_mels=128,
        fmin=10,
        fmax=8000,
        htk=mel_scale == "htk",
        norm="slaney",
    )
    assert mel.shape == ref.shape == (128, len(audio) // 320 + 1)
    within("mel over max |mel|", max_error(mel, ref) / float(np.abs(ref).max()), 1e-4)


def test_batch_shape_and_buffers_stay_fp32():
    mel = MelSpectrogram(
        16000, 1024, 640, 320, 10, None, n_mels=32, power=1.0, norm="slaney", mel_scale="slaney"
    )
    assert set(mel.state_dict()) == {"spectrogram.window", "mel_scale.fb"}
    mel = mel.to(torch.bfloat16)
    assert mel.spectrogram.window.dtype == torch.float32 and mel.mel_scale.fb.dtype == torch.float32
    out = mel(torch.randn(3, 3200))
    assert out.shape == (3, 32, 11) and out.dtype == torch.float32
