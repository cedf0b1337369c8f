"""Boolean attention masks (True = may attend), shaped for `scaled_dot_product_attention`, and their additive form."""

from __future__ import annotations

import torch
from torch import Tensor


def valid_mask(lengths: Tensor, max_len: int) -> Tensor:
    """[B] lengths → [B, 1, max_len], True on frames inside the sequence."""
    positions = torch.arange(max_len, device=lengths.device)
    return (positions.unsqueeze(0) < lengths.unsqueeze(-1)).unsqueeze(1)


def static_chunk_mask(size: int, chunk_size: int, device: torch.device) -> Tensor:
    """[size, size]: query i sees every key before the end of its own chunk (all left chunks)."""
    positions = torch.arange(size, device=device)
    chunk_end = (torch.div(positions, chunk_size, rounding_mode="floor") + 1) * chunk_size
    return positions.unsqueeze(0) < chunk_end.unsqueeze(1)


def attention_mask(valid: Tensor, chunk_size: int) -> Tensor:
    """[B, 1, T] valid frames → [B, 1, T, T] (chunked, when chunk_size > 0) or [B, 1, 1, T] key mask."""
    if chunk_size <= 0:
        return valid.unsqueeze(1)
    chunks = static_chunk_mask(valid.size(-1), chunk_size, valid.device)
    return (valid & chunks.unsqueeze(0)).unsqueeze(1)


def additive_mask(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """A boolean mask as `scaled_dot_product_attention` turns it into the float mask its fused kernels take
    (0 where True, -inf where False): done once for every block that shares the mask instead of in each call."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(
        mask.logical_not(), float("-inf")
    )
