"""CosyVoice3's flow estimator: an F5-TTS style DiT (upstream `cosyvoice.flow.DiT.dit.DiT`), inference only.

`forward(x, mask, mu, t, spks, cond, streaming)` has the signature of CosyVoice2's estimator, so CosyVoice2's
`CausalCFM` (and its CUDA-graph capture) drives it unchanged. Parameter names are upstream's, for strict
loading of `flow.pt` (`decoder.estimator.*`).

Upstream quirks kept on purpose: the rotary embedding rotates the first `dim_head` channels of the projected
q and k, before the split into heads, so only head 0 sees positions; a block's outputs at padded frames are
zeroed after attention; the streaming mask is chunk-causal from frame 0 (all left chunks).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tritontts.cosyvoice2.flow.blocks import sinusoidal_time_embedding
from tritontts.cosyvoice3.config import DiTConfig
from tritontts.qkv import QKVProjection

TIME_FREQUENCIES = 256
CONV_POS_KERNEL = 31
CONV_POS_GROUPS = 16
NORM_EPS = 1e-6
ROPE_BASE = 10000.0


class TimestepEmbedding(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.time_mlp = nn.Sequential(nn.Linear(TIME_FREQUENCIES, dim), nn.SiLU(), nn.Linear(dim, dim))

    def forward(self, t: Tensor) -> Tensor:
        return self.time_mlp(sinusoidal_time_embedding(t, TIME_FREQUENCIES))


class CausalConvPositionEmbedding(nn.Module):
    """Two grouped convolutions (kernel 31, groups 16), each left-padded by kernel - 1 and followed by Mish."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.pad = CONV_POS_KERNEL - 1
        self.conv1 = nn.Sequential(nn.Conv1d(dim, dim, CONV_POS_KERNEL, groups=CONV_POS_GROUPS), nn.Mish())
        self.conv2 = nn.Sequential(nn.Conv1d(dim, dim, CONV_POS_KERNEL, groups=CONV_POS_GROUPS), nn.Mish())

    def forward(self, x: Tensor) -> Tensor:
        y = self.conv1(F.pad(x.transpose(1, 2), (self.pad, 0)))
        y = self.conv2(F.pad(y, (self.pad, 0)))
        return y.transpose(1, 2)


class InputEmbedding(nn.Module):
    def __init__(self, mel_dim: int, mu_dim: int, dim: int, spk_dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(mel_dim * 2 + mu_dim + spk_dim, dim)
        self.conv_pos_embed = CausalConvPositionEmbedding(dim)

    def forward(self, x: Tensor, cond: Tensor, mu: Tensor, spks: Tensor) -> Tensor:
        """x, cond [B, T, mel]; mu [B, T, mu]; spks [B, spk] → [B, T, dim]."""
        spks = spks[:, None, :].expand(-1, x.size(1), -1)
        h = self.proj(torch.cat([x, cond, mu, spks], dim=-1))
        return self.conv_pos_embed(h) + h


class RotaryEmbedding(nn.Module):
    """x_transformers' RotaryEmbedding (no xpos): angles p * base^(-2j/d), each used by a channel pair."""

    def __init__(self, dim_head: int) -> None:
        super().__init__()
        inv_freq = 1.0 / (ROPE_BASE ** (torch.arange(0, dim_head, 2).float() / dim_head))
        self.register_buffer("inv_freq", inv_freq)

    def forward(self, length: int) -> Tensor:
        """[length, dim_head] fp32 angles, interleaved (a0, a0, a1, a1, ...)."""
        positions = torch.arange(length, device=self.inv_freq.device).float()
        angles = positions[:, None] * self.inv_freq.float()[None, :]
        return torch.stack([angles, angles], dim=-1).flatten(-2)


def apply_rotary(x: Tensor, angles: Tensor) -> Tensor:
    """Rotate the first `angles.size(-1)` channels of x [B, T, C] by interleaved pairs; the rest pass through."""
    width = angles.size(-1)
    head, rest = x[..., :width].float(), x[..., width:]
    pairs = head.unflatten(-1, (-1, 2))
    rotated = torch.stack([-pairs[..., 1], pairs[..., 0]], dim=-1).flatten(-2)
    out = head * angles.cos() + rotated * angles.sin()
    return torch.cat([out.to(x.dtype), rest], dim=-1)


class Attention(QKVProjection):
    def __init__(self, dim: int, heads: int, dim_head: int) -> None:
        super().__init__()
        inner = heads * dim_head
        self.heads = heads
        self.init_projections(dim, inner, bias=True)
        self.to_out = nn.ModuleList([nn.Linear(inner, dim), nn.Identity()])

    def forward(self, x: Tensor, attn_mask: Tensor, angles: Tensor) -> Tensor:
        """x [B, T, dim]; attn_mask bool [B, 1, T, T] (True = attend); angles [T, dim_head]."""
        batch, length, _ = x.shape
        q, k, v = self.project(x)
        q, k = apply_rotary(q, angles), apply_rotary(k, angles)

        def heads(y: Tensor) -> Tensor:
            return y.view(batch, length, self.heads, -1).transpose(1, 2)

        out = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), attn_mask=attn_mask)
        return self.to_out[0](out.transpose(1, 2).reshape(batch, length, -1))


class AdaLayerNormZero(nn.Module):
    def __init__(self, dim: int, chunks: int = 6) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, dim * chunks)
        self.chunks = chunks

    def forward(self, t: Tensor) -> tuple[Tensor, ...]:
        return self.linear(F.silu(t)).chunk(self.chunks, dim=1)


def modulate(x: Tensor, shift: Tensor, scale: Tensor) -> Tensor:
    return F.layer_norm(x, x.shape[-1:], eps=NORM_EPS) * (1 + scale[:, None]) + shift[:, None]


class DiTBlock(nn.Module):
    def __init__(self, dim: int, heads: int, dim_head: int, ff_mult: int) -> None:
        super().__init__()
        self.attn_norm = AdaLayerNormZero(dim)
        self.attn = Attention(dim, heads, dim_head)
        inner = int(dim * ff_mult)
        self.ff = nn.Module()
        self.ff.ff = nn.Sequential(
            nn.Sequential(nn.Linear(dim, inner), nn.GELU(approximate="tanh")),
            nn.Identity(),
            nn.Linear(inner, dim),
        )

    def forward(self, x: Tensor, t: Tensor, attn_mask: Tensor, valid: Tensor, angles: Tensor) -> Tensor:
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.attn_norm(t)
        attended = self.attn(modulate(x, shift_msa, scale_msa), attn_mask, angles) * valid
        x = x + gate_msa[:, None] * attended
        return x + gate_mlp[:, None] * self.ff.ff(modulate(x, shift_mlp, scale_mlp))


def attention_mask(valid: Tensor, chunk_frames: int, streaming: bool) -> Tensor:
    """valid bool [B, T] → [B, 1, T, T]: padding only, or chunk-causal over `chunk_frames` when streaming."""
    length = valid.size(1)
    mask = valid[:, None, :].expand(-1, length, -1)
    if streaming and chunk_frames > 0:
        pos = torch.arange(length, device=valid.device)
        visible = pos[None, :] < ((pos // chunk_frames + 1) * chunk_frames)[:, None]
        mask = mask & visible[None]
    return mask[:, None]


class DiT(nn.Module):
    def __init__(self, config: DiTConfig) -> None:
        super().__init__()
        self.config = config
        mu_dim = config.mu_dim if config.mu_dim is not None else config.mel_dim
        self.time_embed = TimestepEmbedding(config.dim)
        self.input_embed = InputEmbedding(config.mel_dim, mu_dim, config.dim, config.spk_dim or 0)
        self.rotary_embed = RotaryEmbedding(config.dim_head)
        self.transformer_blocks = nn.ModuleList(
            DiTBlock(config.dim, config.heads, config.dim_head, config.ff_mult) for _ in range(config.depth)
        )
        self.norm_out = AdaLayerNormZero(config.dim, chunks=2)
        self.proj_out = nn.Linear(config.dim, config.mel_dim)

    def forward(
        self,
        x: Tensor,
        mask: Tensor,
        mu: Tensor,
        t: Tensor,
        spks: Tensor,
        cond: Tensor,
        streaming: bool = False,
    ) -> Tensor:
        """x, mu, cond [B, 80, T]; mask [B, 1, T]; t [B]; spks [B, 80] → velocity [B, 80, T]."""
        if t.ndim == 0:
            t = t.repeat(x.size(0))
        temb = self.time_embed(t)
        h = self.input_embed(x.transpose(1, 2), cond.transpose(1, 2), mu.transpose(1, 2), spks)
        valid = mask[:, 0].bool()
        attn_mask = attention_mask(valid, self.config.static_chunk_size, streaming)
        angles = self.rotary_embed(h.size(1))
        keep = valid[:, :, None].to(h.dtype)
        for block in self.transformer_blocks:
            h = block(h, temb, attn_mask, keep, angles)
        scale, shift = self.norm_out(temb)
        h = modulate(h, shift, scale)
        return self.proj_out(h).transpose(1, 2)
