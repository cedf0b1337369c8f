"""The DiT velocity estimator of the Step-Audio-2 flow, whole or chunk by chunk.

Input [x, mu, speaker, cond] stacked on channels → linear → `depth` blocks, each an adaLN-zero modulated
(shift, scale, gate) self-attention with LayerNormed q/k, then a causal two-convolution block, then a
tanh-GELU MLP → an adaLN final layer. The time embedding (cos ‖ sin of 1000 t) conditions every block.
There is no positional encoding: the whole forward attends over all frames, and a chunk attends over its
own frames and the cached keys/values of every earlier chunk; each convolution caches its last 2 inputs.
A right-padded call (`FramePadding`) masks the padded keys and takes the convolution caches from the last
valid inputs; every other op works frame by frame, so the valid frames come out as without padding.
Parameter names are the checkpoint's (`blocks.N.attn.to_q`, `blocks.N.conv.block.1`, ...).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tritontts.conv_gemm import CausalConv1d
from tritontts.cosyvoice2.flow.blocks import Transpose
from tritontts.dit_token2wav.config import DiTConfig
from tritontts.qkv import QKVProjection

TIME_FREQUENCIES = 256
TIME_SCALE = 1000.0
CONV_KERNEL = 3
NORM_EPS = 1e-6


def timestep_embedding(t: Tensor, dim: int = TIME_FREQUENCIES, max_period: float = 10000.0) -> Tensor:
    """[B] (already scaled) times → [B, dim]: cos ‖ sin of t * exp(-ln(max_period) * i / (dim / 2))."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, device=t.device) / half).to(t)
    angles = t[:, None] * freqs[None]
    return torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1)


def modulate(x: Tensor, shift: Tensor, scale: Tensor) -> Tensor:
    return x * (1 + scale) + shift


class TimestepEmbedder(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(TIME_FREQUENCIES, hidden), nn.SiLU(), nn.Linear(hidden, hidden))

    def forward(self, t: Tensor) -> Tensor:
        return self.mlp(timestep_embedding(t * TIME_SCALE))


@dataclass(frozen=True)
class FramePadding:
    """Which frames of a right-padded call are real, per row. Tensors only (a CUDA graph can hold them)."""

    key_mask: Tensor
    """bool [B, 1, 1, T + C]: the keys a query may read, the chunk's T padded frames then the cache's C"""
    conv_tail: Tensor
    """int64 [B, 1, 2]: where the last 2 valid inputs sit in a convolution's cache ‖ chunk input"""


def frame_padding(
    frames: Tensor, padded_frames: int, cache_frames: Tensor | None = None, padded_cache_frames: int = 0
) -> FramePadding:
    """frames, cache_frames int64 [B]: the valid chunk and cache frames of each row (cache_frames None: no
    cache) → the padding of a call of `padded_frames` chunk frames over `padded_cache_frames` cache frames."""
    positions = torch.arange(padded_frames + padded_cache_frames, device=frames.device)
    key_mask = positions < frames[:, None]
    if cache_frames is not None:
        in_cache = positions - padded_frames
        key_mask = key_mask | ((in_cache >= 0) & (in_cache < cache_frames[:, None]))
    conv_tail = frames[:, None] + torch.arange(CONV_KERNEL - 1, device=frames.device)
    return FramePadding(key_mask[:, None, None, :], conv_tail[:, None, :])


class Attention(QKVProjection):
    def __init__(self, dim: int, heads: int, head_dim: int) -> None:
        super().__init__()
        self.heads = heads
        self.head_dim = head_dim
        inner = heads * head_dim
        self.init_projections(dim, inner, bias=True)
        self.q_norm = nn.LayerNorm(head_dim)
        self.k_norm = nn.LayerNorm(head_dim)
        self.proj = nn.Linear(inner, dim)

    def forward(
        self, x: Tensor, cache: Tensor | None, key_mask: Tensor | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """x [B, T, C]; cache [B, H, C', 2 head_dim] of the earlier frames or None (no cache kept); key_mask
        bool [B, 1, 1, T + C'] or None (all keys) → (out [B, T, C], this chunk's keys ‖ values [B, H, T,
        2 head_dim], or None without a cache)."""
        batch, time, _ = x.shape

        def split_heads(y: Tensor) -> Tensor:
            return y.view(batch, time, self.heads, self.head_dim).transpose(1, 2)

        q, k, v = self.project(x)
        q, k, v = self.q_norm(split_heads(q)), self.k_norm(split_heads(k)), split_heads(v)
        new_entries = None
        if cache is not None:
            new_entries = torch.cat([k, v], dim=-1)
            k_cache, v_cache = cache.split(self.head_dim, dim=-1)
            k, v = torch.cat([k, k_cache], dim=2), torch.cat([v, v_cache], dim=2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask)
        return self.proj(out.transpose(1, 2).reshape(batch, time, -1)), new_entries


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class CausalConvBlock(nn.Module):
    """conv → LayerNorm → Mish → conv over [B, T, C], both convolutions causal (kernel 3)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim
        self.block = nn.Sequential(
            Transpose(),
            CausalConv1d(dim, dim, CONV_KERNEL),
            Transpose(),
            nn.LayerNorm(dim),
            nn.Mish(),
            Transpose(),
            CausalConv1d(dim, dim, CONV_KERNEL),
            Transpose(),
        )

    def forward(
        self, x: Tensor, cache: Tensor | None, tail: Tensor | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """x [B, T, C]; cache [B, 2C, 2] (the two convolutions' last inputs) or None (zeros, none kept);
        tail int64 [B, 1, 2] (`FramePadding.conv_tail`) or None (the last 2 inputs are the valid ones)."""
        if cache is None:
            return self.block(x), None
        first, second = self.block[1], self.block[6]
        cache1, cache2 = cache.split(self.dim, dim=1)

        def last_inputs(y: Tensor) -> Tensor:
            if tail is None:
                return y[..., -(CONV_KERNEL - 1) :]
            return y.gather(2, tail.expand(-1, y.size(1), -1))

        y = first.after_history(cache1, x.transpose(1, 2))
        new1 = last_inputs(y)
        y = first.over_history(y)
        y = self.block[4](self.block[3](y.transpose(1, 2))).transpose(1, 2)
        y = second.after_history(cache2, y)
        new2 = last_inputs(y)
        y = second.over_history(y)
        return y.transpose(1, 2), torch.cat([new1, new2], dim=1)


class DiTBlock(nn.Module):
    def __init__(self, config: DiTConfig) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.norm1 = nn.LayerNorm(hidden, elementwise_affine=False, eps=NORM_EPS)
        self.attn = Attention(hidden, config.num_heads, config.head_dim)
        self.norm2 = nn.LayerNorm(hidden, elementwise_affine=False, eps=NORM_EPS)
        self.mlp = MLP(hidden, config.mlp_hidden)
        self.norm3 = nn.LayerNorm(hidden, elementwise_affine=False, eps=NORM_EPS)
        self.conv = CausalConvBlock(hidden)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden, 9 * hidden))

    def forward(
        self,
        x: Tensor,
        c: Tensor,
        cnn_cache: Tensor | None,
        att_cache: Tensor | None,
        padding: FramePadding | None = None,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """x [B, T, C]; c [B, 1, C] time embedding; caches as Attention / CausalConvBlock take them and
        return them (the attention's: this chunk's entries only)."""
        key_mask = None if padding is None else padding.key_mask
        conv_tail = None if padding is None else padding.conv_tail
        (
            shift_msa,
            scale_msa,
            gate_msa,
            shift_mlp,
            scale_mlp,
            gate_mlp,
            shift_conv,
            scale_conv,
            gate_conv,
        ) = self.adaLN_modulation(c).chunk(9, dim=-1)
        attended, att_cache = self.attn(modulate(self.norm1(x), shift_msa, scale_msa), att_cache, key_mask)
        x = x + gate_msa * attended
        convolved, cnn_cache = self.conv(
            modulate(self.norm3(x), shift_conv, scale_conv), cnn_cache, conv_tail
        )
        x = x + gate_conv * convolved
        x = x + gate_mlp * self.mlp(modulate(self.norm2(x), shift_mlp, scale_mlp))
        return x, cnn_cache, att_cache


class FinalLayer(nn.Module):
    def __init__(self, hidden: int, out_channels: int) -> None:
        super().__init__()
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden, 2 * hidden))
        self.norm_final = nn.LayerNorm(hidden, elementwise_affine=False, eps=NORM_EPS)
        self.linear = nn.Linear(hidden, out_channels)

    def forward(self, x: Tensor, c: Tensor) -> Tensor:
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=-1)
        return self.linear(modulate(self.norm_final(x), shift, scale))


@dataclass(frozen=True)
class DiTCache:
    cnn: Tensor
    """[depth, B, 2 * hidden, 2] each block's convolution inputs before the chunk"""
    att: Tensor
    """[depth, B, heads, T, 2 * head_dim] each block's keys ‖ values, newest chunk first (what `DiT.forward`
    returns: only its own chunk's T frames, to be put before the cached ones)"""


class DiT(nn.Module):
    def __init__(self, config: DiTConfig) -> None:
        super().__init__()
        self.config = config
        self.t_embedder = TimestepEmbedder(config.hidden_size)
        self.in_proj = nn.Linear(config.in_channels, config.hidden_size)
        self.blocks = nn.ModuleList(DiTBlock(config) for _ in range(config.depth))
        self.final_layer = FinalLayer(config.hidden_size, config.out_channels)

    def empty_cache(self, batch: int, device: torch.device, dtype: torch.dtype) -> DiTCache:
        """The cache before any frame: zero convolution inputs, no keys."""
        cfg = self.config
        cnn = torch.zeros(cfg.depth, batch, 2 * cfg.hidden_size, CONV_KERNEL - 1, device=device, dtype=dtype)
        att = torch.zeros(cfg.depth, batch, cfg.num_heads, 0, 2 * cfg.head_dim, device=device, dtype=dtype)
        return DiTCache(cnn, att)

    def forward(
        self,
        x: Tensor,
        mu: Tensor,
        t: Tensor,
        spks: Tensor,
        cond: Tensor,
        cache: DiTCache | None = None,
        padding: FramePadding | None = None,
    ) -> tuple[Tensor, DiTCache | None]:
        """x, mu, cond [B, 80, T]; t [B]; spks [B, 80] → (velocity [B, 80, T], the cache entries of these
        frames: the convolutions' inputs after them and their own keys ‖ values; or None without `cache`: then
        the frames are the whole utterance). `padding`: a right-padded call's valid frames."""
        c = self.t_embedder(t).unsqueeze(1)
        h = torch.cat([x, mu, spks.unsqueeze(-1).expand(-1, -1, x.size(-1)), cond], dim=1)
        h = self.in_proj(h.transpose(1, 2))
        new_cnn, new_att = [], []
        for index, block in enumerate(self.blocks):
            cnn = None if cache is None else cache.cnn[index]
            att = None if cache is None else cache.att[index]
            h, cnn, att = block(h, c, cnn, att, padding)
            new_cnn.append(cnn)
            new_att.append(att)
        velocity = self.final_layer(h, c).transpose(1, 2)
        if cache is None:
            return velocity, None
        return velocity, DiTCache(torch.stack(new_cnn), torch.stack(new_att))
