import hashlib

import pytest
import torch

from tritontts.checkpoint import CheckpointError
from tritontts.cosyvoice2.hift import HiFT, HiFTConfig, load_hift
from tritontts.spark.config import ConfigError
from tritontts.synthetic.cosyvoice2_hift import meta_state_dict, preset_config, random_state_dict, write_hift

# The `hift:` section of the reference cosyvoice2.yaml as the config loader hands it over (tags dropped).
REFERENCE_SECTION = {
    "in_channels": 80,
    "base_channels": 512,
    "nb_harmonics": 8,
    "sampling_rate": 24000,
    "nsf_alpha": 0.1,
    "nsf_sigma": 0.003,
    "nsf_voiced_threshold": 10,
    "upsample_rates": [8, 5, 3],
    "upsample_kernel_sizes": [16, 11, 7],
    "istft_params": {"n_fft": 16, "hop_len": 4},
    "resblock_kernel_sizes": [3, 7, 11],
    "resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5], [1, 3, 5]],
    "source_resblock_kernel_sizes": [7, 7, 11],
    "source_resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5], [1, 3, 5]],
    "lrelu_slope": 0.1,
    "audio_limit": 0.99,
    "f0_predictor": {"num_class": 1, "in_channels": 80, "cond_channels": 512},
}
TINY = preset_config("tiny")


@pytest.fixture(scope="module")
def hift_path(tmp_path_factory):
    return write_hift(tmp_path_factory.mktemp("hift"), "tiny", seed=0)


@pytest.fixture(scope="module")
def hift(hift_path):
    return load_hift(hift_path, TINY)


def _mel(frames: int, seed: int = 0, batch: int = 1) -> torch.Tensor:
    return torch.randn(batch, 80, frames, generator=torch.Generator().manual_seed(seed)) - 4.0


def _noise(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_config_from_reference_yaml_section():
    assert HiFTConfig.from_yaml_dict(REFERENCE_SECTION) == HiFTConfig()
    assert HiFTConfig().samples_per_frame == 480
    tiny = {
        **REFERENCE_SECTION,
        "base_channels": 32,
        "f0_predictor": {"num_class": 1, "in_channels": 80, "cond_channels": 32},
    }
    assert HiFTConfig.from_yaml_dict(tiny) == TINY


def test_config_errors_name_the_key():
    with pytest.raises(ConfigError, match="lrelu_slope"):
        HiFTConfig.from_yaml_dict({k: v for k, v in REFERENCE_SECTION.items() if k != "lrelu_slope"})
    with pytest.raises(ConfigError, match="conv_pre_look_right"):
        HiFTConfig.from_yaml_dict({**REFERENCE_SECTION, "conv_pre_look_right": 4})
    with pytest.raises(ConfigError, match="22050"):
        HiFTConfig.from_yaml_dict({**REFERENCE_SECTION, "sampling_rate": 22050})


def test_full_preset_has_the_official_keys_and_shapes():
    shapes = {k: tuple(v.shape) for k, v in meta_state_dict("full").items()}
    # 328 tensors, 20,821,295 parameters: the same as upstream HiFTGenerator built from the reference yaml.
    assert len(shapes) == 328
    assert sum(torch.Size(s).numel() for s in shapes.values()) == 20_821_295
    assert shapes["m_source.l_linear.weight"] == (1, 9)
    assert shapes["conv_pre.parametrizations.weight.original0"] == (512, 1, 1)
    assert shapes["conv_pre.parametrizations.weight.original1"] == (512, 80, 7)
    assert shapes["ups.0.parametrizations.weight.original0"] == (512, 1, 1)
    assert shapes["ups.2.parametrizations.weight.original1"] == (128, 64, 7)
    assert shapes["source_downs.0.weight"] == (256, 18, 30)
    assert shapes["source_downs.1.weight"] == (128, 18, 6)
    assert shapes["source_downs.2.weight"] == (64, 18, 1)
    assert shapes["resblocks.8.convs1.2.parametrizations.weight.original1"] == (64, 64, 11)
    assert shapes["source_resblocks.2.activations2.2.alpha"] == (64,)
    assert shapes["conv_post.parametrizations.weight.original1"] == (18, 64, 7)
    assert shapes["f0_predictor.condnet.8.parametrizations.weight.original1"] == (512, 512, 3)
    assert shapes["f0_predictor.classifier.weight"] == (1, 512)
    assert not any("stft_window" in k for k in shapes)


def test_write_hift_is_reproducible(tmp_path):
    first = write_hift(tmp_path / "a", "tiny", seed=3).read_bytes()
    second = write_hift(tmp_path / "b", "tiny", seed=3).read_bytes()
    other = write_hift(tmp_path / "c", "tiny", seed=4).read_bytes()
    assert hashlib.sha256(first).digest() == hashlib.sha256(second).digest()
    assert first != other


@pytest.mark.parametrize(
    ("edit", "key"),
    [
        (lambda s: s.pop("conv_post.bias"), "conv_post.bias"),
        (lambda s: s.update({"ups.3.bias": torch.zeros(2)}), "ups.3.bias"),
        (
            lambda s: s.update({"f0_predictor.classifier.weight": torch.zeros(1, 7)}),
            "f0_predictor.classifier.weight",
        ),
    ],
)
def test_strict_loading_names_the_bad_key(tmp_path, edit, key):
    state = random_state_dict("tiny", 0)
    edit(state)
    torch.save(state, tmp_path / "hift.pt")
    with pytest.raises(CheckpointError, match=key.replace(".", r"\.")):
        load_hift(tmp_path, TINY)


def test_generator_prefix_and_legacy_weight_norm_names_load(tmp_path, hift):
    state = random_state_dict("tiny", 0)
    legacy = {}
    for key, value in state.items():
        key = key.replace("parametrizations.weight.original0", "weight_g")
        legacy["generator." + key.replace("parametrizations.weight.original1", "weight_v")] = value
    torch.save(legacy, tmp_path / "hift.pt")
    mel = _mel(6)
    expected, _ = hift.inference(mel, generator=_noise(0))
    audio, _ = load_hift(tmp_path, TINY).inference(mel, generator=_noise(0))
    torch.testing.assert_close(audio, expected, rtol=0, atol=0)


def test_unfused_module_matches_fused(hift_path, hift):
    unfused = load_hift(hift_path, TINY, fuse=False)
    assert "conv_pre.parametrizations.weight.original0" in unfused.state_dict()
    mel = _mel(9)
    a, _ = unfused.inference(mel, generator=_noise(1))
    b, _ = hift.inference(mel, generator=_noise(1))
    torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_output_length_range_and_source(hift):
    mel = _mel(23, batch=2)
    audio, source = hift.inference(mel, generator=_noise(0))
    assert audio.shape == (2, 23 * 480)
    assert source.shape == (2, 1, 23 * 480)
    assert audio.abs().max() <= 0.99
    assert audio.std() > 1e-3 and torch.isfinite(audio).all()
    assert source.dtype == torch.float32 and source.abs().max() < 1.0


def test_noise_is_seeded(hift):
    mel = _mel(12)
    a, _ = hift.inference(mel, generator=_noise(5))
    b, _ = hift.inference(mel, generator=_noise(5))
    c, _ = hift.inference(mel, generator=_noise(6))
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert (a - c).abs().max() > 1e-4


def test_noise_is_upstreams_global_rng_stream(hift):
    """A generator seeded s draws what upstream draws from torch's global RNG after torch.manual_seed(s)."""
    mel = _mel(5)
    torch.manual_seed(11)
    a, _ = hift.inference(mel)
    b, _ = hift.inference(mel, generator=_noise(11))
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_cache_source_replaces_the_start_of_the_source(hift):
    mel = _mel(20)
    cache = 0.05 * torch.randn(1, 1, 8 * 480, generator=_noise(2))
    _, plain = hift.inference(mel, generator=_noise(3))
    _, cached = hift.inference(mel, cache, generator=_noise(3))
    torch.testing.assert_close(cached[:, :, : 8 * 480], cache, rtol=0, atol=0)
    torch.testing.assert_close(cached[:, :, 8 * 480 :], plain[:, :, 8 * 480 :], rtol=0, atol=0)
    with pytest.raises(ValueError, match="cache_source"):
        hift.inference(_mel(4), cache)


def test_decode_is_local_in_time(hift):
    """Audio far from a change in the mel does not move: the receptive field is 13 mel frames each side."""
    mel = _mel(60)
    source = 0.05 * torch.randn(1, 1, 60 * 480, generator=_noise(4))
    edited = mel.clone()
    edited[:, :, 50:] += 1.0
    with torch.inference_mode():
        a = hift.decode(mel, source)
        b = hift.decode(edited, source)
    torch.testing.assert_close(a[:, : 36 * 480], b[:, : 36 * 480], rtol=0, atol=1e-6)
    assert (a[:, 50 * 480 :] - b[:, 50 * 480 :]).abs().max() > 1e-4


def test_hift_module_builds_from_config():
    model = HiFT(TINY)
    assert set(model.state_dict()) == set(random_state_dict("tiny", 0))
