"""UpsampleConformerEncoderV2: CosyVoice2's upsampling conformer encoder, run whole or chunk by chunk.

The whole-utterance forward and the parameters are those of `tritontts.cosyvoice2.flow.encoder` (full
attention, the pre-lookahead convolution reading zeros past the end). The chunk forward carries four
caches: the last 2 outputs of the lookahead convolution's first layer (the second layer's causal context),
the last 2 * stride upsampled frames (the upsampling convolution's context), and the keys and values of
every conformer layer so far, which each new chunk attends to in full (no chunk mask), with relative
positions counted over cache + chunk.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tritontts.cosyvoice2.flow.attention import (
    RelPositionAttention,
    _relative_shift,
    relative_position_encoding,
)
from tritontts.cosyvoice2.flow.encoder import ConformerLayer, UpsampleConformerEncoder

LOOKAHEAD_CONTEXT = 2  # the kernel size 3 of the lookahead layer's second convolution, less one


@dataclass(frozen=True)
class EncoderCache:
    lookahead: Tensor
    """[B, D, 2] the lookahead layer's first-convolution outputs before the chunk"""
    upsample: Tensor
    """[B, D, 2 * stride] the upsampled frames before the chunk"""
    attention: Tensor
    """[num_blocks, B, heads, T, 2 * head_dim] keys ‖ values of the token-rate layers"""
    up_attention: Tensor
    """[num_up_blocks, B, heads, stride * T, 2 * head_dim] keys ‖ values of the mel-rate layers"""

    @property
    def tokens(self) -> int:
        return self.attention.shape[3]


def attend_with_cache(
    attn: RelPositionAttention, x: Tensor, pos_emb: Tensor, cache: Tensor | None
) -> tuple[Tensor, Tensor]:
    """x [B, T, D] new frames after the cached ones; pos_emb [1, 2(C+T)-1, D]; cache [B, H, C, 2 dk] or None
    → (out [B, T, D], keys ‖ values of all C + T frames)."""
    batch, time, _ = x.shape

    def split_heads(y: Tensor) -> Tensor:
        return y.view(y.size(0), -1, attn.heads, attn.head_dim)

    q = split_heads(attn.linear_q(x))
    k = split_heads(attn.linear_k(x)).transpose(1, 2)
    v = split_heads(attn.linear_v(x)).transpose(1, 2)
    if cache is not None and cache.size(2) > 0:
        k_cache, v_cache = cache.split(attn.head_dim, dim=-1)
        k, v = torch.cat([k_cache, k], dim=2), torch.cat([v_cache, v], dim=2)
    p = split_heads(attn.linear_pos(pos_emb)).transpose(1, 2)
    q_content = (q + attn.pos_bias_u).transpose(1, 2)
    q_position = (q + attn.pos_bias_v).transpose(1, 2)
    position_scores = _relative_shift(torch.matmul(q_position, p.transpose(-2, -1)))
    out = F.scaled_dot_product_attention(q_content, k, v, attn_mask=position_scores / attn.head_dim**0.5)
    return attn.linear_out(out.transpose(1, 2).reshape(batch, time, -1)), torch.cat([k, v], dim=-1)


def conformer_layer_with_cache(
    layer: ConformerLayer, x: Tensor, pos_emb: Tensor, cache: Tensor | None
) -> tuple[Tensor, Tensor]:
    attended, new_cache = attend_with_cache(layer.self_attn, layer.norm_mha(x), pos_emb, cache)
    x = x + attended
    return x + layer.feed_forward(layer.norm_ff(x)), new_cache


class UpsampleConformerEncoderV2(UpsampleConformerEncoder):
    """`forward(xs, xs_lens)` over a whole utterance (inherited); `forward_chunk` with caches."""

    def _layers_with_cache(
        self, layers: nn.ModuleList, x: Tensor, cache: Tensor | None, cached_frames: int
    ) -> tuple[Tensor, Tensor]:
        pos_emb = relative_position_encoding(cached_frames + x.size(1), x.size(2), x.device, x.dtype)
        new_caches = []
        for index, layer in enumerate(layers):
            x, new_cache = conformer_layer_with_cache(
                layer, x, pos_emb, None if cache is None else cache[index]
            )
            new_caches.append(new_cache)
        return x, torch.stack(new_caches)

    def forward_chunk(
        self, xs: Tensor, last_chunk: bool, cache: EncoderCache | None = None
    ) -> tuple[Tensor, EncoderCache]:
        """xs [B, T, input_size] token embeddings whose last `pre_lookahead_len` are look-ahead only, or,
        with `last_chunk`, all of them real (zeros are read past the end) → (hidden [B, stride * T', D],
        the caches after the chunk), T' = T - pre_lookahead_len, or T with `last_chunk`."""
        lookahead = self.pre_lookahead_layer
        width = lookahead.pre_lookahead_len
        stride = self.up_layer.stride
        x = self.embed(xs)
        if last_chunk:
            x = F.pad(x, (0, 0, 0, width))
        if x.size(1) <= width:
            raise ValueError(f"a chunk needs more than {width} tokens of input, got {xs.size(1)}")

        y = F.leaky_relu(lookahead.conv1(x.transpose(1, 2)))
        previous = (
            cache.lookahead if cache is not None else y.new_zeros(y.size(0), y.size(1), LOOKAHEAD_CONTEXT)
        )
        y = torch.cat([previous, y], dim=2)
        new_lookahead = y[..., -LOOKAHEAD_CONTEXT:]
        x = lookahead.conv2(y).transpose(1, 2) + x[:, :-width]

        cached_tokens = cache.tokens if cache is not None else 0
        x, attention = self._layers_with_cache(
            self.encoders, x, None if cache is None else cache.attention, cached_tokens
        )

        y = F.interpolate(x.transpose(1, 2), scale_factor=float(stride), mode="nearest")
        previous = cache.upsample if cache is not None else y.new_zeros(y.size(0), y.size(1), 2 * stride)
        y = torch.cat([previous, y], dim=2)
        new_upsample = y[..., -2 * stride :]
        x = self.up_embed(self.up_layer.conv(y).transpose(1, 2))

        cached_frames = cache.up_attention.shape[3] if cache is not None else 0
        x, up_attention = self._layers_with_cache(
            self.up_encoders, x, None if cache is None else cache.up_attention, cached_frames
        )
        return self.after_norm(x), EncoderCache(new_lookahead, new_upsample, attention, up_attention)
