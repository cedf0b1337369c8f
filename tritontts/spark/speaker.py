"""Speaker encoder: ECAPA-TDNN (512 channels) → perceiver resampler → residual FSQ → global tokens."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tritontts.spark.config import SpeakerEncoderConfig
from tritontts.spark.quantizers import ResidualFSQ

ECAPA_CHANNELS = 512
ECAPA_LATENT_CHANNELS = 512 * 3


class ConvReluBatchNorm(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 1, padding: int = 0) -> None:
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, padding=padding)
        self.bn = nn.BatchNorm1d(out_channels)

    def forward(self, x: Tensor) -> Tensor:
        return self.bn(F.relu(self.conv(x)))


class Res2Conv(nn.Module):
    """Res2Net-style multi-scale dilated conv: `scale` channel groups, each but the last convolved."""

    def __init__(self, channels: int, dilation: int, scale: int = 8) -> None:
        super().__init__()
        self.width = channels // scale
        self.convs = nn.ModuleList(
            [
                nn.Conv1d(self.width, self.width, 3, padding=dilation, dilation=dilation)
                for _ in range(scale - 1)
            ]
        )
        self.bns = nn.ModuleList([nn.BatchNorm1d(self.width) for _ in range(scale - 1)])

    def forward(self, x: Tensor) -> Tensor:
        groups = torch.split(x, self.width, dim=1)
        outputs = []
        y = groups[0]
        for i, (conv, bn) in enumerate(zip(self.convs, self.bns)):
            if i > 0:
                y = y + groups[i]
            y = bn(F.relu(conv(y)))
            outputs.append(y)
        outputs.append(groups[len(self.convs)])
        return torch.cat(outputs, dim=1)


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, bottleneck: int = 128) -> None:
        super().__init__()
        self.linear1 = nn.Linear(channels, bottleneck)
        self.linear2 = nn.Linear(bottleneck, channels)

    def forward(self, x: Tensor) -> Tensor:
        gate = torch.sigmoid(self.linear2(F.relu(self.linear1(x.mean(dim=2)))))
        return x * gate.unsqueeze(2)


class SERes2Block(nn.Module):
    def __init__(self, channels: int, dilation: int) -> None:
        super().__init__()
        self.se_res2block = nn.Sequential(
            ConvReluBatchNorm(channels, channels),
            Res2Conv(channels, dilation),
            ConvReluBatchNorm(channels, channels),
            SqueezeExcite(channels),
        )

    def forward(self, x: Tensor) -> Tensor:
        return x + self.se_res2block(x)


class AttentiveStatsPooling(nn.Module):
    """Attentive statistics pooling with global context (mean and std appended to the attention input)."""

    def __init__(self, in_dim: int, bottleneck: int = 128) -> None:
        super().__init__()
        self.linear1 = nn.Conv1d(in_dim * 3, bottleneck, kernel_size=1)
        self.linear2 = nn.Conv1d(bottleneck, in_dim, kernel_size=1)

    def forward(self, x: Tensor) -> Tensor:
        mean = x.mean(dim=-1, keepdim=True).expand_as(x)
        std = torch.sqrt(x.var(dim=-1, keepdim=True) + 1e-7).expand_as(x)
        alpha = torch.softmax(self.linear2(torch.tanh(self.linear1(torch.cat([x, mean, std], dim=1)))), dim=2)
        weighted_mean = (alpha * x).sum(dim=2)
        var = (alpha * x * x).sum(dim=2) - weighted_mean.pow(2)
        return torch.cat([weighted_mean, var.clamp(min=1e-7).sqrt()], dim=1)


class EcapaTdnn(nn.Module):
    """mel `[B, F, T]` → (x-vector `[B, embed_dim]`, frame latents `[B, 1536, T]`)."""

    def __init__(self, feat_dim: int, embed_dim: int) -> None:
        super().__init__()
        channels = ECAPA_CHANNELS
        self.layer1 = ConvReluBatchNorm(feat_dim, channels, kernel_size=5, padding=2)
        self.layer2 = SERes2Block(channels, dilation=2)
        self.layer3 = SERes2Block(channels, dilation=3)
        self.layer4 = SERes2Block(channels, dilation=4)
        self.conv = nn.Conv1d(channels * 3, ECAPA_LATENT_CHANNELS, kernel_size=1)
        self.pool = AttentiveStatsPooling(ECAPA_LATENT_CHANNELS)
        self.bn = nn.BatchNorm1d(ECAPA_LATENT_CHANNELS * 2)
        self.linear = nn.Linear(ECAPA_LATENT_CHANNELS * 2, embed_dim)

    def latents(self, mel: Tensor) -> Tensor:
        out1 = self.layer1(mel)
        out2 = self.layer2(out1)
        out3 = self.layer3(out2)
        out4 = self.layer4(out3)
        return F.relu(self.conv(torch.cat([out2, out3, out4], dim=1)))

    def forward(self, mel: Tensor) -> tuple[Tensor, Tensor]:
        latent = self.latents(mel)
        return self.linear(self.bn(self.pool(latent))), latent


class CrossAttention(nn.Module):
    """Latent queries attend over `[latents; context]` (upstream `cross_attn_include_queries`)."""

    def __init__(self, dim: int, heads: int = 8, dim_head: int = 64) -> None:
        super().__init__()
        self.heads = heads
        self.to_q = nn.Linear(dim, heads * dim_head, bias=False)
        self.to_kv = nn.Linear(dim, heads * dim_head * 2, bias=False)
        self.to_out = nn.Linear(heads * dim_head, dim, bias=False)

    def forward(self, latents: Tensor, context: Tensor) -> Tensor:
        b, n, _ = latents.shape
        q = self.to_q(latents)
        k, v = self.to_kv(torch.cat([latents, context], dim=1)).chunk(2, dim=-1)
        q, k, v = (t.reshape(b, t.shape[1], self.heads, -1).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
        out = scores.softmax(dim=-1) @ v
        return self.to_out(out.transpose(1, 2).reshape(b, n, -1))


class GatedGeluFeedForward(nn.Module):
    """`Linear → GEGLU → Linear`, keys `0` and `2` as in upstream's Sequential."""

    def __init__(self, dim: int, mult: int = 4) -> None:
        super().__init__()
        inner = int(dim * mult * 2 / 3)
        self.add_module("0", nn.Linear(dim, inner * 2))
        self.add_module("2", nn.Linear(inner, dim))

    def forward(self, x: Tensor) -> Tensor:
        value, gate = getattr(self, "0")(x).chunk(2, dim=-1)
        return getattr(self, "2")(F.gelu(gate) * value)


class PerceiverResampler(nn.Module):
    """Frames `[B, T, dim_context]` → `num_latents` vectors `[B, num_latents, dim]`."""

    def __init__(self, dim: int, dim_context: int, num_latents: int, depth: int = 2) -> None:
        super().__init__()
        self.proj_context = nn.Linear(dim_context, dim)
        self.latents = nn.Parameter(torch.randn(num_latents, dim) * 0.02)
        self.layers = nn.ModuleList(
            [nn.ModuleList([CrossAttention(dim), GatedGeluFeedForward(dim)]) for _ in range(depth)]
        )
        self.norm = RMSNorm(dim)

    def forward(self, x: Tensor) -> Tensor:
        context = self.proj_context(x)
        latents = self.latents.unsqueeze(0).expand(x.shape[0], -1, -1)
        for attention, feed_forward in self.layers:
            latents = attention(latents, context) + latents
            latents = feed_forward(latents) + latents
        return self.norm(latents)


class RMSNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return F.normalize(x, dim=-1) * x.shape[-1] ** 0.5 * self.gamma


class SpeakerEncoder(nn.Module):
    def __init__(self, cfg: SpeakerEncoderConfig) -> None:
        super().__init__()
        self.token_num = cfg.token_num
        self.speaker_encoder = EcapaTdnn(cfg.input_dim, cfg.out_dim)
        self.perceiver_sampler = PerceiverResampler(cfg.latent_dim, ECAPA_LATENT_CHANNELS, cfg.token_num)
        self.quantizer = ResidualFSQ(cfg.fsq_levels, cfg.fsq_num_quantizers, cfg.latent_dim)
        self.project = nn.Linear(cfg.latent_dim * cfg.token_num, cfg.out_dim)

    def tokenize(self, mel: Tensor) -> Tensor:
        """mel `[B, num_mels, T]` → ids `[B, num_quantizers, token_num]`."""
        latents = self.perceiver_sampler(self.speaker_encoder.latents(mel).transpose(1, 2))
        return self.quantizer.tokenize(latents).transpose(1, 2)

    def detokenize(self, ids: Tensor) -> Tensor:
        """ids `[B, num_quantizers, token_num]` → speaker vector `[B, out_dim]`."""
        latents = self.quantizer.detokenize(ids.transpose(1, 2))
        return self.project(latents.transpose(1, 2).reshape(ids.shape[0], -1))
