"""Vocos ConvNeXt backbone and the BiCodec feature encoder / decoders built on it.

Tensors between blocks are channel-first `[B, C, T]` unless a name says otherwise.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tritontts.spark.config import VocosConfig

LAYER_NORM_EPS = 1e-6


class AdaLayerNorm(nn.Module):
    """Layer norm whose scale and shift are linear in a condition vector."""

    def __init__(self, condition_dim: int, dim: int) -> None:
        super().__init__()
        self.dim = dim
        self.scale = nn.Linear(condition_dim, dim)
        self.shift = nn.Linear(condition_dim, dim)

    def forward(self, x_btc: Tensor, condition: Tensor) -> Tensor:
        x_btc = F.layer_norm(x_btc, (self.dim,), eps=LAYER_NORM_EPS)
        return x_btc * self.scale(condition).unsqueeze(1) + self.shift(condition).unsqueeze(1)


def _norm(dim: int, condition_dim: int | None) -> nn.Module:
    return AdaLayerNorm(condition_dim, dim) if condition_dim else nn.LayerNorm(dim, eps=LAYER_NORM_EPS)


def _apply_norm(norm: nn.Module, x_btc: Tensor, condition: Tensor | None) -> Tensor:
    return norm(x_btc, condition) if isinstance(norm, AdaLayerNorm) else norm(x_btc)


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int, intermediate_dim: int, condition_dim: int | None) -> None:
        super().__init__()
        self.dwconv = nn.Conv1d(dim, dim, kernel_size=7, padding=3, groups=dim)
        self.norm = _norm(dim, condition_dim)
        self.pwconv1 = nn.Linear(dim, intermediate_dim)
        self.act = nn.GELU()
        self.pwconv2 = nn.Linear(intermediate_dim, dim)
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor, condition: Tensor | None = None) -> Tensor:
        y = _apply_norm(self.norm, self.dwconv(x).transpose(1, 2), condition)
        y = self.gamma * self.pwconv2(self.act(self.pwconv1(y)))
        return x + y.transpose(1, 2)


class VocosBackbone(nn.Module):
    """`[B, C_in, T]` → `[B, T, dim]` (note: channel-last out, as upstream)."""

    def __init__(
        self, input_channels: int, dim: int, intermediate_dim: int, num_layers: int, condition_dim=None
    ):
        super().__init__()
        self.embed = nn.Conv1d(input_channels, dim, kernel_size=7, padding=3)
        self.norm = _norm(dim, condition_dim)
        self.convnext = nn.ModuleList(
            [ConvNeXtBlock(dim, intermediate_dim, condition_dim) for _ in range(num_layers)]
        )
        self.final_layer_norm = nn.LayerNorm(dim, eps=LAYER_NORM_EPS)

    def forward(self, x: Tensor, condition: Tensor | None = None) -> Tensor:
        x = _apply_norm(self.norm, self.embed(x).transpose(1, 2), condition).transpose(1, 2)
        for block in self.convnext:
            x = block(x, condition)
        return self.final_layer_norm(x.transpose(1, 2))


class UnitSamplingBlock(nn.Module):
    """Upstream's `SamplingBlock` at ratio 1: no weights; `[B, T, C]` → `[B, C, T]` times 3
    (the conv branch and both skip branches are all the identity)."""

    def forward(self, x_btc: Tensor) -> Tensor:
        return 3 * x_btc.transpose(1, 2)


def _resampling_stages(cfg: VocosConfig) -> nn.Sequential:
    return nn.Sequential(
        *[
            nn.Sequential(
                UnitSamplingBlock(),
                VocosBackbone(cfg.vocos_dim, cfg.vocos_dim, cfg.vocos_intermediate_dim, num_layers=2),
            )
            for _ in cfg.sample_ratios
        ]
    )


class FeatureEncoder(nn.Module):
    """wav2vec2 features `[B, C_in, T]` → latents `[B, out_channels, T]`."""

    def __init__(self, cfg: VocosConfig) -> None:
        super().__init__()
        self.encoder = VocosBackbone(
            cfg.input_channels, cfg.vocos_dim, cfg.vocos_intermediate_dim, cfg.vocos_num_layers
        )
        self.downsample = _resampling_stages(cfg)
        self.project = nn.Linear(cfg.vocos_dim, cfg.out_channels)

    def forward(self, x: Tensor) -> Tensor:
        return self.project(self.downsample(self.encoder(x))).transpose(1, 2)


class FeatureDecoder(nn.Module):
    """Latents `[B, C_in, T]` (+ condition `[B, condition_dim]` for the prenet) → `[B, out_channels, T]`."""

    def __init__(self, cfg: VocosConfig) -> None:
        super().__init__()
        self.linear_pre = nn.Linear(cfg.input_channels, cfg.vocos_dim)
        self.downsample = _resampling_stages(cfg)
        self.vocos_backbone = VocosBackbone(
            cfg.vocos_dim, cfg.vocos_dim, cfg.vocos_intermediate_dim, cfg.vocos_num_layers, cfg.condition_dim
        )
        self.linear = nn.Linear(cfg.vocos_dim, cfg.out_channels)
        self.use_tanh_at_final = cfg.use_tanh_at_final

    def forward(self, x: Tensor, condition: Tensor | None = None) -> Tensor:
        x = self.downsample(self.linear_pre(x.transpose(1, 2))).transpose(1, 2)
        x = self.linear(self.vocos_backbone(x, condition)).transpose(1, 2)
        return torch.tanh(x) if self.use_tanh_at_final else x
