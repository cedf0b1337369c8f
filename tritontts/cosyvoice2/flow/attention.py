"""Relative-position self-attention of the flow encoder (Transformer-XL style, ESPnet positions)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def relative_position_encoding(size: int, dim: int, device: torch.device, dtype: torch.dtype) -> Tensor:
    """[1, 2*size-1, dim] sinusoids of the relative positions size-1, ..., 0, ..., -(size-1)."""
    positions = torch.arange(size - 1, -size, -1, device=device, dtype=torch.float32).unsqueeze(1)
    inv_freq = torch.exp(
        torch.arange(0, dim, 2, device=device, dtype=torch.float32) * -(math.log(10000.0) / dim)
    )
    angles = positions * inv_freq
    encoding = torch.stack([torch.sin(angles), torch.cos(angles)], dim=-1).flatten(1)
    return encoding.unsqueeze(0).to(dtype)


def _relative_shift(scores: Tensor) -> Tensor:
    """[B, H, T, 2T-1] scores per relative position → [B, H, T, T] scores per key (key j of query i
    reads relative position i - j)."""
    batch, heads, time, width = scores.shape
    padded = F.pad(scores, (1, 0)).view(batch, heads, width + 1, time)
    return padded[:, :, 1:].reshape(batch, heads, time, width)[..., : width // 2 + 1]


class RelPositionAttention(nn.Module):
    def __init__(self, heads: int, dim: int):
        super().__init__()
        self.heads = heads
        self.head_dim = dim // heads
        self.linear_q = nn.Linear(dim, dim)
        self.linear_k = nn.Linear(dim, dim)
        self.linear_v = nn.Linear(dim, dim)
        self.linear_out = nn.Linear(dim, dim)
        self.linear_pos = nn.Linear(dim, dim, bias=False)
        self.pos_bias_u = nn.Parameter(torch.zeros(heads, self.head_dim))
        self.pos_bias_v = nn.Parameter(torch.zeros(heads, self.head_dim))

    def forward(self, x: Tensor, mask: Tensor, pos_emb: Tensor) -> Tensor:
        """x [B, T, D]; mask bool [B, 1, T or 1, T]; pos_emb [1, 2T-1, D] → [B, T, D]."""
        batch, time, _ = x.shape

        def split_heads(y: Tensor) -> Tensor:
            return y.view(y.size(0), -1, self.heads, self.head_dim)

        q = split_heads(self.linear_q(x))
        k = split_heads(self.linear_k(x)).transpose(1, 2)
        v = split_heads(self.linear_v(x)).transpose(1, 2)
        p = split_heads(self.linear_pos(pos_emb)).transpose(1, 2)
        q_content = (q + self.pos_bias_u).transpose(1, 2)
        q_position = (q + self.pos_bias_v).transpose(1, 2)
        position_scores = _relative_shift(torch.matmul(q_position, p.transpose(-2, -1)))
        bias = (position_scores / math.sqrt(self.head_dim)).masked_fill(~mask, float("-inf"))
        out = F.scaled_dot_product_attention(q_content, k, v, attn_mask=bias)
        return self.linear_out(out.transpose(1, 2).reshape(batch, time, -1))
