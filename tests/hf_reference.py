"""A tiny random transformers Qwen2, the reference that our engine and the TensorRT-LLM conversion must match."""

from __future__ import annotations

import torch
import transformers


def tiny_hf_qwen2(vocab_size: int, tied: bool, seed: int = 0) -> transformers.Qwen2ForCausalLM:
    """2 layers, hidden 64, 4 heads, 2 KV heads, with biases and norms off their defaults so mix-ups show."""
    config = transformers.Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        tie_word_embeddings=tied,
        attn_implementation="eager",
    )
    torch.manual_seed(seed)
    model = transformers.Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(1.0 + 0.1 * torch.randn_like(param))
            else:
                param.normal_(0.0, 0.15 if "bias" not in name else 0.1)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model
