"""A random-weight wav2vec2-large-xlsr-53 folder in the layout the hub ships (`Wav2Vec2ForPreTraining`)."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Any

import torch

from tritontts.checkpoint import write_safetensors

XLSR53_CONFIG: dict[str, Any] = {
    "activation_dropout": 0.0,
    "apply_spec_augment": True,
    "architectures": ["Wav2Vec2ForPreTraining"],
    "attention_dropout": 0.1,
    "bos_token_id": 1,
    "codevector_dim": 768,
    "contrastive_logits_temperature": 0.1,
    "conv_bias": True,
    "conv_dim": [512] * 7,
    "conv_kernel": [10, 3, 3, 3, 3, 2, 2],
    "conv_stride": [5, 2, 2, 2, 2, 2, 2],
    "ctc_loss_reduction": "sum",
    "ctc_zero_infinity": False,
    "diversity_loss_weight": 0.1,
    "do_stable_layer_norm": True,
    "eos_token_id": 2,
    "feat_extract_activation": "gelu",
    "feat_extract_dropout": 0.0,
    "feat_extract_norm": "layer",
    "feat_proj_dropout": 0.1,
    "feat_quantizer_dropout": 0.0,
    "final_dropout": 0.0,
    "gradient_checkpointing": False,
    "hidden_act": "gelu",
    "hidden_dropout": 0.1,
    "hidden_size": 1024,
    "initializer_range": 0.02,
    "intermediate_size": 4096,
    "layer_norm_eps": 1e-05,
    "layerdrop": 0.1,
    "mask_channel_length": 10,
    "mask_channel_min_space": 1,
    "mask_channel_other": 0.0,
    "mask_channel_prob": 0.0,
    "mask_channel_selection": "static",
    "mask_feature_length": 10,
    "mask_feature_prob": 0.0,
    "mask_time_length": 10,
    "mask_time_min_space": 1,
    "mask_time_other": 0.0,
    "mask_time_prob": 0.075,
    "mask_time_selection": "static",
    "model_type": "wav2vec2",
    "num_attention_heads": 16,
    "num_codevector_groups": 2,
    "num_codevectors_per_group": 320,
    "num_conv_pos_embedding_groups": 16,
    "num_conv_pos_embeddings": 128,
    "num_feat_extract_layers": 7,
    "num_hidden_layers": 24,
    "num_negatives": 100,
    "pad_token_id": 0,
    "proj_codevector_dim": 768,
    "transformers_version": "4.7.0.dev0",
    "vocab_size": 32,
}

TINY_OVERRIDES: dict[str, Any] = {
    "hidden_size": 32,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "conv_dim": [32] * 7,
    "num_conv_pos_embeddings": 16,
    "num_conv_pos_embedding_groups": 2,
    "num_codevectors_per_group": 8,
    "codevector_dim": 16,
    "proj_codevector_dim": 16,
}

PRESETS = {"full": XLSR53_CONFIG, "tiny": {**XLSR53_CONFIG, **TINY_OVERRIDES}}

PREPROCESSOR_CONFIG: dict[str, Any] = {
    "do_normalize": True,
    "feature_extractor_type": "Wav2Vec2FeatureExtractor",
    "feature_size": 1,
    "padding_side": "right",
    "padding_value": 0.0,
    "return_attention_mask": True,
    "sampling_rate": 16000,
}


def preset_config(preset: str) -> dict[str, Any]:
    if preset not in PRESETS:
        raise ValueError(f"unknown wav2vec2 preset {preset!r}; choose from {sorted(PRESETS)}")
    return json.loads(json.dumps(PRESETS[preset]))


def checkpoint_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Key -> shape of `Wav2Vec2ForPreTraining`'s `pytorch_model.bin`, weight norm named `weight_g`/`weight_v`."""
    hidden, inner = config["hidden_size"], config["intermediate_size"]
    conv_dim, kernels = config["conv_dim"], config["conv_kernel"]
    taps, groups = config["num_conv_pos_embeddings"], config["num_conv_pos_embedding_groups"]
    shapes: dict[str, tuple[int, ...]] = {}
    if config["mask_time_prob"] > 0 or config.get("mask_feature_prob", 0.0) > 0:
        shapes["wav2vec2.masked_spec_embed"] = (hidden,)
    for i, (out_dim, kernel) in enumerate(zip(conv_dim, kernels)):
        prefix = f"wav2vec2.feature_extractor.conv_layers.{i}"
        shapes[f"{prefix}.conv.weight"] = (out_dim, conv_dim[i - 1] if i else 1, kernel)
        if config["conv_bias"]:
            shapes[f"{prefix}.conv.bias"] = (out_dim,)
        if config["feat_extract_norm"] == "layer" or i == 0:
            shapes[f"{prefix}.layer_norm.weight"] = (out_dim,)
            shapes[f"{prefix}.layer_norm.bias"] = (out_dim,)
    shapes["wav2vec2.feature_projection.layer_norm.weight"] = (conv_dim[-1],)
    shapes["wav2vec2.feature_projection.layer_norm.bias"] = (conv_dim[-1],)
    shapes["wav2vec2.feature_projection.projection.weight"] = (hidden, conv_dim[-1])
    shapes["wav2vec2.feature_projection.projection.bias"] = (hidden,)
    shapes["wav2vec2.encoder.pos_conv_embed.conv.bias"] = (hidden,)
    shapes["wav2vec2.encoder.pos_conv_embed.conv.weight_g"] = (1, 1, taps)
    shapes["wav2vec2.encoder.pos_conv_embed.conv.weight_v"] = (hidden, hidden // groups, taps)
    shapes["wav2vec2.encoder.layer_norm.weight"] = (hidden,)
    shapes["wav2vec2.encoder.layer_norm.bias"] = (hidden,)
    for i in range(config["num_hidden_layers"]):
        prefix = f"wav2vec2.encoder.layers.{i}"
        for proj in ("k_proj", "v_proj", "q_proj", "out_proj"):
            shapes[f"{prefix}.attention.{proj}.weight"] = (hidden, hidden)
            shapes[f"{prefix}.attention.{proj}.bias"] = (hidden,)
        shapes[f"{prefix}.layer_norm.weight"] = (hidden,)
        shapes[f"{prefix}.layer_norm.bias"] = (hidden,)
        shapes[f"{prefix}.feed_forward.intermediate_dense.weight"] = (inner, hidden)
        shapes[f"{prefix}.feed_forward.intermediate_dense.bias"] = (inner,)
        shapes[f"{prefix}.feed_forward.output_dense.weight"] = (hidden, inner)
        shapes[f"{prefix}.feed_forward.output_dense.bias"] = (hidden,)
        shapes[f"{prefix}.final_layer_norm.weight"] = (hidden,)
        shapes[f"{prefix}.final_layer_norm.bias"] = (hidden,)
    code_groups, code_vars = config["num_codevector_groups"], config["num_codevectors_per_group"]
    code_dim, proj_dim = config["codevector_dim"], config["proj_codevector_dim"]
    shapes["quantizer.codevectors"] = (1, code_groups * code_vars, code_dim // code_groups)
    shapes["quantizer.weight_proj.weight"] = (code_groups * code_vars, conv_dim[-1])
    shapes["quantizer.weight_proj.bias"] = (code_groups * code_vars,)
    shapes["project_hid.weight"] = (proj_dim, hidden)
    shapes["project_hid.bias"] = (proj_dim,)
    shapes["project_q.weight"] = (proj_dim, code_dim)
    shapes["project_q.bias"] = (proj_dim,)
    return shapes


def random_tensor(key: str, shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """Weights at scales that keep activations finite and of order one; norms near identity."""
    name = key.rsplit(".", 1)[-1]
    if key.endswith("masked_spec_embed") or key.endswith("codevectors"):
        return torch.rand(shape, generator=generator)
    if "norm" in key and name == "weight":
        return 1.0 + 0.1 * torch.randn(shape, generator=generator)
    if name == "bias":
        return 0.02 * torch.randn(shape, generator=generator)
    if name == "weight_g":
        return torch.empty(shape)  # filled from weight_v by `pos_conv_gain`
    fan_in = math.prod(shape[1:])
    return torch.randn(shape, generator=generator) / math.sqrt(fan_in)


def pos_conv_gain(weight_v: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """weight_g near |weight_v| per tap, so the effective kernel keeps weight_v's scale."""
    norm = weight_v.pow(2).sum(dim=(0, 1), keepdim=True).sqrt()
    return norm * (1.0 + 0.1 * torch.randn(norm.shape, generator=generator))


def synthetic_state(config: dict[str, Any], seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    state = {key: random_tensor(key, shape, generator) for key, shape in checkpoint_shapes(config).items()}
    conv = "wav2vec2.encoder.pos_conv_embed.conv"
    state[f"{conv}.weight_g"] = pos_conv_gain(state[f"{conv}.weight_v"], generator)
    return state


def torch_save_bytes(state: dict[str, torch.Tensor]) -> bytes:
    """`torch.save` into memory: the archive name is then fixed, so equal states give equal bytes."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def write_wav2vec2(
    out_dir: str | Path, preset: str = "tiny", seed: int = 0, weights_format: str = "bin"
) -> Path:
    """Write config.json, preprocessor_config.json and pytorch_model.bin (or model.safetensors); return out_dir."""
    if weights_format not in ("bin", "safetensors"):
        raise ValueError(f"weights_format must be 'bin' or 'safetensors', got {weights_format!r}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = preset_config(preset)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (out_dir / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR_CONFIG, indent=2) + "\n")
    state = synthetic_state(config, seed)
    if weights_format == "bin":
        (out_dir / "pytorch_model.bin").write_bytes(torch_save_bytes(state))
    else:
        write_safetensors(state, out_dir / "model.safetensors")
    return out_dir
