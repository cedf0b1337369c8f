"""CosyVoice2 flow: the yaml reader, strict `flow.pt` loading, and token → mel inference (tiny preset)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from tritontts.checkpoint import CheckpointError
from tritontts.cosyvoice2.config import (
    CFMConfig,
    EncoderConfig,
    EstimatorConfig,
    FlowConfig,
    cosyvoice2_config_from_text,
    load_cosyvoice2_config,
    read_hyperpyyaml,
)
from tritontts.cosyvoice2.flow import FLOW_FILE, Flow, load_flow
from tritontts.cosyvoice2.flow.cfm import fixed_noise
from tritontts.spark.config import ConfigError
from tritontts.synthetic.cosyvoice2_flow import cosyvoice2_yaml, write_cosyvoice2_yaml, write_flow

KEYS_FILE = Path(__file__).parent / "data" / "cosyvoice2_flow_keys.json"
VOCAB = 6561


def _len(n: int) -> torch.Tensor:
    return torch.tensor([n], dtype=torch.int32)


def _inputs(n_target: int, n_prompt: int, seed: int = 0) -> dict[str, object]:
    gen = torch.Generator().manual_seed(seed)
    return {
        "token": torch.randint(0, VOCAB, (1, n_target), generator=gen, dtype=torch.int32),
        "token_len": _len(n_target),
        "prompt_token": torch.randint(0, VOCAB, (1, n_prompt), generator=gen, dtype=torch.int32),
        "prompt_token_len": _len(n_prompt),
        "prompt_feat": torch.randn(1, 2 * n_prompt, 80, generator=gen),
        "prompt_feat_len": _len(2 * n_prompt),
        "embedding": torch.randn(1, 192, generator=gen),
    }


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("cosyvoice2_tiny")
    write_flow(directory, "tiny", seed=0)
    return directory


@pytest.fixture(scope="module")
def flow(model_dir: Path) -> Flow:
    torch.manual_seed(1234)  # the flow's noise must not depend on the global RNG
    return load_flow(model_dir)


@pytest.fixture(scope="module")
def offline_mel(flow: Flow) -> torch.Tensor:
    return flow.inference(**_inputs(20, 10), streaming=False, finalize=True)


def test_full_yaml_reads_the_reference_values() -> None:
    config = cosyvoice2_config_from_text(cosyvoice2_yaml("full"))
    assert (config.sample_rate, config.token_frame_rate, config.token_mel_ratio, config.chunk_size) == (
        24000,
        25,
        2,
        25,
    )
    assert config.flow == FlowConfig(
        encoder=EncoderConfig(
            input_size=512,
            output_size=512,
            attention_heads=8,
            linear_units=2048,
            num_blocks=6,
            static_chunk_size=25,
        ),
        estimator=EstimatorConfig(
            in_channels=320,
            out_channels=80,
            channels=(256,),
            attention_head_dim=64,
            n_blocks=4,
            num_mid_blocks=12,
            num_heads=8,
            act_fn="gelu",
            static_chunk_size=50,
            num_decoding_left_chunks=-1,
        ),
        cfm=CFMConfig(
            in_channels=240, spk_emb_dim=80, sigma_min=1e-6, t_scheduler="cosine", inference_cfg_rate=0.7
        ),
        input_size=512,
        output_size=80,
        spk_embed_dim=192,
        vocab_size=6561,
        token_mel_ratio=2,
        pre_lookahead_len=3,
    )
    assert config.hift["base_channels"] == 512
    assert config.hift["f0_predictor"] == {"num_class": 1, "in_channels": 80, "cond_channels": 512}
    assert config.hift["sampling_rate"] == 24000
    assert config.hift["istft_params"] == {"n_fft": 16, "hop_len": 4}
    assert config.llm["llm_input_size"] == config.llm["llm_output_size"] == 896
    assert config.llm["sampling"] == {"top_p": 0.8, "top_k": 25, "win_size": 10, "tau_r": 0.1}


def test_tiny_yaml_reads_the_tiny_values(tmp_path: Path) -> None:
    config = load_cosyvoice2_config(write_cosyvoice2_yaml(tmp_path, "tiny").parent)
    enc, est = config.flow.encoder, config.flow.estimator
    assert (enc.input_size, enc.output_size, enc.attention_heads, enc.linear_units, enc.num_blocks) == (
        64,
        64,
        2,
        128,
        2,
    )
    assert (est.channels, est.attention_head_dim, est.n_blocks, est.num_mid_blocks, est.num_heads) == (
        (64,),
        32,
        1,
        2,
        2,
    )
    assert (est.in_channels, est.out_channels, config.flow.vocab_size, config.flow.spk_embed_dim) == (
        320,
        80,
        6561,
        192,
    )
    assert (config.flow.token_mel_ratio, config.flow.pre_lookahead_len, config.flow.input_size) == (2, 3, 64)
    assert config.hift["base_channels"] == 32 and config.hift["f0_predictor"]["cond_channels"] == 32
    samples_per_frame = 1
    for rate in config.hift["upsample_rates"]:
        samples_per_frame *= rate
    assert samples_per_frame * config.hift["istft_params"]["hop_len"] == 480
    assert config.llm["llm_input_size"] == 64


def test_hyperpyyaml_tags_refs_and_arithmetic() -> None:
    data = read_hyperpyyaml(
        "a: 3\nb: !ref <a> * 4 + 1\nc: !ref <sec[inner]>\nsec: !new:x.Y\n  inner: 1e-06\n"
        "empty: !new:x.Z\nseed: !apply:random.seed [1986]\nlst: [!ref <a>]\n"
    )
    assert data == {
        "a": 3,
        "b": 13,
        "c": 1e-06,
        "sec": {"inner": 1e-06},
        "empty": None,
        "seed": [1986],
        "lst": [3],
    }


def test_yaml_problems_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="nowhere"):
        read_hyperpyyaml("a: !ref <nowhere>\n")
    with pytest.raises(ConfigError, match="flow"):
        cosyvoice2_config_from_text("sample_rate: 24000\nhift: {}\nllm: {}\n")
    text = cosyvoice2_yaml("tiny").replace("use_cnn_module: False", "use_cnn_module: True")
    with pytest.raises(ConfigError, match="use_cnn_module"):
        cosyvoice2_config_from_text(text)


def test_full_state_dict_matches_the_official_keys() -> None:
    expected = json.loads(KEYS_FILE.read_text())
    with torch.device("meta"):
        flow = Flow(cosyvoice2_config_from_text(cosyvoice2_yaml("full")).flow)
    state = flow.state_dict()
    assert list(state) == list(expected)
    assert {k: list(v.shape) for k, v in state.items()} == expected
    assert sum(v.numel() for v in state.values()) == 112_549_360


def _write_state(path: Path, state: dict[str, torch.Tensor]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    torch.save(state, path / FLOW_FILE)
    return path


@pytest.mark.parametrize(
    "change, named",
    [
        (
            lambda s: s.pop("encoder.up_encoders.3.self_attn.pos_bias_u"),
            "encoder.up_encoders.3.self_attn.pos_bias_u",
        ),
        (
            lambda s: s.update({"decoder.estimator.extra.weight": torch.zeros(1)}),
            "decoder.estimator.extra.weight",
        ),
        (lambda s: s.update({"encoder_proj.weight": torch.zeros(80, 65)}), "encoder_proj.weight"),
    ],
    ids=["missing", "unexpected", "misshaped"],
)
def test_strict_loading_names_the_bad_key(model_dir: Path, tmp_path: Path, change, named: str) -> None:
    state = torch.load(model_dir / FLOW_FILE, weights_only=True)
    change(state)
    config = load_cosyvoice2_config(model_dir)
    with pytest.raises(CheckpointError, match=named.replace(".", r"\.")):
        load_flow(_write_state(tmp_path, state), config)


def test_same_seed_same_bytes(model_dir: Path, tmp_path: Path) -> None:
    again = write_flow(tmp_path / "again", "tiny", seed=0)
    other = write_flow(tmp_path / "other", "tiny", seed=1)
    assert again.read_bytes() == (model_dir / FLOW_FILE).read_bytes()
    assert other.read_bytes() != again.read_bytes()


def test_fixed_noise_is_the_reference_seed_zero_draw(flow: Flow) -> None:
    with torch.random.fork_rng():
        torch.manual_seed(0)
        reference = torch.randn(1, 80, 50 * 300)
    assert torch.equal(fixed_noise(80), reference)
    assert torch.equal(flow.decoder.rand_noise, reference)
    assert "decoder.rand_noise" not in flow.state_dict()


def test_offline_mel_shape_and_determinism(flow: Flow, offline_mel: torch.Tensor) -> None:
    assert offline_mel.shape == (1, 80, 2 * 20)
    assert offline_mel.dtype == torch.float32
    assert torch.isfinite(offline_mel).all()
    assert torch.equal(flow.inference(**_inputs(20, 10), streaming=False, finalize=True), offline_mel)


def test_without_finalize_the_lookahead_tokens_get_no_mel(flow: Flow) -> None:
    mel = flow.inference(**_inputs(20, 10), streaming=False, finalize=False)
    assert mel.shape == (1, 80, 2 * (20 - 3))
    with pytest.raises(ValueError, match="more than 3 tokens"):
        flow.inference(**_inputs(2, 0), streaming=False, finalize=False)


def test_streaming_masks_change_the_mel_past_a_chunk(flow: Flow, offline_mel: torch.Tensor) -> None:
    streamed = flow.inference(**_inputs(20, 10), streaming=True, finalize=True)
    assert streamed.shape == offline_mel.shape
    assert not torch.allclose(streamed, offline_mel, atol=1e-3)


def test_streaming_first_chunk_ignores_tokens_past_its_lookahead(flow: Flow) -> None:
    """Mel frames of the first 25-token chunk read tokens 0..27 only (chunked attention, causal convs)."""
    long = _inputs(40, 0, seed=3)
    short = dict(long, token=long["token"][:, :30].clone(), token_len=_len(30))
    short["token"][:, 28:] = 0
    mel_long = flow.inference(**long, streaming=True, finalize=True)
    mel_short = flow.inference(**short, streaming=True, finalize=True)
    torch.testing.assert_close(mel_short[:, :, :50], mel_long[:, :, :50], atol=1e-4, rtol=1e-4)


def test_prompt_conditions_the_mel(flow: Flow, offline_mel: torch.Tensor) -> None:
    inputs = _inputs(20, 10)
    other_feat = flow.inference(**dict(inputs, prompt_feat=inputs["prompt_feat"] * 0.5))
    other_speaker = flow.inference(**dict(inputs, embedding=-inputs["embedding"]))
    assert not torch.allclose(other_feat, offline_mel, atol=1e-3)
    assert not torch.allclose(other_speaker, offline_mel, atol=1e-3)


def test_batch_of_two_is_refused(flow: Flow) -> None:
    inputs = _inputs(5, 2)
    inputs["token"] = inputs["token"].repeat(2, 1)
    with pytest.raises(ValueError, match="batch size 1"):
        flow.inference(**inputs)


def test_bfloat16_flow_runs_close_to_fp32(model_dir: Path, offline_mel: torch.Tensor) -> None:
    flow16 = load_flow(model_dir, dtype=torch.bfloat16)
    assert flow16.decoder.rand_noise.dtype == torch.bfloat16
    mel = flow16.inference(**_inputs(20, 10), streaming=False, finalize=True)
    assert mel.dtype == torch.float32 and mel.shape == offline_mel.shape
    assert (mel - offline_mel).abs().mean() < 0.05


def test_config_object_or_yaml_next_to_the_weights(model_dir: Path) -> None:
    config = load_cosyvoice2_config(model_dir)
    assert load_flow(model_dir / FLOW_FILE, config).config == load_flow(model_dir, config.flow).config
    wrong = replace(config.flow, vocab_size=100)
    with pytest.raises(CheckpointError, match="input_embedding.weight"):
        load_flow(model_dir, wrong)


@pytest.mark.parametrize("streaming", [False, True], ids=["offline", "streaming"])
def test_the_estimators_additive_mask_gives_the_boolean_masks_mel(
    flow: Flow, streaming: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The estimator turns each level's mask into SDPA's float form once for all its blocks (fewer kernels per
    call): the mel equals the one from boolean masks passed to every block."""
    import tritontts.cosyvoice2.flow.estimator as estimator

    inputs = _inputs(23, 11, seed=3)
    additive = flow.inference(**inputs, streaming=streaming, finalize=True)
    monkeypatch.setattr(estimator, "additive_mask", lambda mask, dtype: mask)
    boolean = flow.inference(**inputs, streaming=streaming, finalize=True)
    assert torch.equal(additive, boolean)


def test_the_estimator_traces_as_one_graph(flow: Flow) -> None:
    """torch.compile (the `compile` flow graphs) sees one graph: the shared attention mask breaks nothing."""
    torch.manual_seed(0)
    frames = 24
    x, mu, cond = (torch.randn(2, 80, frames) for _ in range(3))
    mask = torch.ones(2, 1, frames)
    mask[1, :, 17:] = 0
    args = (x, mask, mu, torch.rand(2), torch.randn(2, 80), cond, True)
    estimator = flow.decoder.estimator
    with torch.inference_mode():
        traced = torch.compile(estimator, backend="eager", fullgraph=True, dynamic=True)(*args)
        assert torch.allclose(traced, estimator(*args), atol=1e-5)
