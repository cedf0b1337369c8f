"""The Qwen2 hyper-parameters the engine needs, read from a Hugging Face `config.json`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

DTYPE_NAMES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class Qwen2Config:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = False
    torch_dtype: str = "float32"

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def kv_dim(self) -> int:
        return self.head_dim * self.num_key_value_heads

    @classmethod
    def from_dict(cls, raw: dict) -> Qwen2Config:
        if raw.get("model_type", "qwen2") != "qwen2":
            raise ValueError(f"expected a qwen2 config, got model_type={raw.get('model_type')!r}")
        if raw.get("use_sliding_window"):
            raise ValueError("sliding-window attention is not supported")
        if raw.get("rope_scaling"):
            raise ValueError(f"rope_scaling is not supported: {raw['rope_scaling']}")
        rope = raw.get("rope_parameters") or {}
        if rope.get("rope_type", "default") != "default":
            raise ValueError(f"rope_parameters are not supported: {rope}")
        rope_theta = raw.get("rope_theta", rope.get("rope_theta", 10000.0))
        dtype = raw.get("torch_dtype") or raw.get("dtype") or "float32"
        config = cls(
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_hidden_layers=raw["num_hidden_layers"],
            num_attention_heads=raw["num_attention_heads"],
            num_key_value_heads=raw.get("num_key_value_heads", raw["num_attention_heads"]),
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope_theta),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            torch_dtype=dtype if dtype in DTYPE_NAMES else "float32",
        )
        if config.hidden_size % config.num_attention_heads:
            raise ValueError("hidden_size must be a multiple of num_attention_heads")
        if config.num_attention_heads % config.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        return config

    @classmethod
    def from_file(cls, path: str | Path) -> Qwen2Config:
        return cls.from_dict(json.loads(Path(path).read_text()))
