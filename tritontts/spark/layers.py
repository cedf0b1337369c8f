"""Weight-normed convolutions with old-style `weight_g` / `weight_v` parameters, and the Snake activation."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def weight_from_norm(weight_g: Tensor, weight_v: Tensor) -> Tensor:
    """`g * v / ||v||`, the norm taken over every dim but the first (`torch.nn.utils.weight_norm`, dim=0)."""
    v = weight_v.float()
    norm = v.pow(2).sum(dim=tuple(range(1, v.dim())), keepdim=True).sqrt()
    return (weight_g.float() * v / norm).to(weight_v.dtype)


class _WeightNormed(nn.Module):
    """Holds `weight_g`, `weight_v`, `bias`; the weight is recomputed per call until `fuse_weight_norm()`."""

    def __init__(self, weight_shape: tuple[int, ...], out_channels: int) -> None:
        super().__init__()
        self.weight_g = nn.Parameter(torch.ones(weight_shape[0], *([1] * (len(weight_shape) - 1))))
        self.weight_v = nn.Parameter(torch.randn(weight_shape) * 0.02)
        self.bias = nn.Parameter(torch.zeros(out_channels))
        self.register_buffer("fused_weight", None, persistent=False)

    def weight(self) -> Tensor:
        if self.fused_weight is not None:
            return self.fused_weight
        return weight_from_norm(self.weight_g, self.weight_v)

    @torch.no_grad()
    def fuse_weight_norm(self) -> None:
        self.fused_weight = weight_from_norm(self.weight_g, self.weight_v)


class WNConv1d(_WeightNormed):
    def __init__(
        self, in_channels: int, out_channels: int, kernel_size: int, dilation: int = 1, padding: int = 0
    ):
        super().__init__((out_channels, in_channels, kernel_size), out_channels)
        self.dilation = dilation
        self.padding = padding

    def forward(self, x: Tensor) -> Tensor:
        return F.conv1d(x, self.weight(), self.bias, padding=self.padding, dilation=self.dilation)


class WNConvTranspose1d(_WeightNormed):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int, padding: int = 0):
        super().__init__((in_channels, out_channels, kernel_size), out_channels)
        self.stride = stride
        self.padding = padding

    def forward(self, x: Tensor) -> Tensor:
        return F.conv_transpose1d(x, self.weight(), self.bias, stride=self.stride, padding=self.padding)


class Snake1d(nn.Module):
    """`x + sin(alpha x)^2 / alpha` per channel."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, channels, 1))

    def forward(self, x: Tensor) -> Tensor:
        return x + (self.alpha + 1e-9).reciprocal() * torch.sin(self.alpha * x).pow(2)


def fuse_weight_norm(module: nn.Module) -> None:
    """Compute every weight-normed weight once; call after loading, before inference."""
    for child in module.modules():
        if isinstance(child, _WeightNormed):
            child.fuse_weight_norm()
