"""Factorized VQ (semantic tokens) and finite scalar quantization (global tokens); lookups run in fp32."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tritontts.spark.config import QuantizerConfig
from tritontts.spark.layers import WNConv1d


class FactorizedVectorQuantizer(nn.Module):
    """Project to `codebook_dim`, pick the nearest L2-normalised code; ids back to `input_dim` latents."""

    def __init__(self, cfg: QuantizerConfig) -> None:
        super().__init__()
        if cfg.input_dim == cfg.codebook_dim:
            raise NotImplementedError("a factorized VQ without projections is not used by BiCodec")
        self.in_project = WNConv1d(cfg.input_dim, cfg.codebook_dim, kernel_size=1)
        self.out_project = WNConv1d(cfg.codebook_dim, cfg.input_dim, kernel_size=1)
        self.codebook = nn.Embedding(cfg.codebook_size, cfg.codebook_dim)
        self.register_buffer("cluster_size", torch.zeros(cfg.codebook_size))

    def tokenize(self, z: Tensor) -> Tensor:
        """`[B, input_dim, T]` → ids `[B, T]`."""
        latents = self.in_project(z).transpose(1, 2).reshape(-1, self.codebook.embedding_dim).float()
        latents = F.normalize(latents)
        codes = F.normalize(self.codebook.weight.float())
        distance = latents.pow(2).sum(1, keepdim=True) - 2 * latents @ codes.t() + codes.pow(2).sum(1)[None]
        return (-distance).max(1).indices.view(z.shape[0], -1)

    def detokenize(self, ids: Tensor) -> Tensor:
        """ids `[B, T]` → `[B, input_dim, T]` (raw, not normalised, codebook rows)."""
        return self.out_project(self.codebook(ids).transpose(1, 2))


class FiniteScalarQuantizer(nn.Module):
    """FSQ over `len(levels)` dims; no weights, index math in fp32/int64."""

    def __init__(self, levels: list[int]) -> None:
        super().__init__()
        levels_t = torch.tensor(levels, dtype=torch.int64)
        basis = torch.cumprod(torch.tensor([1, *levels[:-1]], dtype=torch.int64), dim=0)
        self.register_buffer("levels", levels_t, persistent=False)
        self.register_buffer("basis", basis, persistent=False)

    @property
    def codebook_size(self) -> int:
        return int(self.levels.prod())

    def quantize(self, z: Tensor) -> Tensor:
        """Bounded, rounded codes in [-1, 1], shape of `z` (`[..., len(levels)]`), fp32."""
        eps = 1e-3
        half_l = (self.levels - 1).float() * (1 + eps) / 2
        offset = torch.where(self.levels % 2 == 0, 0.5, 0.0).float()
        shift = (offset / half_l).atanh()
        bounded = (z.float() + shift).tanh() * half_l - offset
        return bounded.round() / (self.levels // 2).float()

    def codes_to_ids(self, codes: Tensor) -> Tensor:
        half_width = (self.levels // 2).float()
        level_ids = (codes * half_width + half_width).round().long()
        return (level_ids * self.basis).sum(-1)

    def ids_to_codes(self, ids: Tensor) -> Tensor:
        level_ids = (ids.long().unsqueeze(-1) // self.basis) % self.levels
        half_width = (self.levels // 2).float()
        return (level_ids.float() - half_width) / half_width


class ResidualFSQ(nn.Module):
    """Residual FSQ in a `len(levels)`-dim space reached by `project_in` from `dim`."""

    def __init__(self, levels: list[int], num_quantizers: int, dim: int) -> None:
        super().__init__()
        self.project_in = nn.Linear(dim, len(levels))
        self.project_out = nn.Linear(len(levels), dim)
        self.layers = nn.ModuleList([FiniteScalarQuantizer(levels) for _ in range(num_quantizers)])
        levels_f = torch.tensor(levels, dtype=torch.float32)
        scales = torch.stack([(levels_f - 1) ** -float(q) for q in range(num_quantizers)])
        self.register_buffer("scales", scales, persistent=False)

    def tokenize(self, x_bnd: Tensor) -> Tensor:
        """`[B, N, dim]` → ids `[B, N, num_quantizers]`."""
        residual = self.project_in(x_bnd).float()
        ids = []
        for fsq, scale in zip(self.layers, self.scales.float()):
            codes = fsq.quantize(residual / scale)
            residual = residual - codes * scale
            ids.append(fsq.codes_to_ids(codes))
        return torch.stack(ids, dim=-1)

    def detokenize(self, ids: Tensor) -> Tensor:
        """ids `[B, N, num_quantizers]` → `[B, N, dim]`."""
        summed = sum(
            fsq.ids_to_codes(ids[..., q]) * self.scales[q].float() for q, fsq in enumerate(self.layers)
        )
        return self.project_out(summed.to(self.project_out.weight.dtype))
