"""DAC-style wave generator: weight-normed convs, Snake, transposed-conv upsampling by prod(rates), tanh."""

from __future__ import annotations

from torch import Tensor, nn

from tritontts.spark.config import WaveGeneratorConfig
from tritontts.spark.layers import Snake1d, WNConv1d, WNConvTranspose1d


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int) -> None:
        super().__init__()
        self.block = nn.Sequential(
            Snake1d(dim),
            WNConv1d(dim, dim, kernel_size=7, dilation=dilation, padding=3 * dilation),
            Snake1d(dim),
            WNConv1d(dim, dim, kernel_size=1),
        )

    def forward(self, x: Tensor) -> Tensor:
        return x + self.block(x)


class UpsampleBlock(nn.Module):
    def __init__(self, input_dim: int, output_dim: int, kernel_size: int, stride: int) -> None:
        super().__init__()
        self.block = nn.Sequential(
            Snake1d(input_dim),
            WNConvTranspose1d(
                input_dim, output_dim, kernel_size, stride, padding=(kernel_size - stride) // 2
            ),
            ResidualUnit(output_dim, dilation=1),
            ResidualUnit(output_dim, dilation=3),
            ResidualUnit(output_dim, dilation=9),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.block(x)


class WaveGenerator(nn.Module):
    """`[B, input_channel, T]` → audio `[B, d_out, T * prod(rates)]` in [-1, 1]."""

    def __init__(self, cfg: WaveGeneratorConfig) -> None:
        super().__init__()
        for kernel_size, stride in zip(cfg.kernel_sizes, cfg.rates):
            if (kernel_size - stride) % 2:
                raise ValueError(
                    f"kernel {kernel_size} and rate {stride} do not upsample exactly by {stride}"
                )
        layers: list[nn.Module] = [WNConv1d(cfg.input_channel, cfg.channels, kernel_size=7, padding=3)]
        dim = cfg.channels
        for kernel_size, stride in zip(cfg.kernel_sizes, cfg.rates):
            layers.append(UpsampleBlock(dim, dim // 2, kernel_size, stride))
            dim //= 2
        layers += [Snake1d(dim), WNConv1d(dim, cfg.d_out, kernel_size=7, padding=3), nn.Tanh()]
        self.model = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.model(x)
