"""One GEMM for an attention's q, k and v projections, made once the checkpoint is loaded.

The checkpoints keep `to_q`, `to_k` and `to_v` as three Linear layers, and the modules keep their names so that
they load (and the synthetic generator writes) the official layout. `fuse_qkv` then stacks the three weights
into one `to_qkv` layer per attention: one matrix multiply per call instead of three (for the CosyVoice2 flow
estimator's streamed first chunk, 560 GEMMs instead of the 1,680 its profile counted).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def linear_of(weight: Tensor, bias: Tensor | None) -> nn.Linear:
    """A Linear layer holding copies of `weight` [out, in] and `bias`, on their device, in their dtype."""
    layer = nn.Linear(
        weight.size(1), weight.size(0), bias=bias is not None, device=weight.device, dtype=weight.dtype
    )
    with torch.no_grad():
        layer.weight.copy_(weight)
        if bias is not None:
            layer.bias.copy_(bias)
    return layer


class FusedQKV(nn.Module):
    def __init__(self, q: nn.Linear, k: nn.Linear, v: nn.Linear) -> None:
        super().__init__()
        self.sizes = [q.out_features, k.out_features, v.out_features]
        bias = torch.cat([q.bias, k.bias, v.bias]) if q.bias is not None else None
        self.proj = linear_of(torch.cat([q.weight, k.weight, v.weight]), bias)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v = self.proj(x).split(self.sizes, dim=-1)
        return q, k, v

    def unstacked(self) -> list[nn.Linear]:
        """The three Linear layers again (for a comparison with the unfused path)."""
        weights = self.proj.weight.split(self.sizes)
        biases = self.proj.bias.split(self.sizes) if self.proj.bias is not None else [None] * 3
        return [linear_of(weight, bias) for weight, bias in zip(weights, biases, strict=True)]


class QKVProjection(nn.Module):
    """Base of an attention with `to_q`, `to_k`, `to_v`: `project(x)` → (q, k, v), fused or not."""

    to_q: nn.Linear
    to_k: nn.Linear
    to_v: nn.Linear
    to_qkv: FusedQKV | None

    def init_projections(self, dim: int, inner: int, bias: bool) -> None:
        self.to_q = nn.Linear(dim, inner, bias=bias)
        self.to_k = nn.Linear(dim, inner, bias=bias)
        self.to_v = nn.Linear(dim, inner, bias=bias)
        self.to_qkv = None

    def project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        if self.to_qkv is not None:
            return self.to_qkv(x)
        return self.to_q(x), self.to_k(x), self.to_v(x)

    def fuse(self) -> None:
        if self.to_qkv is None:
            self.to_qkv = FusedQKV(self.to_q, self.to_k, self.to_v)
            del self.to_q, self.to_k, self.to_v

    def unfuse(self) -> None:
        if self.to_qkv is not None:
            self.to_q, self.to_k, self.to_v = self.to_qkv.unstacked()
            self.to_qkv = None


def unfuse_qkv(module: nn.Module) -> int:
    """The three projections again in every fused attention of `module` (the path before fusing, for benchmarks
    that compare the two in one process); returns how many."""
    attentions = [m for m in module.modules() if isinstance(m, QKVProjection) and m.to_qkv is not None]
    for attention in attentions:
        attention.unfuse()
    return len(attentions)


def fuse_qkv(module: nn.Module) -> int:
    """Fuse the projections of every attention in `module` (after its weights are loaded); returns how many."""
    attentions = [m for m in module.modules() if isinstance(m, QKVProjection) and m.to_qkv is None]
    for attention in attentions:
        attention.fuse()
    return len(attentions)
