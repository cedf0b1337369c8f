"""`cosyvoice2.yaml` as the hub ships it (HyperPyYAML), read without hyperpyyaml into dataclasses.

Tagged nodes become plain data: `!new:pkg.Class {k: v}` and `!name:pkg.fn {k: v}` become the mapping
(the class path is dropped), a tagged sequence becomes the list, an empty tagged node becomes None.
`!ref <name>` is replaced by the referenced top-level value (`<a[b]>` reaches into mappings), and a
reference with arithmetic such as `!ref <chunk_size> * <token_mel_ratio>` is evaluated. Sections the
model does not use (training, discriminators, data pipeline, seeds) are parsed and ignored.
"""

from __future__ import annotations

import ast
import operator
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tritontts.spark.config import ConfigError, _build

_REF = re.compile(r"<([^<>]+)>")
_YAML12_FLOAT = re.compile(r"^[-+]?(?:\d[\d_]*)?(?:\.\d*)?[eE][-+]?\d+$")
_ARITHMETIC = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


@dataclass(frozen=True)
class _Ref:
    expression: str


class _HyperLoader(yaml.SafeLoader):
    """SafeLoader that also reads YAML 1.2 floats such as `1e-06` (HyperPyYAML uses ruamel)."""


_HyperLoader.add_implicit_resolver("tag:yaml.org,2002:float", _YAML12_FLOAT, list("-+0123456789."))


def _construct_tagged(loader: yaml.SafeLoader, _suffix: str, node: yaml.Node) -> Any:
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node, deep=True)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node, deep=True)
    value = loader.construct_scalar(node)
    return value if value != "" else None


def _construct_ref(loader: yaml.SafeLoader, node: yaml.Node) -> _Ref:
    return _Ref(str(loader.construct_scalar(node)).strip())


for _tag in ("!new:", "!name:", "!apply:", "!module:"):
    _HyperLoader.add_multi_constructor(_tag, _construct_tagged)
_HyperLoader.add_constructor("!ref", _construct_ref)


def _lookup(root: dict[str, Any], name: str) -> Any:
    head, *keys = re.split(r"[\[\]]+", name.strip().rstrip("]"))
    if head not in root:
        raise ConfigError(f"!ref <{name}>: no top-level key {head!r}")
    value = root[head]
    for key in keys:
        value = value[int(key) if isinstance(value, list) else key]
    return value


def _evaluate(expression: str) -> int | float:
    def visit(node: ast.AST) -> int | float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
            return _ARITHMETIC[type(node.op)](visit(node.left), visit(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -visit(node.operand)
        raise ConfigError(f"!ref: unsupported expression {expression!r}")

    return visit(ast.parse(expression, mode="eval").body)


def _resolve(value: Any, root: dict[str, Any], active: tuple[str, ...] = ()) -> Any:
    if isinstance(value, _Ref):
        if value.expression in active:
            raise ConfigError(f"!ref {value.expression!r} refers to itself")
        inner = active + (value.expression,)
        whole = _REF.fullmatch(value.expression)
        if whole:
            return _resolve(_lookup(root, whole.group(1)), root, inner)

        def substitute(match: re.Match[str]) -> str:
            return repr(_resolve(_lookup(root, match.group(1)), root, inner))

        return _evaluate(_REF.sub(substitute, value.expression))
    if isinstance(value, dict):
        return {k: _resolve(v, root, active) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(v, root, active) for v in value]
    return value


def read_hyperpyyaml(text: str) -> dict[str, Any]:
    """The document as plain data with every `!ref` resolved."""
    raw = yaml.load(text, Loader=_HyperLoader) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"expected a mapping at the top of the yaml, found {type(raw).__name__}")
    return _resolve(raw, raw)


@dataclass(frozen=True)
class EncoderConfig:
    """UpsampleConformerEncoder: linear embed + rel-pos conformer blocks, 2x upsample, more blocks."""

    input_size: int
    output_size: int = 256
    attention_heads: int = 4
    linear_units: int = 2048
    num_blocks: int = 6
    static_chunk_size: int = 0
    num_up_blocks: int = 4  # fixed in upstream code, not a yaml key
    upsample_stride: int = 2  # fixed in upstream code, not a yaml key


@dataclass(frozen=True)
class EstimatorConfig:
    """CausalConditionalDecoder: the U-Net that predicts the flow's velocity."""

    in_channels: int
    out_channels: int
    channels: tuple[int, ...] = (256, 256)
    attention_head_dim: int = 64
    n_blocks: int = 1
    num_mid_blocks: int = 2
    num_heads: int = 4
    act_fn: str = "snake"
    static_chunk_size: int = 50
    num_decoding_left_chunks: int = 2


@dataclass(frozen=True)
class CFMConfig:
    """CausalConditionalCFM: Euler solver over a cosine t-schedule with classifier-free guidance."""

    in_channels: int = 240
    spk_emb_dim: int = 64
    sigma_min: float = 1e-6
    solver: str = "euler"
    t_scheduler: str = "cosine"
    inference_cfg_rate: float = 0.7
    n_timesteps: int = 10  # fixed by upstream CausalMaskedDiffWithXvec.inference

    @classmethod
    def from_decoder(cls, decoder: dict[str, Any]) -> CFMConfig:
        """From the resolved `flow.decoder` section: its `cfm_params` (an omegaconf DictConfig's `content`)
        plus the decoder's own `in_channels` and `spk_emb_dim`."""
        params = decoder.get("cfm_params") or {}
        params = params.get("content", params)
        values = {k: v for k, v in decoder.items() if k in ("in_channels", "spk_emb_dim")}
        return _build(cls, {**values, **params}, "flow.decoder.cfm_params", lenient=True)

    def validate(self) -> None:
        if self.solver != "euler":
            raise ConfigError(f"flow.decoder.cfm_params.solver {self.solver!r} is not supported (euler only)")


@dataclass(frozen=True)
class FlowConfig:
    """CausalMaskedDiffWithXvec: speech tokens (+ prompt mel, speaker x-vector) → 80-bin mel."""

    encoder: EncoderConfig
    estimator: EstimatorConfig
    cfm: CFMConfig
    input_size: int = 512
    output_size: int = 80
    spk_embed_dim: int = 192
    vocab_size: int = 4096
    token_mel_ratio: int = 2
    pre_lookahead_len: int = 3

    @classmethod
    def from_yaml_dict(cls, flow: dict[str, Any]) -> FlowConfig:
        """From the resolved `flow:` section."""
        for key in ("encoder", "decoder"):
            if not isinstance(flow.get(key), dict):
                raise ConfigError(f"flow: missing section {key!r}")
        decoder = flow["decoder"]
        if not isinstance(decoder.get("estimator"), dict):
            raise ConfigError("flow.decoder: missing section 'estimator'")
        _check_supported(flow["encoder"], "flow.encoder", _ENCODER_SUPPORTED)
        estimator_raw = dict(decoder["estimator"])
        if "channels" in estimator_raw:
            estimator_raw["channels"] = tuple(estimator_raw["channels"])
        estimator = _build(EstimatorConfig, estimator_raw, "flow.decoder.estimator", lenient=True)
        cfm = CFMConfig.from_decoder(decoder)
        encoder = _build(EncoderConfig, flow["encoder"], "flow.encoder", lenient=True)
        values = {k: v for k, v in flow.items() if k not in ("encoder", "decoder")}
        config = _build(
            cls, {**values, "encoder": encoder, "estimator": estimator, "cfm": cfm}, "flow", lenient=True
        )
        config.validate()
        return config

    def validate(self) -> None:
        enc, est, cfm = self.encoder, self.estimator, self.cfm
        if enc.input_size != self.input_size:
            raise ConfigError(
                f"flow.encoder.input_size {enc.input_size} != flow.input_size {self.input_size}"
            )
        if enc.output_size % enc.attention_heads:
            raise ConfigError("flow.encoder.output_size must divide by attention_heads")
        if est.in_channels != 4 * self.output_size or est.out_channels != self.output_size:
            raise ConfigError(
                f"estimator in/out channels {est.in_channels}/{est.out_channels} must be "
                f"4*{self.output_size}/{self.output_size} (x, mu, speaker, cond)"
            )
        if est.act_fn != "gelu":
            raise ConfigError(f"flow.decoder.estimator.act_fn {est.act_fn!r} is not supported (gelu only)")
        if enc.upsample_stride != self.token_mel_ratio:
            raise ConfigError(
                f"token_mel_ratio {self.token_mel_ratio} != encoder upsample stride {enc.upsample_stride}"
            )
        cfm.validate()


_ENCODER_SUPPORTED: dict[str, Any] = {
    "input_layer": "linear",
    "pos_enc_layer_type": "rel_pos_espnet",
    "selfattention_layer_type": "rel_selfattn",
    "normalize_before": True,
    "use_cnn_module": False,
    "macaron_style": False,
    "activation_type": "swish",
    "key_bias": True,
}


def _check_supported(section: dict[str, Any], name: str, supported: dict[str, Any]) -> None:
    for key, value in supported.items():
        if key in section and section[key] != value:
            raise ConfigError(f"{name}.{key} = {section[key]!r} is not supported (only {value!r})")


@dataclass(frozen=True)
class CosyVoice2Config:
    sample_rate: int
    token_frame_rate: int
    token_mel_ratio: int
    chunk_size: int
    flow: FlowConfig
    hift: dict[str, Any]
    llm: dict[str, Any]


def cosyvoice2_config_from_text(text: str, source: str = "cosyvoice2.yaml") -> CosyVoice2Config:
    data = read_hyperpyyaml(text)
    missing = [key for key in ("sample_rate", "flow", "hift", "llm") if key not in data]
    if missing:
        raise ConfigError(f"{source}: missing keys {missing}")
    flow = FlowConfig.from_yaml_dict(data["flow"])
    return CosyVoice2Config(
        sample_rate=int(data["sample_rate"]),
        token_frame_rate=int(data.get("token_frame_rate", 25)),
        token_mel_ratio=int(data.get("token_mel_ratio", flow.token_mel_ratio)),
        chunk_size=int(data.get("chunk_size", 25)),
        flow=flow,
        hift=data["hift"],
        llm=data["llm"],
    )


def load_cosyvoice2_config(path: str | Path) -> CosyVoice2Config:
    """Read `cosyvoice2.yaml` (give the file or the model directory that holds it)."""
    path = config_file(path, "cosyvoice2.yaml")
    return cosyvoice2_config_from_text(path.read_text(), str(path))


def config_file(path: str | Path, name: str) -> Path:
    """`path`, or the file `name` in it when it is a directory; ConfigError when that does not exist."""
    path = Path(path)
    if path.is_dir():
        path = path / name
    if not path.exists():
        raise ConfigError(f"config not found: {path}")
    return path
