"""CosyVoice2's front-end features against the formulas written out in numpy (float64) and librosa."""

from __future__ import annotations

import librosa
import numpy as np
import pytest
import soundfile
import torch
from numpy.lib.stride_tricks import sliding_window_view
from tolerance import max_error, within

from tritontts.dsp.hann_sinc_resample import hann_sinc_resample
from tritontts.dsp.kaldi_fbank import fbank_num_frames, kaldi_fbank
from tritontts.dsp.matcha_mel import matcha_mel, matcha_num_frames
from tritontts.dsp.resample import resample
from tritontts.dsp.whisper_mel import whisper_log_mel, whisper_num_frames


@pytest.fixture(scope="module")
def speech(prompt_zh) -> np.ndarray:
    """Three seconds of real 16 kHz speech."""
    wav, rate = soundfile.read(str(prompt_zh), dtype="float32")
    assert rate == 16000
    return wav[16000:64000]


def _periodic_hann(n: int) -> np.ndarray:
    return np.hanning(n + 1)[:-1]


def _frames(x: np.ndarray, size: int, hop: int) -> np.ndarray:
    return sliding_window_view(x, size)[::hop]


def whisper_reference(x: np.ndarray, n_mels: int = 128) -> np.ndarray:
    padded = np.pad(x.astype(np.float64), 200, mode="reflect")
    power = np.abs(np.fft.rfft(_frames(padded, 400, 160) * _periodic_hann(400), axis=-1)) ** 2
    mel = librosa.filters.mel(sr=16000, n_fft=400, n_mels=n_mels, dtype=np.float64) @ power[:-1].T
    log = np.log10(np.maximum(mel, 1e-10))
    log = np.maximum(log, log.max() - 8.0)
    return (log + 4.0) / 4.0


def kaldi_fbank_reference(x: np.ndarray, num_bins: int = 80) -> np.ndarray:
    frames = _frames(x.astype(np.float64), 400, 160).copy()
    frames -= frames.mean(axis=1, keepdims=True)
    frames[:, 1:] -= 0.97 * frames[:, :-1].copy()
    frames[:, 0] -= 0.97 * frames[:, 0]
    n = np.arange(400)
    povey = (0.5 - 0.5 * np.cos(2 * np.pi * n / 399)) ** 0.85
    power = np.abs(np.fft.rfft(frames * povey, n=512, axis=-1)) ** 2

    def mel(f):
        return 1127.0 * np.log(1.0 + f / 700.0)

    edges = np.linspace(mel(20.0), mel(8000.0), num_bins + 2)
    bin_mels = mel(np.arange(257) * 16000 / 512)
    banks = np.zeros((num_bins, 257))
    for b in range(num_bins):
        left, center, right = edges[b : b + 3]
        up = (bin_mels - left) / (center - left)
        down = (right - bin_mels) / (right - center)
        banks[b] = np.maximum(0.0, np.minimum(up, down))
    banks[:, 256] = 0.0
    return np.log(np.maximum(power @ banks.T, np.finfo(np.float32).eps))


def matcha_reference(x: np.ndarray) -> np.ndarray:
    padded = np.pad(x.astype(np.float64), (1920 - 480) // 2, mode="reflect")
    spec = np.fft.rfft(_frames(padded, 1920, 480) * _periodic_hann(1920), axis=-1)
    magnitude = np.sqrt(spec.real**2 + spec.imag**2 + 1e-9)
    mel = librosa.filters.mel(sr=24000, n_fft=1920, n_mels=80, fmin=0, fmax=8000, dtype=np.float64)
    return np.log(np.maximum(mel @ magnitude.T, 1e-5))


@pytest.mark.golden
def test_whisper_log_mel_matches_the_formula(speech):
    for length in (len(speech), 1600, 16159):
        x = speech[:length]
        ours = whisper_log_mel(torch.from_numpy(x)).numpy()
        assert ours.shape == (128, length // 160) == (128, whisper_num_frames(length))
        within(f"whisper log mel, {length} samples", max_error(ours, whisper_reference(x)), 1e-4)


@pytest.mark.golden
def test_kaldi_fbank_matches_the_formula(speech):
    for length in (len(speech), 400, 16159):
        x = speech[:length]
        ours = kaldi_fbank(torch.from_numpy(x)).numpy()
        assert ours.shape == (1 + (length - 400) // 160, 80) == (fbank_num_frames(length), 80)
        within(f"kaldi fbank, {length} samples", max_error(ours, kaldi_fbank_reference(x)), 1e-3)


def test_kaldi_fbank_rejects_audio_shorter_than_one_frame():
    with pytest.raises(ValueError, match="at least 400 samples"):
        kaldi_fbank(torch.zeros(399))


@pytest.mark.golden
def test_matcha_mel_matches_librosa_filters_and_a_plain_stft(speech):
    wav_24k = resample(speech, 16000, 24000)
    for length in (len(wav_24k), 2400, 24479):
        x = wav_24k[:length]
        ours = matcha_mel(torch.from_numpy(x)).numpy()
        assert ours.shape == (80, length // 480) == (80, matcha_num_frames(length))
        within(f"matcha mel, {length} samples", max_error(ours, matcha_reference(x)), 5e-4)


def test_matcha_mel_batches_like_single_calls(speech):
    batch = torch.from_numpy(np.stack([speech[:24000], speech[24000:48000]]))
    np.testing.assert_allclose(matcha_mel(batch)[1].numpy(), matcha_mel(batch[1]).numpy(), atol=1e-5)


def test_hann_sinc_resample_keeps_a_tone_and_the_length_rule():
    t16 = np.arange(16001) / 16000
    out = hann_sinc_resample(torch.from_numpy(np.sin(2 * np.pi * 1000 * t16)), 16000, 24000).numpy()
    assert out.shape == (24002,)
    t24 = np.arange(24002) / 24000
    np.testing.assert_allclose(out[200:-200], np.sin(2 * np.pi * 1000 * t24)[200:-200], atol=2e-3)


def test_hann_sinc_resample_agrees_with_the_kaiser_resampler_in_band(speech):
    low_band = librosa.effects.preemphasis(speech, coef=-0.95)
    ours = hann_sinc_resample(torch.from_numpy(low_band), 16000, 24000).numpy()
    kaiser = resample(low_band, 16000, 24000)
    assert ours.shape == kaiser.shape
    assert np.sqrt(np.mean((ours - kaiser) ** 2)) < 0.01 * np.sqrt(np.mean(kaiser**2))
