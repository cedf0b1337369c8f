import json
from pathlib import Path

import numpy as np
import pytest
import torch
from tolerance import within

from tritontts.checkpoint import CheckpointError, read_state_dict, write_safetensors
from tritontts.synthetic.wav2vec2 import checkpoint_shapes, preset_config, synthetic_state, write_wav2vec2
from tritontts.wav2vec2 import (
    SPARK_LAYERS,
    Wav2Vec2Config,
    Wav2Vec2Encoder,
    checkpoint_to_encoder_keys,
    load_wav2vec2,
)

transformers = pytest.importorskip("transformers")
TOL = 1e-4


def new_style_name(key: str) -> str:
    return key.replace(".weight_g", ".parametrizations.weight.original0").replace(
        ".weight_v", ".parametrizations.weight.original1"
    )


def hf_config(values: dict) -> "transformers.Wav2Vec2Config":
    return transformers.Wav2Vec2Config(**{k: v for k, v in values.items() if k != "architectures"})


def waveforms(lengths, seed=0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(0.3 * rng.standard_normal(n) + 0.05).astype(np.float32) for n in lengths]


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return write_wav2vec2(tmp_path_factory.mktemp("w2v") / "wav2vec2-large-xlsr-53", "tiny", seed=0)


@pytest.fixture(scope="module")
def ours(tiny_dir):
    return load_wav2vec2(tiny_dir)


@pytest.fixture(scope="module")
def reference(tiny_dir):
    model = transformers.Wav2Vec2Model.from_pretrained(tiny_dir, attn_implementation="eager")
    return model.eval()


def test_tiny_preset_keeps_spark_depth():
    config = Wav2Vec2Config.from_dict(preset_config("tiny"))
    assert config.num_hidden_layers >= max(SPARK_LAYERS) + 1
    assert config.conv_kernel == (10, 3, 3, 3, 3, 2, 2) and config.conv_stride == (5, 2, 2, 2, 2, 2, 2)


@pytest.mark.golden
def test_hidden_states_match_transformers(ours, reference):
    x = torch.randn(2, 6400, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = reference(x, output_hidden_states=True)
        got = ours.hidden_states(x)
    layers = ours.config.num_hidden_layers
    assert len(got) == len(expected.hidden_states) == layers + 1
    for i in range(layers):
        within(f"h[{i}]", max_diff(got[i], expected.hidden_states[i]), TOL)
    # transformers 4.x put the final layer norm on the last hidden state; 5.x keeps it only in last_hidden_state
    within("last hidden state", max_diff(got[layers], expected.last_hidden_state), TOL)


@pytest.mark.golden
def test_hidden_states_with_padding_match_transformers(ours, reference):
    x = torch.randn(2, 8000, generator=torch.Generator().manual_seed(2))
    lengths = torch.tensor([8000, 5000])
    x[1, 5000:] = 0.0
    mask = (torch.arange(8000)[None] < lengths[:, None]).long()
    with torch.no_grad():
        expected = reference(x, attention_mask=mask, output_hidden_states=True).hidden_states
        got = ours.hidden_states(x, lengths)
    frames = ours.frame_lengths(lengths)
    for i in range(ours.config.num_hidden_layers):
        for row, n in enumerate(frames.tolist()):
            within(f"h[{i}] row {row}", max_diff(got[i][row, :n], expected[i][row, :n]), TOL)


def test_partial_run_stops_before_final_norm(ours):
    x = torch.randn(1, 4000, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = ours.hidden_states(x)
        partial = ours.hidden_states(x, num_layers=16)
    assert len(partial) == 17
    for a, b in zip(partial, full[:17]):
        assert torch.equal(a, b)
    with pytest.raises(ValueError):
        ours.hidden_states(x, num_layers=ours.config.num_hidden_layers + 1)


def test_frame_lengths_match_transformers(ours, reference):
    lengths = torch.tensor([400, 401, 719, 720, 16000, 16321, 96000])
    assert torch.equal(ours.frame_lengths(lengths), reference._get_feat_extract_output_lengths(lengths))
    assert ours.frame_lengths(torch.tensor([10])).item() == 0


@pytest.mark.golden
def test_spark_features_match_feature_extractor_and_model(tiny_dir, ours, reference):
    wavs = waveforms([7000, 4321, 9600])
    extractor = transformers.Wav2Vec2FeatureExtractor.from_pretrained(tiny_dir)
    inputs = extractor(wavs, sampling_rate=16000, return_tensors="pt", padding=True)
    with torch.no_grad():
        h = reference(inputs.input_values, attention_mask=inputs.attention_mask, output_hidden_states=True)
    expected = (h.hidden_states[11] + h.hidden_states[14] + h.hidden_states[16]) / 3
    got, frames = ours.spark_features(wavs)
    assert got.shape == expected.shape
    assert inputs.attention_mask is not None  # return_attention_mask comes from preprocessor_config.json
    expected_frames = reference._get_feat_extract_output_lengths(torch.tensor([7000, 4321, 9600]))
    assert frames.tolist() == expected_frames.tolist()
    for row, n in enumerate(frames.tolist()):
        within(f"features row {row}", max_diff(got[row, :n], expected[row, :n]), TOL)
        assert torch.all(got[row, n:] == 0)


@pytest.mark.golden
def test_spark_features_match_upstream_single_utterance_call(tiny_dir, ours, reference):
    wav = waveforms([8000], seed=5)[0]
    extractor = transformers.Wav2Vec2FeatureExtractor.from_pretrained(tiny_dir)
    inputs = extractor(wav, sampling_rate=16000, return_tensors="pt", padding=True).input_values
    with torch.no_grad():
        h = reference(inputs, output_hidden_states=True).hidden_states
    got, _ = ours.spark_features(torch.from_numpy(wav))
    within("features", max_diff(got, (h[11] + h[14] + h[16]) / 3), TOL)


def test_batched_equals_one_at_a_time(ours):
    wavs = waveforms([3200, 8000, 5555, 640], seed=7)
    batched, frames = ours.spark_features(wavs)
    for row, wav in enumerate(wavs):
        single, single_frames = ours.spark_features([wav])
        n = int(frames[row])
        assert single_frames.item() == n
        within(f"batched row {row}", max_diff(batched[row, :n], single[0]), TOL)


def test_padded_batch_with_lengths_equals_list(ours):
    wavs = waveforms([3000, 4800], seed=8)
    padded = torch.zeros(2, 4800)
    for row, wav in zip(padded, wavs):
        row[: len(wav)] = torch.from_numpy(wav)
    from_list, frames = ours.spark_features(wavs)
    from_padded, padded_frames = ours.spark_features(padded, lengths=torch.tensor([3000, 4800]))
    assert torch.equal(frames, padded_frames) and torch.equal(from_list, from_padded)


def test_too_short_utterance_is_rejected(ours):
    with pytest.raises(ValueError, match="frame"):
        ours.spark_features(waveforms([8000, 200]))


def test_other_dtype_runs(tiny_dir):
    model = load_wav2vec2(tiny_dir, dtype=torch.bfloat16)
    feats, _ = model.spark_features(waveforms([4000]))
    assert feats.dtype == torch.bfloat16 and torch.isfinite(feats).all()


def test_written_keys_equal_transformers_pretraining_keys(tiny_dir):
    config = json.loads((tiny_dir / "config.json").read_text())
    expected = {new_style_name(k): v.shape for k, v in synthetic_state(config).items()}
    hf_state = transformers.Wav2Vec2ForPreTraining(hf_config(config)).state_dict()
    assert {k: tuple(v.shape) for k, v in hf_state.items()} == {k: tuple(v) for k, v in expected.items()}
    written = read_state_dict(tiny_dir / "pytorch_model.bin")
    assert {k: tuple(v.shape) for k, v in written.items()} == checkpoint_shapes(config)


def test_full_preset_shapes_equal_transformers_on_meta():
    config = preset_config("full")
    assert config["architectures"] == ["Wav2Vec2ForPreTraining"]
    with torch.device("meta"):
        hf_model = transformers.Wav2Vec2ForPreTraining(hf_config(config))
    hf_shapes = {k: tuple(v.shape) for k, v in hf_model.state_dict().items()}
    assert hf_shapes == {new_style_name(k): v for k, v in checkpoint_shapes(config).items()}
    with torch.device("meta"):
        encoder = Wav2Vec2Encoder(Wav2Vec2Config.from_dict(config))
    ours = {"wav2vec2." + k: tuple(v.shape) for k, v in encoder.state_dict().items()}
    heads = ("quantizer.", "project_q.", "project_hid.")
    assert ours == {k: v for k, v in checkpoint_shapes(config).items() if not k.startswith(heads)}
    assert sum(np.prod(v) for v in hf_shapes.values()) > 300_000_000


def test_preprocessor_config_matches_feature_extractor(tiny_dir):
    extractor = transformers.Wav2Vec2FeatureExtractor.from_pretrained(tiny_dir)
    assert extractor.do_normalize and extractor.return_attention_mask
    assert extractor.sampling_rate == 16000 and extractor.padding_value == 0.0


def test_same_seed_same_bytes(tmp_path):
    a = write_wav2vec2(tmp_path / "a", "tiny", seed=3)
    b = write_wav2vec2(tmp_path / "b", "tiny", seed=3)
    c = write_wav2vec2(tmp_path / "c", "tiny", seed=4)
    for name in ("config.json", "preprocessor_config.json", "pytorch_model.bin"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert (a / "pytorch_model.bin").read_bytes() != (c / "pytorch_model.bin").read_bytes()


def test_safetensors_variant_loads(tmp_path, ours):
    folder = write_wav2vec2(tmp_path / "st", "tiny", seed=0, weights_format="safetensors")
    assert not (folder / "pytorch_model.bin").exists()
    model = load_wav2vec2(folder)
    wavs = waveforms([4000])
    assert torch.equal(model.spark_features(wavs)[0], ours.spark_features(wavs)[0])


def test_new_style_weight_norm_names_load(tmp_path, tiny_dir, ours):
    state = {new_style_name(k): v for k, v in read_state_dict(tiny_dir / "pytorch_model.bin").items()}
    folder = tmp_path / "new_style"
    folder.mkdir()
    (folder / "config.json").write_text((tiny_dir / "config.json").read_text())
    write_safetensors(state, folder / "model.safetensors")
    model = load_wav2vec2(folder)
    assert torch.equal(model.encoder.pos_conv_embed.conv.weight_g, ours.encoder.pos_conv_embed.conv.weight_g)


def broken_copy(tmp_path, tiny_dir, edit) -> Path:
    state = read_state_dict(tiny_dir / "pytorch_model.bin")
    edit(state)
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "config.json").write_text((tiny_dir / "config.json").read_text())
    torch.save(state, folder / "pytorch_model.bin")
    return folder


@pytest.mark.parametrize(
    "edit, key",
    [
        (
            lambda s: s.pop("wav2vec2.encoder.layers.3.attention.q_proj.bias"),
            "encoder.layers.3.attention.q_proj.bias",
        ),
        (lambda s: s.update({"wav2vec2.encoder.extra.weight": torch.zeros(2)}), "encoder.extra.weight"),
        (
            lambda s: s.update({"wav2vec2.feature_projection.projection.weight": torch.zeros(3, 3)}),
            "feature_projection.projection.weight",
        ),
        (lambda s: s.pop("wav2vec2.masked_spec_embed"), "masked_spec_embed"),
    ],
    ids=["missing", "unexpected", "misshaped", "missing-masked-spec-embed"],
)
def test_loader_is_strict(tmp_path, tiny_dir, edit, key):
    folder = broken_copy(tmp_path, tiny_dir, edit)
    with pytest.raises(CheckpointError, match=key.replace(".", r"\.")):
        load_wav2vec2(folder)


def test_pretraining_heads_are_ignored_but_other_extras_are_not(tiny_dir):
    state = read_state_dict(tiny_dir / "pytorch_model.bin")
    assert any(k.startswith("quantizer.") for k in state) and "project_hid.weight" in state
    load_wav2vec2(tiny_dir)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"do_stable_layer_norm": False}, "do_stable_layer_norm"),
        ({"feat_extract_norm": "batch"}, "feat_extract_norm"),
        ({"hidden_act": "swish"}, "hidden_act"),
        ({"add_adapter": True}, "adapter"),
        ({"num_feat_extract_layers": 6}, "num_feat_extract_layers"),
    ],
)
def test_unsupported_configs_are_rejected(change, message):
    with pytest.raises(ValueError, match=message):
        Wav2Vec2Config.from_dict({**preset_config("tiny"), **change})


def test_missing_config_field_is_named():
    values = preset_config("tiny")
    del values["conv_stride"]
    with pytest.raises(ValueError, match="conv_stride"):
        Wav2Vec2Config.from_dict(values)


@pytest.mark.golden
def test_group_norm_feature_encoder_matches_transformers():
    values = {**preset_config("tiny"), "feat_extract_norm": "group", "num_hidden_layers": 2}
    torch.manual_seed(0)
    reference = transformers.Wav2Vec2Model(hf_config(values)).eval()
    state = checkpoint_to_encoder_keys(reference.state_dict())
    model = Wav2Vec2Encoder(Wav2Vec2Config.from_dict(values))
    model.load_state_dict(state, strict=True)
    x = torch.randn(1, 3200)
    with torch.no_grad():
        expected = reference(x, output_hidden_states=True)
        got = model.eval().hidden_states(x)
    within("h[1]", max_diff(got[1], expected.hidden_states[1]), TOL)
    within("last hidden state", max_diff(got[2], expected.last_hidden_state), TOL)
