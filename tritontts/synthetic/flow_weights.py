"""Seeded random weights for the token2wav flows (CosyVoice2's and the Step-Audio-2 DiT's): the official keys,
shapes and key order, taken from the module built on the meta device."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

TensorMaker = Callable[[str, torch.Size, torch.Generator], torch.Tensor]


def flow_tensor(name: str, shape: torch.Size, gen: torch.Generator) -> torch.Tensor:
    """Unit LayerNorm scales, zero biases, small attention position biases, matrices with variance
    1/fan_in so activations keep their scale through the random network."""
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "bias":
        return torch.zeros(shape)
    if leaf == "weight" and len(shape) == 1:
        return torch.ones(shape)
    if leaf in ("pos_bias_u", "pos_bias_v"):
        return torch.randn(shape, generator=gen) * 0.1
    if name == "input_embedding.weight":
        return torch.randn(shape, generator=gen)
    fan_in = math.prod(shape[1:])
    return torch.randn(shape, generator=gen) / math.sqrt(fan_in)


def seeded_state_dict(
    build: Callable[[], nn.Module], make: TensorMaker, seed: int
) -> dict[str, torch.Tensor]:
    """`make(name, shape, generator)` for every entry of `build()`'s state_dict, in its order, from one seed."""
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in build().state_dict().items()}
    gen = torch.Generator().manual_seed(seed)
    return {name: make(name, shape, gen).contiguous() for name, shape in shapes.items()}
