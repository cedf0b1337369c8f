"""Hugging Face Qwen2 checkpoints (single file or sharded) into our fused-projection model, strictly."""

from __future__ import annotations

from pathlib import Path

import torch

from tritontts.checkpoint import CheckpointError, find_weights, load_strict, read_state_dict
from tritontts.llm.config import Qwen2Config
from tritontts.llm.model import Qwen2ForCausalLM

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
FUSED = {
    "self_attn.qkv_proj.weight": (
        "self_attn.q_proj.weight",
        "self_attn.k_proj.weight",
        "self_attn.v_proj.weight",
    ),
    "self_attn.qkv_proj.bias": ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"),
    "mlp.gate_up_proj.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
}


def _pop(state: dict[str, torch.Tensor], key: str, source: str) -> torch.Tensor:
    if key not in state:
        raise CheckpointError(f"{source} does not match Qwen2ForCausalLM: missing keys: {key}")
    return state.pop(key)


def fuse_projections(
    state: dict[str, torch.Tensor], config: Qwen2Config, source: str
) -> dict[str, torch.Tensor]:
    """Replace each layer's q/k/v and gate/up tensors by their concatenation; drop derived RoPE buffers."""
    state = {k: v for k, v in state.items() if not k.endswith("rotary_emb.inv_freq")}
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    for i in range(config.num_hidden_layers):
        prefix = f"model.layers.{i}."
        for fused, parts in FUSED.items():
            tensors = [_pop(state, prefix + part, source) for part in parts]
            if len({t.dtype for t in tensors}) != 1 or len({t.shape[1:] for t in tensors}) != 1:
                raise CheckpointError(f"{source}: {prefix}{fused} parts disagree in dtype or shape")
            state[prefix + fused] = torch.cat(tensors, dim=0)
    return state


def build_model(
    config: Qwen2Config,
    state: dict[str, torch.Tensor],
    device: torch.device | str,
    dtype: torch.dtype,
    source: str,
) -> Qwen2ForCausalLM:
    """A model in `dtype` on `device` holding `state` (HF names, unfused), in eval mode."""
    with torch.device("meta"):
        model = Qwen2ForCausalLM(config)
    model = model.to_empty(device="cpu").to(dtype)
    load_strict(model, fuse_projections(dict(state), config, source), source=source)
    return model.to(device).eval().requires_grad_(False)


def load_pretrained(
    model_dir: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype | None = None
) -> Qwen2ForCausalLM:
    """`dtype` None means fp32 on CPU and the config's dtype elsewhere."""
    model_dir = Path(model_dir)
    config = Qwen2Config.from_file(model_dir / "config.json")
    if dtype is None:
        dtype = torch.float32 if torch.device(device).type == "cpu" else getattr(torch, config.torch_dtype)
    weights = find_weights(model_dir, WEIGHT_FILES)
    return build_model(config, read_state_dict(weights), device, dtype, source=str(weights))


def output_token_id(model_dir: str | Path, token: int | str) -> int:
    """`token` as a vocabulary id: an int or digits as they are, a token's text through the checkpoint's
    tokenizer.json (`<|s_0|>`, `<|im_end|>`), "" as 0 (every id)."""
    if isinstance(token, int):
        return token
    if token.strip() in ("", "0"):
        return 0
    if token.strip().isdigit():
        return int(token)
    from tokenizers import Tokenizer

    path = Path(model_dir) / "tokenizer.json"
    if not path.is_file():
        raise CheckpointError(f"output tokens from {token!r}: no tokenizer.json in {model_dir} to look it up")
    found = Tokenizer.from_file(str(path)).token_to_id(token)
    if found is None:
        raise CheckpointError(f"output tokens from {token!r}: {path} has no such token")
    return found
