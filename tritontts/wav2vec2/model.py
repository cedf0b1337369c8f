"""wav2vec2 (stable-layer-norm, XLSR-53 layout) inference path, with transformers' `Wav2Vec2Model` key names."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from tritontts.checkpoint import find_weights, load_strict, read_state_dict
from tritontts.wav2vec2.config import Wav2Vec2Config
from tritontts.wav2vec2.features import normalize_and_pad

SPARK_LAYERS = (11, 14, 16)
CONV_LAYER_NORM_EPS = 1e-5  # nn.LayerNorm default, used by the conv feature encoder
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
CHECKPOINT_PREFIX = "wav2vec2."
PRETRAINING_HEADS = ("quantizer.", "project_q.", "project_hid.")
NEW_STYLE_WEIGHT_NORM = {
    "parametrizations.weight.original0": "weight_g",
    "parametrizations.weight.original1": "weight_v",
}

ACTIVATIONS = {"gelu": F.gelu, "relu": F.relu}


class ConvLayer(nn.Module):
    def __init__(self, config: Wav2Vec2Config, index: int):
        super().__init__()
        in_dim = config.conv_dim[index - 1] if index > 0 else 1
        out_dim = config.conv_dim[index]
        self.conv = nn.Conv1d(
            in_dim,
            out_dim,
            config.conv_kernel[index],
            stride=config.conv_stride[index],
            bias=config.conv_bias,
        )
        self.norm_kind = (
            config.feat_extract_norm if config.feat_extract_norm == "layer" or index == 0 else None
        )
        if self.norm_kind == "layer":
            self.layer_norm = nn.LayerNorm(out_dim, eps=CONV_LAYER_NORM_EPS)
        elif self.norm_kind == "group":
            self.layer_norm = nn.GroupNorm(out_dim, out_dim, affine=True)
        self.activation = ACTIVATIONS[config.feat_extract_activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        if self.norm_kind == "layer":
            x = self.layer_norm(x.transpose(1, 2)).transpose(1, 2)
        elif self.norm_kind == "group":
            x = self.layer_norm(x)
        return self.activation(x)


class FeatureEncoder(nn.Module):
    def __init__(self, config: Wav2Vec2Config):
        super().__init__()
        self.conv_layers = nn.ModuleList(ConvLayer(config, i) for i in range(len(config.conv_dim)))

    def forward(self, samples: torch.Tensor) -> torch.Tensor:
        x = samples[:, None]
        for layer in self.conv_layers:
            x = layer(x)
        return x.transpose(1, 2)


class FeatureProjection(nn.Module):
    def __init__(self, config: Wav2Vec2Config):
        super().__init__()
        self.layer_norm = nn.LayerNorm(config.conv_dim[-1], eps=config.layer_norm_eps)
        self.projection = nn.Linear(config.conv_dim[-1], config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.projection(self.layer_norm(x))


class WeightNormConv1d(nn.Module):
    """Grouped 'same' conv whose weight is `weight_g * weight_v / |weight_v|`, the norm taken per tap (dim 2)."""

    def __init__(self, channels: int, kernel_size: int, groups: int):
        super().__init__()
        self.groups = groups
        self.padding = kernel_size // 2
        self.weight_g = nn.Parameter(torch.ones(1, 1, kernel_size))
        self.weight_v = nn.Parameter(torch.empty(channels, channels // groups, kernel_size))
        self.bias = nn.Parameter(torch.zeros(channels))
        nn.init.normal_(self.weight_v, std=0.02)

    def weight(self) -> torch.Tensor:
        norm = self.weight_v.pow(2).sum(dim=(0, 1), keepdim=True).sqrt()
        return self.weight_v * (self.weight_g / norm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv1d(x, self.weight(), self.bias, padding=self.padding, groups=self.groups)


class PositionalConvEmbedding(nn.Module):
    def __init__(self, config: Wav2Vec2Config):
        super().__init__()
        taps = config.num_conv_pos_embeddings
        self.conv = WeightNormConv1d(config.hidden_size, taps, config.num_conv_pos_embedding_groups)
        self.trim = 1 if taps % 2 == 0 else 0  # an even kernel with padding k//2 yields one frame too many
        self.activation = ACTIVATIONS[config.feat_extract_activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x.transpose(1, 2))
        if self.trim:
            y = y[:, :, : -self.trim]
        return self.activation(y).transpose(1, 2)


class SelfAttention(nn.Module):
    def __init__(self, config: Wav2Vec2Config):
        super().__init__()
        dim = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)
        self.q_proj = nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
        batch, frames, dim = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(batch, frames, self.num_heads, -1).transpose(1, 2)

        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        mask = None if key_mask is None else key_mask[:, None, None, :]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out_proj(out.transpose(1, 2).reshape(batch, frames, dim))


class FeedForward(nn.Module):
    def __init__(self, config: Wav2Vec2Config):
        super().__init__()
        self.intermediate_dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.output_dense = nn.Linear(config.intermediate_size, config.hidden_size)
        self.activation = ACTIVATIONS[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output_dense(self.activation(self.intermediate_dense(x)))


class PreNormLayer(nn.Module):
    def __init__(self, config: Wav2Vec2Config):
        super().__init__()
        self.attention = SelfAttention(config)
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.feed_forward = FeedForward(config)
        self.final_layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
        x = x + self.attention(self.layer_norm(x), key_mask)
        return x + self.feed_forward(self.final_layer_norm(x))


class TransformerStack(nn.Module):
    def __init__(self, config: Wav2Vec2Config):
        super().__init__()
        self.pos_conv_embed = PositionalConvEmbedding(config)
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.layers = nn.ModuleList(PreNormLayer(config) for _ in range(config.num_hidden_layers))


class Wav2Vec2Encoder(nn.Module):
    """`Wav2Vec2Model` for inference; `state_dict()` keys are the checkpoint's, less the `wav2vec2.` prefix."""

    def __init__(self, config: Wav2Vec2Config):
        super().__init__()
        self.config = config
        self.normalize_inputs = True
        if config.has_masked_spec_embed:
            self.masked_spec_embed = nn.Parameter(torch.zeros(config.hidden_size))
        self.feature_extractor = FeatureEncoder(config)
        self.feature_projection = FeatureProjection(config)
        self.encoder = TransformerStack(config)

    @property
    def device(self) -> torch.device:
        return self.feature_projection.projection.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.feature_projection.projection.weight.dtype

    def frame_lengths(self, lengths: torch.Tensor) -> torch.Tensor:
        """Frames the conv feature encoder makes from `lengths` samples (0 when too short for one frame)."""
        frames = torch.as_tensor(lengths, dtype=torch.long)
        for kernel, stride in zip(self.config.conv_kernel, self.config.conv_stride):
            frames = torch.div(frames - kernel, stride, rounding_mode="floor") + 1
        return frames.clamp(min=0)

    def hidden_states(
        self,
        input_values: torch.Tensor,
        lengths: torch.Tensor | None = None,
        num_layers: int | None = None,
    ) -> list[torch.Tensor]:
        """h[0] (embeddings) .. h[num_layers] (layer outputs), each [B, T, H].

        As transformers' stable-layer-norm encoder, the final layer norm is applied only to the output of the
        last layer of the model, so it appears only when all layers run. `lengths` (samples per row) mark
        right padding; frames past a row's length hold unspecified values.
        """
        total = self.config.num_hidden_layers
        num_layers = total if num_layers is None else num_layers
        if not 0 <= num_layers <= total:
            raise ValueError(f"num_layers must be in [0, {total}], got {num_layers}")
        x = self.feature_projection(self.feature_extractor(input_values.to(self.device, self.dtype)))
        key_mask = None
        if lengths is not None:
            frames = self.frame_lengths(lengths.to(x.device))
            if int(frames.min()) < 1:
                raise ValueError("every utterance must be long enough for at least one wav2vec2 frame")
            key_mask = torch.arange(x.shape[1], device=x.device)[None, :] < frames[:, None]
            x = x.masked_fill(~key_mask[..., None], 0.0)
        x = x + self.encoder.pos_conv_embed(x)
        states = [x]
        for layer in self.encoder.layers[:num_layers]:
            x = layer(x, key_mask)
            states.append(x)
        if num_layers == total:
            states[-1] = self.encoder.layer_norm(x)
        return states

    @torch.no_grad()
    def spark_features(
        self,
        wavs: Sequence[np.ndarray | torch.Tensor] | torch.Tensor | np.ndarray,
        layers: Sequence[int] = SPARK_LAYERS,
        lengths: Sequence[int] | torch.Tensor | None = None,
        pad_multiple: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean of h[i] for i in `layers` ([B, T, H]; frames past a row's length are zero) and frames per row.

        Each utterance is normalised over its own samples and right-padded, as Spark-TTS's feature extractor
        does, so a batch gives each row what that row alone would give. `lengths` cuts each row of an
        already padded batch to its samples. `pad_multiple` pads the batch further, to a multiple of that many
        samples, so that few shapes come (on CUDA each new one costs convolution plans); with the per-frame
        layer norm of XLSR-style checkpoints only, since a group norm over time would see the padding.
        """
        if not layers or min(layers) < 0:
            raise ValueError(f"layers must be non-empty hidden-state indices, got {tuple(layers)}")
        if pad_multiple and self.config.feat_extract_norm != "layer":
            raise ValueError("pad_multiple needs feat_extract_norm 'layer' (a group norm sees the padding)")
        if lengths is not None:
            wavs = [wav[: int(n)] for wav, n in zip(wavs, lengths, strict=True)]
        input_values, lengths = normalize_and_pad(wavs, device=self.device, normalize=self.normalize_inputs)
        if pad_multiple:
            input_values = F.pad(input_values, (0, -input_values.shape[1] % pad_multiple))
        states = self.hidden_states(input_values, lengths, num_layers=max(layers))
        mixed = sum(states[i] for i in layers) / len(layers)
        frames = self.frame_lengths(lengths)
        valid = torch.arange(mixed.shape[1], device=mixed.device)[None, :] < frames[:, None]
        return mixed.masked_fill(~valid[..., None], 0.0), frames


def checkpoint_to_encoder_keys(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Strip the `wav2vec2.` prefix and rename new-style weight-norm parameters to `weight_g`/`weight_v`."""
    renamed = {}
    for key, value in state.items():
        key = key.removeprefix(CHECKPOINT_PREFIX)
        for new_style, old_style in NEW_STYLE_WEIGHT_NORM.items():
            if key.endswith(new_style):
                key = key[: -len(new_style)] + old_style
        renamed[key] = value
    return renamed


def load_wav2vec2(
    model_dir: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
) -> Wav2Vec2Encoder:
    """The encoder of a hub-layout folder (`config.json` and `model.safetensors` or `pytorch_model.bin`)."""
    model_dir = Path(model_dir)
    config = Wav2Vec2Config.from_json(model_dir / "config.json")
    weights = find_weights(model_dir, WEIGHT_FILES)
    with torch.device("meta"):
        model = Wav2Vec2Encoder(config)
    model = model.to_empty(device="cpu")
    state = checkpoint_to_encoder_keys(read_state_dict(weights))
    load_strict(model, state, source=str(weights), ignore_prefixes=PRETRAINING_HEADS)
    preprocessor = model_dir / "preprocessor_config.json"
    if preprocessor.exists():
        model.normalize_inputs = bool(json.loads(preprocessor.read_text()).get("do_normalize", True))
    return model.to(device=device, dtype=dtype).eval()
