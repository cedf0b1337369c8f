"""UpsampleConformerEncoder: token embeddings → hidden states at the mel frame rate.

Linear embedding, a causal pre-lookahead convolution (which may read the next `pre_lookahead_len`
tokens given as context), conformer blocks at the token rate, a 2x nearest upsample with a causal
convolution, another linear embedding and conformer blocks at the mel rate, a final LayerNorm.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tritontts.cosyvoice2.config import EncoderConfig
from tritontts.cosyvoice2.flow.attention import RelPositionAttention, relative_position_encoding
from tritontts.cosyvoice2.flow.masks import attention_mask, valid_mask


class LinearEmbedding(nn.Module):
    """Linear + LayerNorm, scaled by sqrt(dim) as the ESPnet relative positional encoder does."""

    def __init__(self, in_dim: int, dim: int):
        super().__init__()
        self.out = nn.Sequential(nn.Linear(in_dim, dim), nn.LayerNorm(dim, eps=1e-5))
        self.scale = math.sqrt(dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.out(x) * self.scale


class PreLookaheadLayer(nn.Module):
    def __init__(self, channels: int, pre_lookahead_len: int, hidden_channels: int | None = None):
        """`hidden_channels` between the two convolutions (CosyVoice3: 80 → 1024 → 80); default `channels`."""
        super().__init__()
        hidden = channels if hidden_channels is None else hidden_channels
        self.pre_lookahead_len = pre_lookahead_len
        self.conv1 = nn.Conv1d(channels, hidden, kernel_size=pre_lookahead_len + 1)
        self.conv2 = nn.Conv1d(hidden, channels, kernel_size=3)

    def forward(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        """x [B, T, C]; context [B, pre_lookahead_len, C] (the tokens after x) or None (zeros)."""
        y = x.transpose(1, 2)
        if context is not None and context.size(1) > 0:
            y = torch.cat([y, context.transpose(1, 2)], dim=2)
            y = F.pad(y, (0, self.pre_lookahead_len - context.size(1)))
        else:
            y = F.pad(y, (0, self.pre_lookahead_len))
        y = F.leaky_relu(self.conv1(y))
        y = self.conv2(F.pad(y, (self.conv2.kernel_size[0] - 1, 0)))
        return y.transpose(1, 2) + x


class CausalUpsample(nn.Module):
    """Nearest-neighbour upsampling by `stride`, then a causal convolution."""

    def __init__(self, channels: int, stride: int):
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv1d(channels, channels, 2 * stride + 1)

    def forward(self, x: Tensor) -> Tensor:
        """x [B, C, T] → [B, C, stride*T]."""
        y = F.interpolate(x, scale_factor=float(self.stride), mode="nearest")
        return self.conv(F.pad(y, (2 * self.stride, 0)))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w_1 = nn.Linear(dim, hidden)
        self.w_2 = nn.Linear(hidden, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.w_2(F.silu(self.w_1(x)))


class ConformerLayer(nn.Module):
    """Pre-norm self-attention and feed-forward (no macaron, no convolution module)."""

    def __init__(self, dim: int, heads: int, hidden: int):
        super().__init__()
        self.self_attn = RelPositionAttention(heads, dim)
        self.feed_forward = FeedForward(dim, hidden)
        self.norm_ff = nn.LayerNorm(dim, eps=1e-12)
        self.norm_mha = nn.LayerNorm(dim, eps=1e-12)

    def forward(self, x: Tensor, mask: Tensor, pos_emb: Tensor) -> Tensor:
        x = x + self.self_attn(self.norm_mha(x), mask, pos_emb)
        return x + self.feed_forward(self.norm_ff(x))


class UpsampleConformerEncoder(nn.Module):
    def __init__(self, config: EncoderConfig, pre_lookahead_len: int):
        super().__init__()
        dim = config.output_size
        self.config = config
        self.embed = LinearEmbedding(config.input_size, dim)
        self.after_norm = nn.LayerNorm(dim, eps=1e-5)
        self.pre_lookahead_layer = PreLookaheadLayer(dim, pre_lookahead_len)
        self.encoders = nn.ModuleList(
            ConformerLayer(dim, config.attention_heads, config.linear_units) for _ in range(config.num_blocks)
        )
        self.up_layer = CausalUpsample(dim, config.upsample_stride)
        self.up_embed = LinearEmbedding(dim, dim)
        self.up_encoders = nn.ModuleList(
            ConformerLayer(dim, config.attention_heads, config.linear_units)
            for _ in range(config.num_up_blocks)
        )

    def _run_layers(self, layers: nn.ModuleList, x: Tensor, valid: Tensor, chunk_size: int) -> Tensor:
        mask = attention_mask(valid, chunk_size)
        pos_emb = relative_position_encoding(x.size(1), x.size(2), x.device, x.dtype)
        for layer in layers:
            x = layer(x, mask, pos_emb)
        return x

    def forward(
        self, xs: Tensor, xs_lens: Tensor, context: Tensor | None = None, streaming: bool = False
    ) -> tuple[Tensor, Tensor]:
        """xs [B, T, input_size] token embeddings, xs_lens [B]; context [B, L, input_size] lookahead
        tokens after xs or None → (hidden [B, stride*T, output_size], valid mask [B, 1, stride*T])."""
        chunk = self.config.static_chunk_size if streaming else 0
        valid = valid_mask(xs_lens, xs.size(1))
        x = self.embed(xs)
        x = self.pre_lookahead_layer(x, None if context is None else self.embed(context))
        x = self._run_layers(self.encoders, x, valid, chunk)

        x = self.up_layer(x.transpose(1, 2)).transpose(1, 2)
        up_lens = xs_lens * self.up_layer.stride
        valid = valid_mask(up_lens, x.size(1))
        x = self.up_embed(x)
        x = self._run_layers(self.up_encoders, x, valid, chunk * self.up_layer.stride)
        return self.after_norm(x), valid

    def forward_padded(self, xs: Tensor, rows: Tensor, out_lens: Tensor, streaming: bool = False) -> Tensor:
        """`forward` of a batch-1 call padded with rows it never reads: xs [1, L, input_size] holds the tokens
        and their look-ahead in its first `rows` [1] rows; the first `out_lens` [1] are encoded → [1, stride*L,
        output_size], equal to `forward`'s output on its first stride*out_lens frames."""
        chunk = self.config.static_chunk_size if streaming else 0
        x = self.embed(xs) * valid_mask(rows, xs.size(1)).transpose(1, 2).to(xs.dtype)
        x = self.pre_lookahead_layer(x)
        x = self._run_layers(self.encoders, x, valid_mask(out_lens, x.size(1)), chunk)
        x = self.up_layer(x.transpose(1, 2)).transpose(1, 2)
        valid = valid_mask(out_lens * self.up_layer.stride, x.size(1))
        x = self.up_embed(x)
        x = self._run_layers(self.up_encoders, x, valid, chunk * self.up_layer.stride)
        return self.after_norm(x)
