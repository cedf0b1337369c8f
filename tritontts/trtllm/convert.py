"""HF Qwen2 checkpoint -> TensorRT-LLM checkpoint (`config.json` + `rank{N}.safetensors`).

The names and the layout are those of TensorRT-LLM's own Qwen converter (`tensorrt_llm/models/qwen/convert.py`):
q|k|v fused into `attention.qkv`, `mlp.fc` = HF `gate_proj` (the input of the activation), `mlp.gate` = HF
`up_proj`, `mlp.proj` = HF `down_proj`; `lm_head.weight` is written even when the embeddings are tied.
Tensor parallelism: column-parallel qkv/fc/gate split on the output dim, row-parallel dense/proj on the
input dim, vocab-parallel lm_head padded to a multiple of tp; kv heads are repeated when there are fewer
of them than ranks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tritontts.checkpoint import CheckpointError, find_weights, read_state_dict, write_safetensors

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
HF_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


@dataclass(frozen=True)
class HfQwen2Config:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_size: int
    rope_theta: float
    rope_scaling: dict | None
    rms_norm_eps: float
    max_position_embeddings: int
    hidden_act: str
    tie_word_embeddings: bool
    torch_dtype: str | None
    seq_length: int

    @classmethod
    def from_dict(cls, cfg: dict[str, Any]) -> HfQwen2Config:
        model_type = cfg.get("model_type", "qwen2")
        if model_type != "qwen2":
            raise CheckpointError(f"expected a qwen2 config.json, found model_type={model_type!r}")
        heads = cfg["num_attention_heads"]
        rope = cfg.get("rope_parameters") or {}
        scaling = cfg.get("rope_scaling")
        if scaling is None and rope.get("rope_type", "default") != "default":
            scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
        return cls(
            architecture=(cfg.get("architectures") or ["Qwen2ForCausalLM"])[0],
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=cfg.get("num_key_value_heads") or heads,
            head_size=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rope_theta=float(cfg.get("rope_theta", rope.get("rope_theta", 10000.0))),
            rope_scaling=scaling,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            max_position_embeddings=cfg["max_position_embeddings"],
            hidden_act=cfg.get("hidden_act", "silu"),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            torch_dtype=cfg.get("torch_dtype") or cfg.get("dtype"),
            seq_length=cfg.get("seq_length", 8192),
        )

    @classmethod
    def read(cls, model_dir: str | Path) -> HfQwen2Config:
        path = Path(model_dir) / "config.json"
        if not path.exists():
            raise CheckpointError(f"no config.json in {model_dir}")
        return cls.from_dict(json.loads(path.read_text()))


@dataclass(frozen=True)
class ConvertOptions:
    dtype: str = "auto"  # auto | float32 | float16 | bfloat16
    tp_size: int = 1
    pp_size: int = 1
    use_parallel_embedding: bool = False
    embedding_sharding_dim: int = 0  # 0: vocab rows, 1: hidden columns


def resolve_dtype(requested: str, hf_dtype: str | None) -> str:
    """`auto` keeps a half-precision source dtype and turns float32 into float16, as TensorRT-LLM does."""
    if requested != "auto":
        if requested not in DTYPES:
            raise ValueError(f"dtype must be auto or one of {sorted(DTYPES)}, not {requested!r}")
        return requested
    return hf_dtype if hf_dtype in ("float16", "bfloat16") else "float16"


def pad_to_multiple(n: int, k: int) -> int:
    return -(-n // k) * k


def trtllm_config(hf: HfQwen2Config, options: ConvertOptions) -> dict[str, Any]:
    """The `config.json` of the TensorRT-LLM checkpoint (QWenConfig.to_dict's fields)."""
    world_size = options.tp_size * options.pp_size
    return {
        "architecture": hf.architecture,
        "dtype": resolve_dtype(options.dtype, hf.torch_dtype),
        "logits_dtype": "float32",
        "vocab_size": hf.vocab_size,
        "max_position_embeddings": hf.max_position_embeddings,
        "hidden_size": hf.hidden_size,
        "num_hidden_layers": hf.num_hidden_layers,
        "num_attention_heads": hf.num_attention_heads,
        "num_key_value_heads": hf.num_key_value_heads,
        "head_size": hf.head_size,
        "intermediate_size": hf.intermediate_size,
        "hidden_act": hf.hidden_act,
        "norm_epsilon": hf.rms_norm_eps,
        "position_embedding_type": "rope_gpt_neox",
        "rotary_base": hf.rope_theta,
        "rotary_scaling": hf.rope_scaling,
        "rotary_embedding_dim": hf.head_size,
        "use_parallel_embedding": options.use_parallel_embedding,
        "embedding_sharding_dim": options.embedding_sharding_dim,
        "qk_layernorm": False,
        "tie_word_embeddings": hf.tie_word_embeddings,
        "mapping": {
            "world_size": world_size,
            "gpus_per_node": 8,
            "cp_size": 1,
            "tp_size": options.tp_size,
            "pp_size": options.pp_size,
            "moe_tp_size": options.tp_size,
            "moe_ep_size": 1,
        },
        "quantization": {
            "quant_algo": None,
            "kv_cache_quant_algo": None,
            "group_size": 128,
            "smoothquant_val": 0.5,
            "clamp_val": None,
            "has_zero_point": False,
            "pre_quant_scale": False,
            "exclude_modules": None,
        },
        "qwen_type": "qwen2",
        "mlp_bias": False,
        "attn_bias": True,
        "disable_weight_only_quant_plugin": False,
        "use_logn_attn": False,
        "seq_length": hf.seq_length,
        "moe": {"num_experts": 0, "top_k": 0, "normalization_mode": 0},
        "moe_intermediate_size": 0,
        "moe_shared_expert_intermediate_size": 0,
        "num_labels": 1,
    }


def expected_hf_keys(hf: HfQwen2Config) -> set[str]:
    keys = {"model.embed_tokens.weight", "model.norm.weight"}
    if not hf.tie_word_embeddings:
        keys.add("lm_head.weight")
    for i in range(hf.num_hidden_layers):
        p = f"model.layers.{i}."
        keys |= {p + f"self_attn.{n}_proj.{s}" for n in "qkv" for s in ("weight", "bias")}
        keys |= {
            p + f"{m}.weight" for m in ("self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
        }
        keys |= {p + "input_layernorm.weight", p + "post_attention_layernorm.weight"}
    return keys


def check_hf_state(state: dict[str, torch.Tensor], hf: HfQwen2Config) -> None:
    """Every Qwen2 weight present, nothing foreign (a tied model may still ship `lm_head.weight`)."""
    expected = expected_hf_keys(hf)
    tolerated = {"lm_head.weight"} if hf.tie_word_embeddings else set()
    missing = sorted(expected - set(state))
    unexpected = sorted(k for k in set(state) - expected - tolerated if not k.endswith("rotary_emb.inv_freq"))
    problems = []
    if missing:
        problems.append(f"missing keys: {', '.join(missing)}")
    if unexpected:
        problems.append(f"unexpected keys: {', '.join(unexpected)}")
    if problems:
        raise CheckpointError("HF Qwen2 checkpoint: " + " | ".join(problems))


def read_hf_state(model_dir: str | Path) -> dict[str, torch.Tensor]:
    return read_state_dict(find_weights(model_dir, HF_WEIGHT_FILES))


def shard(t: torch.Tensor, tp_size: int, rank: int, dim: int = 0) -> torch.Tensor:
    if t.shape[dim] % tp_size:
        raise ValueError(f"cannot split dim {dim} of size {t.shape[dim]} into {tp_size} equal parts")
    return t.chunk(tp_size, dim=dim)[rank].contiguous()


def repeat_kv_heads(t: torch.Tensor, num_kv_heads: int, tp_size: int) -> torch.Tensor:
    """Repeat each kv head tp/num_kv times in place, so that every rank holds one whole kv head."""
    if tp_size % num_kv_heads:
        raise ValueError(f"tp_size {tp_size} is not a multiple of num_key_value_heads {num_kv_heads}")
    heads = t.reshape(num_kv_heads, -1, *t.shape[1:])
    return heads.repeat_interleave(tp_size // num_kv_heads, dim=0).reshape(-1, *t.shape[1:])


def fused_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hf: HfQwen2Config, tp: int, rank: int):
    if hf.num_attention_heads % tp:
        raise ValueError(f"num_attention_heads {hf.num_attention_heads} is not divisible by tp_size {tp}")
    if hf.num_key_value_heads < tp:
        k, v = repeat_kv_heads(k, hf.num_key_value_heads, tp), repeat_kv_heads(v, hf.num_key_value_heads, tp)
    elif hf.num_key_value_heads % tp:
        raise ValueError(f"num_key_value_heads {hf.num_key_value_heads} is not divisible by tp_size {tp}")
    return torch.cat([shard(q, tp, rank), shard(k, tp, rank), shard(v, tp, rank)], dim=0)


def pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    if t.shape[0] == rows:
        return t
    return torch.cat([t, t.new_zeros(rows - t.shape[0], *t.shape[1:])], dim=0)


def convert_rank(
    state: dict[str, torch.Tensor], hf: HfQwen2Config, options: ConvertOptions, rank: int
) -> dict[str, torch.Tensor]:
    """The weights of tensor-parallel rank `rank`, in TensorRT-LLM's names, cast to the target dtype."""
    if options.pp_size != 1:
        raise ValueError("pipeline parallelism is not supported by this converter: use --pp_size 1")
    tp = options.tp_size
    dtype = DTYPES[resolve_dtype(options.dtype, hf.torch_dtype)]

    def get(name: str) -> torch.Tensor:
        return state[name].to(dtype)

    out: dict[str, torch.Tensor] = {}
    for i in range(hf.num_hidden_layers):
        src, dst = f"model.layers.{i}.", f"transformer.layers.{i}."
        attn, mlp = src + "self_attn.", src + "mlp."
        for suffix in ("weight", "bias"):
            q, k, v = (get(f"{attn}{n}_proj.{suffix}") for n in "qkv")
            out[dst + f"attention.qkv.{suffix}"] = fused_qkv(q, k, v, hf, tp, rank)
        out[dst + "attention.dense.weight"] = shard(get(attn + "o_proj.weight"), tp, rank, dim=1)
        out[dst + "mlp.fc.weight"] = shard(get(mlp + "gate_proj.weight"), tp, rank, dim=0)
        out[dst + "mlp.gate.weight"] = shard(get(mlp + "up_proj.weight"), tp, rank, dim=0)
        out[dst + "mlp.proj.weight"] = shard(get(mlp + "down_proj.weight"), tp, rank, dim=1)
        out[dst + "input_layernorm.weight"] = get(src + "input_layernorm.weight")
        out[dst + "post_layernorm.weight"] = get(src + "post_attention_layernorm.weight")

    embedding = get("model.embed_tokens.weight")
    padded_vocab = pad_to_multiple(hf.vocab_size, tp)
    head = embedding if hf.tie_word_embeddings else get("lm_head.weight")
    out["lm_head.weight"] = shard(pad_rows(head, padded_vocab), tp, rank, dim=0)
    if options.use_parallel_embedding and tp > 1:
        if options.embedding_sharding_dim == 0:
            embedding = shard(pad_rows(embedding, padded_vocab), tp, rank, dim=0)
        else:
            embedding = shard(embedding, tp, rank, dim=1)
    out["transformer.vocab_embedding.weight"] = embedding.clone()
    out["transformer.ln_f.weight"] = get("model.norm.weight")
    return out


def convert_checkpoint(model_dir: str | Path, output_dir: str | Path, options: ConvertOptions) -> Path:
    """Write `config.json` and one `rank{N}.safetensors` per tensor-parallel rank into `output_dir`."""
    if options.tp_size < 1 or options.pp_size != 1:
        raise ValueError(f"need tp_size >= 1 and pp_size == 1, got tp={options.tp_size} pp={options.pp_size}")
    if options.embedding_sharding_dim not in (0, 1):
        raise ValueError("embedding_sharding_dim must be 0 or 1")
    hf = HfQwen2Config.read(model_dir)
    state = read_hf_state(model_dir)
    check_hf_state(state, hf)
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    for rank in range(options.tp_size):
        write_safetensors(convert_rank(state, hf, options, rank), output_dir / f"rank{rank}.safetensors")
    config = trtllm_config(hf, options)
    (output_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return output_dir
