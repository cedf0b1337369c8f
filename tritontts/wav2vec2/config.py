"""The fields of a wav2vec2 `config.json` that the encoder's inference path needs."""

from __future__ import annotations

import json
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

SUPPORTED_ACTIVATIONS = ("gelu", "relu")


@dataclass(frozen=True)
class Wav2Vec2Config:
    """Required fields have no default; the others default as transformers' `Wav2Vec2Config` does."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    conv_dim: tuple[int, ...]
    conv_kernel: tuple[int, ...]
    conv_stride: tuple[int, ...]
    conv_bias: bool
    feat_extract_norm: str
    do_stable_layer_norm: bool
    num_conv_pos_embeddings: int
    num_conv_pos_embedding_groups: int
    hidden_act: str = "gelu"
    feat_extract_activation: str = "gelu"
    layer_norm_eps: float = 1e-5
    mask_time_prob: float = 0.05
    mask_feature_prob: float = 0.0
    add_adapter: bool = False
    adapter_attn_dim: int | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("conv_dim", "conv_kernel", "conv_stride"):
            object.__setattr__(self, name, tuple(int(v) for v in getattr(self, name)))
        self.validate()

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def has_masked_spec_embed(self) -> bool:
        """Whether the checkpoint carries `masked_spec_embed` (transformers creates it only for masking)."""
        return self.mask_time_prob > 0.0 or self.mask_feature_prob > 0.0

    def validate(self) -> None:
        problems = []
        if not self.do_stable_layer_norm:
            problems.append("do_stable_layer_norm=false (post-norm wav2vec2) is not supported")
        if self.feat_extract_norm not in ("layer", "group"):
            problems.append(f"feat_extract_norm must be 'layer' or 'group', got {self.feat_extract_norm!r}")
        for name in ("hidden_act", "feat_extract_activation"):
            if getattr(self, name) not in SUPPORTED_ACTIVATIONS:
                problems.append(f"{name}={getattr(self, name)!r} is not one of {SUPPORTED_ACTIVATIONS}")
        if not len(self.conv_dim) == len(self.conv_kernel) == len(self.conv_stride):
            problems.append("conv_dim, conv_kernel and conv_stride must have the same length")
        if self.hidden_size % self.num_attention_heads:
            problems.append("hidden_size must be divisible by num_attention_heads")
        if self.hidden_size % self.num_conv_pos_embedding_groups:
            problems.append("hidden_size must be divisible by num_conv_pos_embedding_groups")
        if self.add_adapter or self.adapter_attn_dim is not None:
            problems.append("adapters (add_adapter / adapter_attn_dim) are not supported")
        if problems:
            raise ValueError("unsupported wav2vec2 config: " + "; ".join(problems))

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Wav2Vec2Config:
        known = {f.name for f in fields(cls)} - {"extra"}
        num_conv = values.get("num_feat_extract_layers")
        if num_conv is not None and "conv_dim" in values and num_conv != len(values["conv_dim"]):
            raise ValueError(
                f"unsupported wav2vec2 config: num_feat_extract_layers={num_conv} "
                f"but conv_dim has {len(values['conv_dim'])} entries"
            )
        required = {f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING}
        absent = sorted(required - set(values))
        if absent:
            raise ValueError(f"wav2vec2 config lacks required fields: {', '.join(absent)}")
        kwargs = {k: v for k, v in values.items() if k in known}
        extra = {k: v for k, v in values.items() if k not in known}
        return cls(**kwargs, extra=extra)

    @classmethod
    def from_json(cls, path: str | Path) -> Wav2Vec2Config:
        return cls.from_dict(json.loads(Path(path).read_text()))
