"""Padded batches through BiCodec's convolutions as if each item were alone.

Every layer of BiCodec's encoder, prenet and decoder is per frame except the convolutions. A convolution's input
zeroed past each item's end (a forward pre-hook, at that layer's rate) is what the item alone gives it: its zero
padding. So an item of a padded batch comes out as it would alone, up to float rounding.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from tritontts.spark.layers import WNConv1d, WNConvTranspose1d


def temporal_convs(module: nn.Module) -> list[nn.Module]:
    """The layers that mix frames: convolutions wider than one step, and transposed convolutions."""
    convs = []
    for layer in module.modules():
        if isinstance(layer, WNConvTranspose1d):
            convs.append(layer)
        elif isinstance(layer, nn.Conv1d) and layer.kernel_size[0] > 1:
            convs.append(layer)
        elif isinstance(layer, WNConv1d) and layer.weight_v.shape[-1] > 1:
            convs.append(layer)
    return convs


class FrameMask:
    """While active, zeroes each hooked layer's input past every item's end: `lengths` are in token frames of
    a `frames`-long pass; a layer at k times the token rate keeps `k * length` steps."""

    def __init__(self, layers: Sequence[nn.Module]) -> None:
        self.lengths: Tensor | None = None
        self.frames = 0
        self.handles = [layer.register_forward_pre_hook(self._hook) for layer in layers]

    def _hook(self, module: nn.Module, args: tuple) -> tuple | None:
        if self.lengths is None:
            return None
        x = args[0]
        steps = x.shape[-1]
        keep = torch.arange(steps, device=x.device) < (self.lengths * (steps // self.frames)).unsqueeze(1)
        return (x * keep.unsqueeze(1).to(x.dtype), *args[1:])

    @contextmanager
    def active(self, lengths: Tensor, frames: int):
        self.lengths, self.frames = lengths, frames
        try:
            yield
        finally:
            self.lengths = None
