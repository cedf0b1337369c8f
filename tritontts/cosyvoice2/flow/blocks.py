"""Building blocks of the flow estimator (a 1-D U-Net with transformer blocks).

Parameter names follow the checkpoint: Matcha-TTS blocks made causal (conv + LayerNorm + Mish) and a
diffusers-style transformer block (`norm1`, `attn1.to_q/k/v/out.0`, `norm3`, `ff.net.0.proj`, `ff.net.2`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tritontts.conv_gemm import CausalConv1d, PointwiseConv1d
from tritontts.cosyvoice2.flow.prefix import PrefixRun
from tritontts.qkv import QKVProjection


class Transpose(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return x.transpose(1, 2)


class CausalBlock1D(nn.Module):
    def __init__(self, dim: int, dim_out: int):
        super().__init__()
        self.block = nn.Sequential(
            CausalConv1d(dim, dim_out, 3), Transpose(), nn.LayerNorm(dim_out), Transpose(), nn.Mish()
        )

    def forward(self, x: Tensor, mask: Tensor, run: PrefixRun | None = None) -> Tensor:
        if run is None:
            return self.block(x * mask) * mask
        y = run.conv(self.block[0], x * mask)
        for layer in self.block[1:]:
            y = layer(y)
        return y * mask


class CausalResnetBlock1D(nn.Module):
    def __init__(self, dim: int, dim_out: int, time_emb_dim: int):
        super().__init__()
        self.mlp = nn.Sequential(nn.Mish(), nn.Linear(time_emb_dim, dim_out))
        self.block1 = CausalBlock1D(dim, dim_out)
        self.block2 = CausalBlock1D(dim_out, dim_out)
        self.res_conv = PointwiseConv1d(dim, dim_out)

    def forward(self, x: Tensor, mask: Tensor, time_emb: Tensor, run: PrefixRun | None = None) -> Tensor:
        h = self.block1(x, mask, run) + self.mlp(time_emb).unsqueeze(-1)
        return self.block2(h, mask, run) + self.res_conv(x * mask)


class Downsample1D(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.conv = nn.Conv1d(dim, dim, 3, 2, 1)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(x)


class Upsample1D(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.conv = nn.ConvTranspose1d(dim, dim, 4, 2, 1)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(x)


def sinusoidal_time_embedding(t: Tensor, dim: int, scale: float = 1000.0) -> Tensor:
    """[B] times in [0, 1] → [B, dim] (sin half, cos half): `scale * t` in t's dtype, the rest in fp32,
    cast back to t's dtype (the order of the reference, so fp16 rounds alike)."""
    half = dim // 2
    freqs = torch.exp(torch.arange(half, device=t.device).float() * -(math.log(10000) / (half - 1)))
    angles = (scale * t.reshape(-1, 1)).float() * freqs.unsqueeze(0)
    return torch.cat([angles.sin(), angles.cos()], dim=-1).to(t.dtype)


class TimestepEmbedding(nn.Module):
    def __init__(self, in_channels: int, time_embed_dim: int):
        super().__init__()
        self.linear_1 = nn.Linear(in_channels, time_embed_dim)
        self.linear_2 = nn.Linear(time_embed_dim, time_embed_dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear_2(F.silu(self.linear_1(x)))


class SelfAttention(QKVProjection):
    def __init__(self, dim: int, heads: int, head_dim: int):
        super().__init__()
        self.heads = heads
        self.head_dim = head_dim
        inner = heads * head_dim
        self.init_projections(dim, inner, bias=False)
        self.to_out = nn.ModuleList([nn.Linear(inner, dim)])

    def forward(self, x: Tensor, mask: Tensor, run: PrefixRun | None = None) -> Tensor:
        """x [B, T, C]; mask broadcastable to [B, heads, T, T] (with `run`: to [B, heads, T, prefix + T])."""
        batch, time, _ = x.shape

        def split_heads(y: Tensor) -> Tensor:
            return y.view(batch, time, self.heads, self.head_dim).transpose(1, 2)

        q, k, v = (split_heads(y) for y in self.project(x))
        if run is not None:
            k, v = run.keys_values(k, v)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.to_out[0](out.transpose(1, 2).reshape(batch, time, -1))


class GELUProjection(nn.Module):
    def __init__(self, dim: int, dim_out: int):
        super().__init__()
        self.proj = nn.Linear(dim, dim_out)

    def forward(self, x: Tensor) -> Tensor:
        return F.gelu(self.proj(x))


class FeedForward(nn.Module):
    def __init__(self, dim: int, mult: int = 4):
        super().__init__()
        self.net = nn.ModuleList([GELUProjection(dim, dim * mult), nn.Identity(), nn.Linear(dim * mult, dim)])

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.net:
            x = layer(x)
        return x


class TransformerBlock(nn.Module):
    """Pre-norm self-attention + GELU feed-forward over [B, T, C]."""

    def __init__(self, dim: int, heads: int, head_dim: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn1 = SelfAttention(dim, heads, head_dim)
        self.norm3 = nn.LayerNorm(dim)
        self.ff = FeedForward(dim)

    def forward(self, x: Tensor, mask: Tensor, run: PrefixRun | None = None) -> Tensor:
        x = x + self.attn1(self.norm1(x), mask, run)
        return x + self.ff(self.norm3(x))
