"""Random Qwen2 causal-LM weights and configs in the Hugging Face on-disk layout of Spark-TTS's `LLM/`."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from tritontts.checkpoint import write_safetensors
from tritontts.spark import tokens as layout
from tritontts.synthetic.length_counter import (
    LENGTH_CHANNEL,
    SPEECH_CHANNEL,
    LengthCounter,
    end_row_channels,
    fixed_norm_rows,
    install_counter,
)
from tritontts.synthetic.presets import preset_entry


@dataclass(frozen=True)
class Qwen2Preset:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    dtype: torch.dtype


PRESETS = {
    "full": Qwen2Preset(896, 24, 14, 2, 4864, torch.float32),
    "tiny": Qwen2Preset(64, 2, 4, 2, 128, torch.float32),
}
SPEECH_CHANNEL_GAIN = 1500.0
SPEECH_CHANNEL_INPUT = 0.2  # the speech channel of speech-token embeddings (other tokens: TEXT_CHANNEL_INPUT)
TEXT_CHANNEL_INPUT = 0.05
DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float32: "float32", torch.float16: "float16"}


def _preset(preset: str, dtype: torch.dtype | None) -> Qwen2Preset:
    p = preset_entry(PRESETS, preset)
    return p if dtype is None else replace(p, dtype=dtype)


def qwen2_config(preset: str, vocab_size: int = layout.VOCAB_SIZE, dtype: torch.dtype | None = None) -> dict:
    """config.json as Spark-TTS-0.5B ships it (for `full`); `tiny` changes only the sizes and dtype."""
    p = _preset(preset, dtype)
    ids = layout.token_ids()
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": ids[layout.PAD_TOKEN],
        "eos_token_id": ids[layout.EOS_TOKEN],
        "hidden_act": "silu",
        "hidden_size": p.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": p.intermediate_size,
        "max_position_embeddings": 32768,
        "max_window_layers": p.num_hidden_layers,
        "model_type": "qwen2",
        "num_attention_heads": p.num_attention_heads,
        "num_hidden_layers": p.num_hidden_layers,
        "num_key_value_heads": p.num_key_value_heads,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000.0,
        "sliding_window": 32768,
        "tie_word_embeddings": True,
        "torch_dtype": DTYPE_NAMES[p.dtype],
        "transformers_version": "4.43.1",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": vocab_size,
    }


def generation_config() -> dict:
    ids = layout.token_ids()
    return {
        "bos_token_id": ids[layout.PAD_TOKEN],
        "eos_token_id": ids[layout.EOS_TOKEN],
        "transformers_version": "4.43.1",
    }


def qwen2_state_dict(
    preset: str,
    seed: int,
    vocab_size: int = layout.VOCAB_SIZE,
    dtype: torch.dtype | None = None,
    speech_tokens: tuple[int, int] | None = None,
    counter: LengthCounter | None = None,
    row_weights: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Random weights with HF Qwen2 names; tied embeddings, so no `lm_head.weight`.

    Small embeddings and strong residual branches keep greedy decoding from locking onto one token.
    `speech_tokens` (a [start, end) id range) makes the model "speak": no layer writes hidden channel 0, so it
    keeps the input embedding's small positive value; the final norm amplifies that channel, and the tied
    embedding rows of speech tokens are larger in it, so sampling picks speech tokens (as a trained TTS LLM
    does) while the other channels keep the choice random.
    """
    p = _preset(preset, dtype)
    gen = torch.Generator().manual_seed(seed)
    head_dim = p.hidden_size // p.num_attention_heads
    kv_dim = head_dim * p.num_key_value_heads
    h, ff = p.hidden_size, p.intermediate_size

    def normal(*shape: int, std: float) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * std).to(p.dtype)

    def norm_weight() -> torch.Tensor:
        return (1.0 + 0.1 * torch.randn(h, generator=gen)).to(p.dtype)

    state = {"model.embed_tokens.weight": normal(vocab_size, h, std=0.05)}
    for i in range(p.num_hidden_layers):
        prefix = f"model.layers.{i}."
        state.update(
            {
                prefix + "self_attn.q_proj.weight": normal(h, h, std=h**-0.5),
                prefix + "self_attn.q_proj.bias": normal(h, std=0.1),
                prefix + "self_attn.k_proj.weight": normal(kv_dim, h, std=h**-0.5),
                prefix + "self_attn.k_proj.bias": normal(kv_dim, std=0.1),
                prefix + "self_attn.v_proj.weight": normal(kv_dim, h, std=h**-0.5),
                prefix + "self_attn.v_proj.bias": normal(kv_dim, std=0.1),
                prefix + "self_attn.o_proj.weight": normal(h, h, std=3 * h**-0.5),
                prefix + "mlp.gate_proj.weight": normal(ff, h, std=h**-0.5),
                prefix + "mlp.up_proj.weight": normal(ff, h, std=h**-0.5),
                prefix + "mlp.down_proj.weight": normal(h, ff, std=3 * ff**-0.5),
                prefix + "input_layernorm.weight": norm_weight(),
                prefix + "post_attention_layernorm.weight": norm_weight(),
            }
        )
    state["model.norm.weight"] = norm_weight()
    if speech_tokens is not None:
        embed = state["model.embed_tokens.weight"]
        speech_values = torch.full((vocab_size,), TEXT_CHANNEL_INPUT)
        speech_values[speech_tokens[0] : speech_tokens[1]] = SPEECH_CHANNEL_INPUT
        if counter is None:
            embed[:, SPEECH_CHANNEL] = speech_values.to(p.dtype)
        else:
            if row_weights is None or row_weights.shape != (vocab_size,):
                raise ValueError(f"counter needs row_weights of shape ({vocab_size},)")
            embed.copy_(fixed_norm_rows(embed, row_weights, speech_values, counter))
        for i in range(p.num_hidden_layers):
            state[f"model.layers.{i}.self_attn.o_proj.weight"][SPEECH_CHANNEL] = 0
            state[f"model.layers.{i}.mlp.down_proj.weight"][SPEECH_CHANNEL] = 0
        state["model.norm.weight"][SPEECH_CHANNEL] = SPEECH_CHANNEL_GAIN
        if counter is not None:
            install_counter(state, p.num_attention_heads, p.num_key_value_heads, p.num_hidden_layers, counter)
            if counter.end_row is not None:
                extra, length = end_row_channels(SPEECH_CHANNEL_INPUT, SPEECH_CHANNEL_GAIN)
                embed[counter.end_row, SPEECH_CHANNEL] = SPEECH_CHANNEL_INPUT + extra
                embed[counter.end_row, LENGTH_CHANNEL] = length
    return state


def parse_size(size: int | str) -> int:
    """Bytes from an int or a string such as "10MB", "2GB", "500KB" (powers of 1000, as transformers does)."""
    if isinstance(size, int):
        return size
    units = {"GB": 10**9, "MB": 10**6, "KB": 10**3, "B": 1}
    text = size.strip().upper()
    for unit, factor in units.items():
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * factor)
    return int(text)


def _split_shards(state: dict[str, torch.Tensor], max_bytes: int) -> list[dict[str, torch.Tensor]]:
    shards: list[dict[str, torch.Tensor]] = [{}]
    used = 0
    for name, tensor in state.items():
        size = tensor.numel() * tensor.element_size()
        if shards[-1] and used + size > max_bytes:
            shards.append({})
            used = 0
        shards[-1][name] = tensor
        used += size
    return shards


def write_weights(
    state: dict[str, torch.Tensor], out_dir: Path, max_shard_size: int | str | None
) -> list[Path]:
    """model.safetensors, or model-0000i-of-0000n.safetensors + model.safetensors.index.json when sharded."""
    shards = [state] if max_shard_size is None else _split_shards(state, parse_size(max_shard_size))
    if len(shards) == 1:
        write_safetensors(state, out_dir / "model.safetensors")
        return [out_dir / "model.safetensors"]
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    weight_map = {}
    for name, shard in zip(names, shards, strict=True):
        write_safetensors(shard, out_dir / name)
        weight_map.update({key: name for key in shard})
    total = sum(t.numel() * t.element_size() for t in state.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return [out_dir / n for n in names] + [out_dir / "model.safetensors.index.json"]


def write_qwen2(
    out_dir: str | Path,
    preset: str = "tiny",
    seed: int = 0,
    vocab_size: int = layout.VOCAB_SIZE,
    max_shard_size: int | str | None = None,
    dtype: torch.dtype | None = None,
    speech_tokens: tuple[int, int] | None = None,
    counter: LengthCounter | None = None,
    row_weights: torch.Tensor | None = None,
) -> list[Path]:
    """Write config.json, generation_config.json and the weights into `out_dir`; return the paths written.

    `dtype` overrides the preset's (fp32: the shipped LLM/model.safetensors is ~2 GB, i.e. float32); config.json's torch_dtype follows it.
    """
    _preset(preset, dtype)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config_path = out_dir / "config.json"
    config_path.write_text(json.dumps(qwen2_config(preset, vocab_size, dtype), indent=2) + "\n")
    generation_path = out_dir / "generation_config.json"
    generation_path.write_text(json.dumps(generation_config(), indent=2) + "\n")
    state = qwen2_state_dict(preset, seed, vocab_size, dtype, speech_tokens, counter, row_weights)
    weights = write_weights(state, out_dir, max_shard_size)
    return [config_path, generation_path, *weights]
