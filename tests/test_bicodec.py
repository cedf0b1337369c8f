import json
import re
import shutil

import numpy as np
import pytest
import torch

from tritontts.checkpoint import CheckpointError, read_state_dict, write_safetensors
from tritontts.spark.audio import reference_clip, volume_normalize
from tritontts.spark.bicodec import BiCodec, load_bicodec
from tritontts.spark.config import BiCodecConfig, ConfigError, SparkAudioConfig
from tritontts.spark.quantizers import FiniteScalarQuantizer
from tritontts.synthetic.bicodec import FULL_CONFIG, full_state_shapes, meta_state_dict, write_bicodec

# The hub's BiCodec/model.safetensors is 625,783,920 bytes (header + data, no metadata).
OFFICIAL_FILE_BYTES = 625_783_920


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("spark")
    write_bicodec(path, preset="tiny", seed=0)
    return path


@pytest.fixture(scope="module")
def model(model_dir):
    return load_bicodec(model_dir / "BiCodec")


def _inputs(batch=2, frames=12, ref_len=4800, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, frames, 32, generator=gen), 0.1 * torch.randn(batch, ref_len, generator=gen)


def _safetensors_file_bytes(state):
    """Size of a safetensors file holding `state` (sorted by alignment then name, no metadata)."""
    names = {torch.float32: "F32", torch.int64: "I64"}
    header, offset = {}, 0
    for key, t in sorted(state.items(), key=lambda kv: (-kv[1].element_size(), kv[0])):
        size = t.numel() * t.element_size()
        header[key] = {
            "dtype": names[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    text = len(json.dumps(header, separators=(",", ":")))
    return 8 + text + (-text) % 8 + offset


def test_configs_read(model_dir):
    audio = SparkAudioConfig.from_yaml(model_dir / "config.yaml")
    assert audio.ref_segment_length == 96000
    cfg = BiCodecConfig.from_yaml(model_dir / "BiCodec" / "config.yaml")
    assert cfg.decoder.hop_length == 320 and cfg.speaker_encoder.token_num == 32


def test_config_errors():
    raw = json.loads(json.dumps(FULL_CONFIG))
    del raw["audio_tokenizer"]["decoder"]["rates"]
    with pytest.raises(ConfigError, match="rates"):
        BiCodecConfig.from_dict(raw)
    raw = json.loads(json.dumps(FULL_CONFIG))
    raw["audio_tokenizer"]["prenet"]["bogus"] = 1
    with pytest.raises(ConfigError, match="bogus"):
        BiCodecConfig.from_dict(raw)


def test_full_preset_matches_official_layout():
    shapes = full_state_shapes()
    assert len(shapes) == 842
    assert shapes["quantizer.in_project.weight_g"] == (8, 1, 1)
    assert shapes["quantizer.in_project.weight_v"] == (8, 1024, 1)
    assert shapes["quantizer.codebook.weight"] == (8192, 8)
    assert shapes["quantizer.cluster_size"] == (8192,)
    assert shapes["decoder.model.1.block.1.weight_v"] == (1536, 768, 16)
    assert shapes["decoder.model.6.weight_v"] == (1, 96, 7)
    assert shapes["prenet.vocos_backbone.convnext.11.norm.scale.weight"] == (384, 1024)
    assert shapes["encoder.downsample.1.1.convnext.1.gamma"] == (384,)
    assert shapes["speaker_encoder.perceiver_sampler.layers.1.1.0.weight"] == (682, 128)
    assert shapes["speaker_encoder.quantizer.project_in.weight"] == (6, 128)
    assert shapes["speaker_encoder.project.weight"] == (1024, 4096)
    assert shapes["speaker_encoder.speaker_encoder.layer2.se_res2block.1.convs.6.weight"] == (64, 64, 3)
    assert shapes["mel_transformer.mel_scale.fb"] == (513, 128)
    assert shapes["mel_transformer.spectrogram.window"] == (640,)
    state = meta_state_dict("full")
    assert sum(t.numel() * t.element_size() for t in state.values()) == 625_683_736
    assert _safetensors_file_bytes(state) == OFFICIAL_FILE_BYTES


def test_tiny_has_full_structure(model_dir):
    tiny = set(read_state_dict(model_dir / "BiCodec" / "model.safetensors"))
    full = set(full_state_shapes())
    assert tiny <= full

    def pattern(keys):
        return {re.sub(r"convnext\.\d+\.", "convnext.#.", k) for k in keys}

    assert pattern(tiny) == pattern(full)


@pytest.mark.parametrize("change", ["missing", "unexpected", "misshaped"])
def test_strict_loading(model_dir, tmp_path, change):
    shutil.copy(model_dir / "BiCodec" / "config.yaml", tmp_path / "config.yaml")
    state = read_state_dict(model_dir / "BiCodec" / "model.safetensors")
    key = "prenet.vocos_backbone.convnext.0.gamma"
    if change == "missing":
        del state[key]
    elif change == "unexpected":
        key = "prenet.extra.weight"
        state[key] = torch.zeros(2)
    else:
        state[key] = torch.zeros(3)
    write_safetensors(state, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match=key.replace(".", r"\.")):
        load_bicodec(tmp_path)


def test_tokenize_shapes_and_ranges(model):
    features, ref = _inputs(frames=15)
    global_ids, semantic_ids = model.tokenize(features, ref)
    assert global_ids.shape == (2, 32) and global_ids.dtype == torch.long
    assert semantic_ids.shape == (2, 15) and semantic_ids.dtype == torch.long
    assert 0 <= global_ids.min() and global_ids.max() < 4096
    assert 0 <= semantic_ids.min() and semantic_ids.max() < 8192


def test_detokenize_length_and_finite(model):
    global_ids = torch.randint(0, 4096, (2, 32))
    semantic_ids = torch.randint(0, 8192, (2, 7))
    audio = model.detokenize(global_ids, semantic_ids)
    assert audio.shape == (2, 7 * 320)
    assert torch.isfinite(audio).all() and audio.abs().max() <= 1


def test_batched_equals_one_at_a_time(model):
    features, ref = _inputs(batch=3, frames=10, seed=1)
    lengths = torch.tensor([10, 6, 6])
    global_ids, semantic_ids = model.tokenize(features, ref, lengths)
    for i, n in enumerate(lengths.tolist()):
        g, s = model.tokenize(features[i : i + 1, :n], ref[i : i + 1])
        assert torch.equal(g[0], global_ids[i]) and torch.equal(s[0], semantic_ids[i, :n])
        assert (semantic_ids[i, n:] == 0).all()
    audio = model.detokenize(global_ids, semantic_ids, lengths)
    for i, n in enumerate(lengths.tolist()):
        alone = model.detokenize(global_ids[i : i + 1], semantic_ids[i : i + 1, :n])
        assert (audio[i, : n * 320] - alone[0]).abs().max() <= 1e-4
        assert (audio[i, n * 320 :] == 0).all()


def test_empty_items_give_zeros(model):
    global_ids = torch.randint(0, 4096, (2, 32))
    semantic_ids = torch.randint(0, 8192, (2, 3))
    audio = model.detokenize(global_ids, semantic_ids, torch.tensor([0, 3]))
    assert (audio[0] == 0).all() and audio[1].abs().sum() > 0
    with pytest.raises(ValueError, match="lengths"):
        model.detokenize(global_ids, semantic_ids, torch.tensor([4, 3]))


def test_deterministic(model, model_dir, tmp_path):
    features, ref = _inputs()
    first = model.tokenize(features, ref)
    second = model.tokenize(features, ref)
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    assert torch.equal(model.detokenize(*first), model.detokenize(*second))
    write_bicodec(tmp_path, preset="tiny", seed=0)
    name = "BiCodec/model.safetensors"
    assert (tmp_path / name).read_bytes() == (model_dir / name).read_bytes()


def test_round_trip(model):
    features, ref = _inputs(batch=1, frames=20)
    global_ids, semantic_ids = model.tokenize(features, ref)
    audio = model.detokenize(global_ids, semantic_ids)
    assert audio.shape == (1, 20 * 320) and torch.isfinite(audio).all() and audio.std() > 0
    fsq = FiniteScalarQuantizer([4, 4, 4, 4, 4, 4])
    ids = torch.arange(4096)
    assert torch.equal(fsq.codes_to_ids(fsq.quantize(torch.atanh(0.999 * fsq.ids_to_codes(ids)))), ids)


def test_bfloat16_runs(model_dir):
    model = load_bicodec(model_dir / "BiCodec", dtype=torch.bfloat16)
    features, ref = _inputs(batch=1, frames=5)
    global_ids, semantic_ids = model.tokenize(features, ref)
    audio = model.detokenize(global_ids, semantic_ids)
    assert audio.dtype == torch.bfloat16 and torch.isfinite(audio.float()).all()


def test_weight_norm_fused_equals_unfused(model_dir):
    cfg = BiCodecConfig.from_yaml(model_dir / "BiCodec" / "config.yaml")
    raw = BiCodec(cfg).eval()
    raw.load_state_dict(read_state_dict(model_dir / "BiCodec" / "model.safetensors"))
    fused = load_bicodec(model_dir / "BiCodec")
    g, s = torch.randint(0, 4096, (1, 32)), torch.randint(0, 8192, (1, 4))
    assert (raw.detokenize(g, s) - fused.detokenize(g, s)).abs().max() < 1e-5


def test_volume_normalize_and_reference_clip():
    rng = np.random.default_rng(0)
    wav = 0.5 * rng.standard_normal(16000)
    out = volume_normalize(wav)
    loud = np.sort(np.abs(out))
    loud = loud[loud > 0.01]
    assert (
        np.abs(out).max() <= 1 and abs(loud[int(0.9 * len(loud)) : int(0.99 * len(loud))].mean() - 0.2) < 0.05
    )
    quiet = np.full(5, 0.001)
    np.testing.assert_allclose(volume_normalize(quiet), quiet / 1e-3 * 0.1)
    short = np.arange(5.0)
    np.testing.assert_array_equal(reference_clip(short, 12), np.tile(short, 3)[:12])
    np.testing.assert_array_equal(reference_clip(np.arange(20.0), 12), np.arange(12.0))
