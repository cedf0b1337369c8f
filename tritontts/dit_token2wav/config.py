"""`token2wav/flow.yaml` of Step-Audio-2-mini (HyperPyYAML) → dataclasses, checked against what we implement.

The `flow:` section builds four classes, each with its own tag; any other tag inside it, an unknown key
(except in the encoder, whose upstream constructor swallows extra keyword arguments), or a value that
selects a variant we do not implement is a ConfigError naming it. Defaults are the upstream constructors'.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from tritontts.cosyvoice2.config import EncoderConfig, read_hyperpyyaml
from tritontts.spark.config import ConfigError

FLOW_YAML = "flow.yaml"
FLOW_TAG = "!new:cosyvoice2.flow.flow.CausalMaskedDiffWithXvec"
ENCODER_TAG = "!new:cosyvoice2.transformer.upsample_encoder_v2.UpsampleConformerEncoderV2"
CFM_TAG = "!new:cosyvoice2.flow.flow_matching.CausalConditionalCFM"
DIT_TAG = "!new:cosyvoice2.flow.decoder_dit.DiT"
REF_TAG = "!ref"
MEL_BINS = 80


@dataclass(frozen=True)
class DiTConfig:
    """The DiT velocity estimator: adaLN-zero transformer blocks with a causal convolution each."""

    in_channels: int
    out_channels: int
    mlp_ratio: float = 4.0
    depth: int = 28
    num_heads: int = 8
    head_dim: int = 64
    hidden_size: int = 256

    @property
    def mlp_hidden(self) -> int:
        return int(self.hidden_size * self.mlp_ratio)


@dataclass(frozen=True)
class DiTFlowConfig:
    """CausalMaskedDiffWithXvec with UpsampleConformerEncoderV2 and a DiT under CausalConditionalCFM."""

    encoder: EncoderConfig
    estimator: DiTConfig
    pre_lookahead_len: int = 3
    inference_cfg_rate: float = 0.7
    input_size: int = 512
    output_size: int = 80
    spk_embed_dim: int = 192
    vocab_size: int = 5121
    n_timesteps: int = 10  # what every upstream caller passes

    @property
    def token_mel_ratio(self) -> int:
        return self.encoder.upsample_stride

    def validate(self) -> None:
        enc, est = self.encoder, self.estimator
        checks = [
            (
                self.output_size == MEL_BINS,
                f"flow.output_size {self.output_size} (the mel has {MEL_BINS} bins)",
            ),
            (
                enc.input_size == self.input_size,
                f"flow.encoder.input_size {enc.input_size} != flow.input_size {self.input_size}",
            ),
            (
                enc.input_size == enc.output_size,
                f"flow.encoder.input_size {enc.input_size} != output_size {enc.output_size} "
                "(upstream's up_embed takes input_size features from the output_size stream)",
            ),
            (
                enc.output_size % enc.attention_heads == 0,
                f"flow.encoder.output_size {enc.output_size} does not divide by attention_heads "
                f"{enc.attention_heads}",
            ),
            (
                est.out_channels == self.output_size,
                f"flow.decoder.estimator.out_channels {est.out_channels} != flow.output_size {self.output_size}",
            ),
            (
                est.in_channels == 4 * self.output_size,
                f"flow.decoder.estimator.in_channels {est.in_channels} != 4 * {self.output_size} "
                "(x, mu, speaker, cond)",
            ),
            (self.pre_lookahead_len >= 1, f"flow.encoder.pre_lookahead_len {self.pre_lookahead_len} < 1"),
            (enc.upsample_stride >= 1, f"flow.encoder.up_stride {enc.upsample_stride} < 1"),
            (self.inference_cfg_rate > 0, f"flow.decoder.inference_cfg_rate {self.inference_cfg_rate} <= 0"),
        ]
        for ok, problem in checks:
            if not ok:
                raise ConfigError(f"{FLOW_YAML}: {problem}")


_FLOW_KEYS = {"input_size", "output_size", "spk_embed_dim", "output_type", "vocab_size", "encoder", "decoder"}
_CFM_KEYS = {"estimator", "inference_cfg_rate"}
_ENCODER_DEFAULTS: dict[str, Any] = {
    "output_size": 256,
    "pre_lookahead_len": 3,
    "num_blocks": 6,
    "num_up_blocks": 4,
    "up_stride": 2,
    "attention_heads": 4,
    "linear_units": 2048,
}
# Keys that select a variant: the value we implement (upstream's default where it has one).
_ENCODER_FIXED: dict[str, Any] = {
    "input_layer": "linear",
    "pos_enc_layer_type": "rel_pos_espnet",
    "selfattention_layer_type": "rel_selfattn",
    "key_bias": True,
    "normalize_before": True,
    "activation_type": "swish",
}
_ENCODER_IGNORED = {"dropout_rate", "positional_dropout_rate", "attention_dropout_rate"}


def _children(node: yaml.Node) -> dict[str, yaml.Node]:
    if not isinstance(node, yaml.MappingNode):
        return {}
    return {key.value: value for key, value in node.value if isinstance(key, yaml.ScalarNode)}


def _check_tags(flow: yaml.Node) -> None:
    """Every tagged node under `flow:` is one of the four classes, in its place, or a `!ref`."""
    expected = {
        "flow": FLOW_TAG,
        "flow.encoder": ENCODER_TAG,
        "flow.decoder": CFM_TAG,
        "flow.decoder.estimator": DIT_TAG,
    }

    def visit(node: yaml.Node, path: str) -> None:
        tag = node.tag
        custom = tag.startswith("!")
        if path in expected and tag != expected[path]:
            shown = tag if custom else "no tag"
            raise ConfigError(f"{FLOW_YAML}: {path} is built by {shown}; expected {expected[path]}")
        if custom and path not in expected and tag != REF_TAG:
            raise ConfigError(f"{FLOW_YAML}: unknown tag {tag} at {path}")
        if isinstance(node, yaml.MappingNode):
            for key, child in _children(node).items():
                visit(child, f"{path}.{key}")
        elif isinstance(node, yaml.SequenceNode):
            for index, child in enumerate(node.value):
                visit(child, f"{path}[{index}]")

    visit(flow, "flow")


def _section(data: dict[str, Any], key: str, path: str) -> dict[str, Any]:
    value = data.get(key)
    if not isinstance(value, dict):
        raise ConfigError(f"{FLOW_YAML}: missing section {path}.{key}")
    return value


def _unknown(section: dict[str, Any], known: set[str], path: str) -> None:
    unknown = sorted(set(section) - known)
    if unknown:
        raise ConfigError(f"{FLOW_YAML}: unknown keys in {path}: {unknown}")


def _number(section: dict[str, Any], key: str, path: str, default: Any, kind: type) -> Any:
    value = section.get(key, default)
    if value is None:
        raise ConfigError(f"{FLOW_YAML}: missing key {path}.{key}")
    if isinstance(value, bool) or not isinstance(value, int | float) or (kind is int and value != int(value)):
        raise ConfigError(
            f"{FLOW_YAML}: {path}.{key} = {value!r} is not {'an integer' if kind is int else 'a number'}"
        )
    return kind(value)


def _encoder(section: dict[str, Any]) -> tuple[EncoderConfig, int]:
    path = "flow.encoder"
    for key, value in _ENCODER_FIXED.items():
        if key in section and section[key] != value:
            raise ConfigError(
                f"{FLOW_YAML}: {path}.{key} = {section[key]!r} is not supported (only {value!r})"
            )
    stride = _number(section, "up_stride", path, _ENCODER_DEFAULTS["up_stride"], int)
    scale = section.get("up_scale_factor", stride)
    if scale != stride:
        raise ConfigError(
            f"{FLOW_YAML}: {path}.up_scale_factor = {scale!r} is not supported (only up_stride, {stride})"
        )

    def integer(key: str) -> int:
        return _number(section, key, path, _ENCODER_DEFAULTS.get(key), int)

    config = EncoderConfig(
        input_size=integer("input_size"),
        output_size=integer("output_size"),
        attention_heads=integer("attention_heads"),
        linear_units=integer("linear_units"),
        num_blocks=integer("num_blocks"),
        static_chunk_size=0,
        num_up_blocks=integer("num_up_blocks"),
        upsample_stride=stride,
    )
    return config, integer("pre_lookahead_len")


def _estimator(section: dict[str, Any]) -> DiTConfig:
    path = "flow.decoder.estimator"
    _unknown(section, {f.name for f in fields(DiTConfig)}, path)
    values = {}
    for field in fields(DiTConfig):
        default = None if field.default is MISSING else field.default
        kind = float if field.name == "mlp_ratio" else int
        values[field.name] = _number(section, field.name, path, default, kind)
    return DiTConfig(**values)


def dit_flow_config_from_text(text: str, source: str = FLOW_YAML) -> DiTFlowConfig:
    """Parse flow.yaml text; `source` names the file in errors."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as err:
        raise ConfigError(f"{source}: not valid YAML: {err}") from err
    flow_node = _children(root).get("flow") if root is not None else None
    if flow_node is None:
        raise ConfigError(f"{source}: missing section flow")
    _check_tags(flow_node)
    flow = _section(read_hyperpyyaml(text), "flow", "")
    _unknown(flow, _FLOW_KEYS, "flow")
    if flow.get("output_type", "mel") != "mel":
        raise ConfigError(
            f"{source}: flow.output_type = {flow['output_type']!r} is not supported (only 'mel')"
        )
    decoder = _section(flow, "decoder", "flow")
    _unknown(decoder, _CFM_KEYS, "flow.decoder")
    encoder, lookahead = _encoder(
        {k: v for k, v in _section(flow, "encoder", "flow").items() if k not in _ENCODER_IGNORED}
    )
    config = DiTFlowConfig(
        encoder=encoder,
        estimator=_estimator(_section(decoder, "estimator", "flow.decoder")),
        pre_lookahead_len=lookahead,
        inference_cfg_rate=_number(decoder, "inference_cfg_rate", "flow.decoder", 0.7, float),
        input_size=_number(flow, "input_size", "flow", 512, int),
        output_size=_number(flow, "output_size", "flow", 80, int),
        spk_embed_dim=_number(flow, "spk_embed_dim", "flow", 192, int),
        vocab_size=_number(flow, "vocab_size", "flow", 5121, int),
    )
    config.validate()
    return config


def load_dit_flow_config(path: str | Path) -> DiTFlowConfig:
    """Read `flow.yaml` (give the file or the token2wav directory that holds it)."""
    path = Path(path)
    if path.is_dir():
        path = path / FLOW_YAML
    if not path.is_file():
        raise ConfigError(f"config not found: {path}")
    return dit_flow_config_from_text(path.read_text(), str(path))
