"""CosyVoice2's F0 predictor: five weight-normed convolutions over the mel, a linear head, `|f0|`.

Parameter names follow upstream's `ConvRNNF0Predictor` built with `torch.nn.utils.parametrizations.weight_norm`
(`condnet.{0,2,4,6,8}.parametrizations.weight.original0/1`, `classifier.weight/bias`).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn.utils.parametrizations import weight_norm

CONV_LAYERS = 5


class ConvRNNF0Predictor(nn.Module):
    def __init__(self, in_channels: int = 80, cond_channels: int = 512, num_class: int = 1) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for i in range(CONV_LAYERS):
            conv = nn.Conv1d(
                in_channels if i == 0 else cond_channels, cond_channels, kernel_size=3, padding=1
            )
            layers += [weight_norm(conv), nn.ELU()]
        self.condnet = nn.Sequential(*layers)
        self.classifier = nn.Linear(cond_channels, num_class)

    def forward(self, mel: Tensor) -> Tensor:
        """`[B, in_channels, T]` → f0 in Hz `[B, T]` (num_class 1)."""
        hidden = self.condnet(mel).transpose(1, 2)
        return torch.abs(self.classifier(hidden).squeeze(-1))
