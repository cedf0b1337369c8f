import math

import numpy as np
import pytest
import torch
from scipy.signal import resample_poly

from tritontts.dsp.resample import resample

RATE_PAIRS = [(8000, 16000), (22050, 16000), (24000, 16000), (44100, 16000), (48000, 16000), (16000, 24000)]


def _tone(freq: float, rate: int, seconds: float = 1.0) -> np.ndarray:
    return np.sin(2 * np.pi * freq * np.arange(int(rate * seconds)) / rate)


def _interior(x: np.ndarray) -> np.ndarray:
    return x[len(x) // 10 : -len(x) // 10]


@pytest.mark.parametrize(("orig", "target"), RATE_PAIRS)
def test_tones_in_the_passband_are_kept(orig, target):
    for freq in (440.0, 1000.0, 3000.0):
        out = resample(_tone(freq, orig), orig, target)
        assert len(out) == math.ceil(orig * target / orig)
        exact = _tone(freq, target)
        assert np.abs(_interior(out - exact)).max() < 1e-4
        g = math.gcd(orig, target)
        reference = resample_poly(_tone(freq, orig), target // g, orig // g)
        assert np.abs(_interior(out - reference[: len(out)])).max() < 5e-3


@pytest.mark.parametrize("orig", [22050, 24000, 44100, 48000])
def test_tones_above_the_new_nyquist_are_removed(orig):
    for freq in (9000.0, 10000.0, min(orig / 2 - 500, 20000.0)):
        out = resample(_tone(freq, orig), orig, 16000)
        assert 20 * np.log10(np.abs(_interior(out)).max()) < -80


@pytest.mark.parametrize(
    ("orig", "target", "length"), [(44100, 16000, 1001), (16000, 24000, 7), (8000, 16000, 1)]
)
def test_output_length(orig, target, length):
    assert resample(np.zeros(length), orig, target).shape == (math.ceil(length * target / orig),)


def test_types_shapes_and_dtypes_are_kept():
    batch = np.stack([_tone(500.0, 48000, 0.1), _tone(700.0, 48000, 0.1)]).astype(np.float32)
    out = resample(batch, 48000, 16000)
    assert isinstance(out, np.ndarray) and out.dtype == np.float32 and out.shape == (2, 1600)
    tensor_out = resample(torch.from_numpy(batch), 48000, 16000)
    assert isinstance(tensor_out, torch.Tensor) and tensor_out.dtype == torch.float32
    np.testing.assert_allclose(tensor_out.numpy(), out, atol=1e-6)
    same = resample(batch, 16000, 16000)
    assert np.array_equal(same, batch) and same is not batch


def test_agrees_with_librosa_soxr_on_band_limited_noise():
    librosa = pytest.importorskip("librosa")
    rng = np.random.default_rng(0)
    spectrum = np.fft.rfft(rng.standard_normal(44100))
    spectrum[np.fft.rfftfreq(44100, 1 / 44100) > 6000] = 0
    noise = np.fft.irfft(spectrum, 44100)
    ours = resample(noise, 44100, 16000)
    theirs = librosa.resample(noise, orig_sr=44100, target_sr=16000, res_type="soxr_hq")
    assert ours.shape == theirs.shape
    error = _interior(ours - theirs)
    assert np.sqrt(np.mean(error**2)) < 1e-3 * np.sqrt(np.mean(_interior(theirs) ** 2))
