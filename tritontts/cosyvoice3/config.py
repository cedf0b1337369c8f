"""`cosyvoice3.yaml` (HyperPyYAML) read without hyperpyyaml into dataclasses: the flow, the DiT, the causal HiFT.

The tags of `llm`, `flow`, `flow.decoder`, `flow.decoder.estimator`, `flow.pre_lookahead_layer`, `hift` and
`hift.f0_predictor` must name upstream's CosyVoice3 classes; anything else is an error naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from tritontts.cosyvoice2.config import CFMConfig, _HyperLoader, config_file, read_hyperpyyaml
from tritontts.cosyvoice2.hift import HiFTConfig
from tritontts.dsp.matcha_mel import MatchaMelConfig
from tritontts.spark.config import ConfigError, _build

CONFIG_FILE = "cosyvoice3.yaml"
SPEECH_TOKEN_SIZE = 6561
RESERVED_SPEECH_IDS = 200  # sos, eos, task_id, fill and 196 more: all stop the LLM

EXPECTED_TAGS = {
    ("llm",): "!new:cosyvoice.llm.llm.CosyVoice3LM",
    ("flow",): "!new:cosyvoice.flow.flow.CausalMaskedDiffWithDiT",
    ("flow", "pre_lookahead_layer"): "!new:cosyvoice.transformer.upsample_encoder.PreLookaheadLayer",
    ("flow", "decoder"): "!new:cosyvoice.flow.flow_matching.CausalConditionalCFM",
    ("flow", "decoder", "estimator"): "!new:cosyvoice.flow.DiT.dit.DiT",
    ("hift",): "!new:cosyvoice.hifigan.generator.CausalHiFTGenerator",
    ("hift", "f0_predictor"): "!new:cosyvoice.hifigan.f0_predictor.CausalConvRNNF0Predictor",
}


@dataclass(frozen=True)
class DiTConfig:
    """cosyvoice.flow.DiT.dit.DiT (upstream defaults where the yaml is silent)."""

    dim: int
    depth: int = 8
    heads: int = 8
    dim_head: int = 64
    ff_mult: int = 4
    mel_dim: int = 80
    mu_dim: int | None = None
    spk_dim: int | None = None
    out_channels: int | None = None
    long_skip_connection: bool = False
    static_chunk_size: int = 50
    num_decoding_left_chunks: int = 2  # ignored by upstream's DiT (its streaming mask sees all left chunks)
    dropout: float = 0.1  # training only


@dataclass(frozen=True)
class Flow3Config:
    """CausalMaskedDiffWithDiT: tokens → PreLookaheadLayer → x2 → CFM with a DiT estimator → mel."""

    estimator: DiTConfig
    cfm: CFMConfig
    input_size: int = 512
    output_size: int = 80
    spk_embed_dim: int = 192
    vocab_size: int = 4096
    token_mel_ratio: int = 2
    pre_lookahead_len: int = 3
    lookahead_channels: int = 1024

    def validate(self) -> None:
        est = self.estimator
        mu_dim = est.mu_dim if est.mu_dim is not None else est.mel_dim
        if mu_dim != self.input_size:
            raise ConfigError(f"flow.decoder.estimator.mu_dim {mu_dim} != flow.input_size {self.input_size}")
        if est.mel_dim != self.output_size:
            raise ConfigError(
                f"flow.decoder.estimator.mel_dim {est.mel_dim} != flow.output_size {self.output_size}"
            )
        if (est.spk_dim or 0) != self.output_size:
            raise ConfigError(
                f"flow.decoder.estimator.spk_dim {est.spk_dim} != flow.output_size {self.output_size}"
            )
        if est.long_skip_connection:
            raise ConfigError("flow.decoder.estimator.long_skip_connection is not supported")
        self.cfm.validate()


@dataclass(frozen=True)
class CausalHiFTConfig:
    """CausalHiFTGenerator: CosyVoice2's HiFT sizes plus how far conv_pre looks right."""

    hift: HiFTConfig
    conv_pre_look_right: int = 4


@dataclass(frozen=True)
class LLM3Config:
    llm_input_size: int = 896
    llm_output_size: int = 896
    speech_token_size: int = SPEECH_TOKEN_SIZE

    @property
    def speech_vocab(self) -> int:
        return self.speech_token_size + RESERVED_SPEECH_IDS


@dataclass(frozen=True)
class CosyVoice3Config:
    llm: LLM3Config
    flow: Flow3Config
    hift: CausalHiFTConfig
    prompt_mel: MatchaMelConfig
    sample_rate: int = 24000
    token_frame_rate: int = 25


def _node(root: yaml.Node, path: tuple[str, ...]) -> yaml.Node | None:
    node = root
    for key in path:
        if not isinstance(node, yaml.MappingNode):
            return None
        node = next((v for k, v in node.value if getattr(k, "value", None) == key), None)
        if node is None:
            return None
    return node


def _check_tags(text: str, source: str) -> None:
    root = yaml.compose(text, Loader=_HyperLoader)
    for path, tag in EXPECTED_TAGS.items():
        node = _node(root, path)
        name = ".".join(path)
        if node is None:
            raise ConfigError(f"{source}: missing section {name!r}")
        if node.tag != tag:
            raise ConfigError(f"{source}: {name} is {node.tag!r}, expected {tag!r}")


def _flow(flow: dict[str, Any]) -> Flow3Config:
    decoder, lookahead = flow.get("decoder"), flow.get("pre_lookahead_layer")
    if not isinstance(decoder, dict) or not isinstance(decoder.get("estimator"), dict):
        raise ConfigError("flow.decoder.estimator: missing")
    if not isinstance(lookahead, dict):
        raise ConfigError("flow.pre_lookahead_layer: missing")
    estimator = _build(DiTConfig, decoder["estimator"], "flow.decoder.estimator")
    cfm = CFMConfig.from_decoder(decoder)
    values = {k: v for k, v in flow.items() if k not in ("decoder", "pre_lookahead_layer")}
    config = _build(
        Flow3Config,
        {**values, "estimator": estimator, "cfm": cfm, "lookahead_channels": lookahead.get("channels")},
        "flow",
        lenient=True,
    )
    if lookahead.get("in_channels") != config.input_size:
        raise ConfigError(f"flow.pre_lookahead_layer.in_channels != flow.input_size {config.input_size}")
    if lookahead.get("pre_lookahead_len") != config.pre_lookahead_len:
        raise ConfigError("flow.pre_lookahead_layer.pre_lookahead_len != flow.pre_lookahead_len")
    config.validate()
    return config


def _hift(section: dict[str, Any]) -> CausalHiFTConfig:
    values = dict(section)
    look_right = values.pop("conv_pre_look_right", 4)
    known = {f.name for f in fields(HiFTConfig)} | {"istft_params", "f0_predictor"}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(f"hift: unknown keys {unknown}")
    return CausalHiFTConfig(HiFTConfig.from_yaml_dict(values), int(look_right))


def _prompt_mel(data: dict[str, Any]) -> MatchaMelConfig:
    feat = data.get("feat_extractor")
    if not isinstance(feat, dict):
        raise ConfigError("feat_extractor: missing")
    if feat.get("center", False):
        raise ConfigError("feat_extractor.center must be False")
    values = {k: v for k, v in feat.items() if k != "center"}
    if values.get("fmax") is None:  # matcha/librosa: None means Nyquist
        values["fmax"] = float(values.get("sampling_rate", 24000)) / 2
    return _build(MatchaMelConfig, values, "feat_extractor")


def cosyvoice3_config_from_text(text: str, source: str = CONFIG_FILE) -> CosyVoice3Config:
    _check_tags(text, source)
    data = read_hyperpyyaml(text)
    llm = data["llm"]
    return CosyVoice3Config(
        llm=_build(
            LLM3Config, {k: v for k, v in llm.items() if k in {f.name for f in fields(LLM3Config)}}, "llm"
        ),
        flow=_flow(data["flow"]),
        hift=_hift(data["hift"]),
        prompt_mel=_prompt_mel(data),
        sample_rate=int(data.get("sample_rate", 24000)),
        token_frame_rate=int(data.get("token_frame_rate", 25)),
    )


def load_cosyvoice3_config(path: str | Path) -> CosyVoice3Config:
    """`cosyvoice3.yaml`, or a model directory holding it."""
    path = config_file(path, CONFIG_FILE)
    return cosyvoice3_config_from_text(path.read_text(), str(path))
