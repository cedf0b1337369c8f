"""CausalConditionalDecoder: the velocity field v(x_t, t | mu, speaker, cond) of the flow."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from tritontts.conv_gemm import CausalConv1d, PointwiseConv1d
from tritontts.cosyvoice2.config import EstimatorConfig
from tritontts.cosyvoice2.flow.blocks import (
    CausalBlock1D,
    CausalResnetBlock1D,
    Downsample1D,
    TimestepEmbedding,
    TransformerBlock,
    Upsample1D,
    sinusoidal_time_embedding,
)
from tritontts.cosyvoice2.flow.masks import additive_mask, attention_mask


class Estimator(nn.Module):
    """U-Net over time: down levels (resnet, transformers, downsample), mid blocks, up levels with skip
    connections, a final causal block and a 1x1 projection. Each level is a ModuleList
    `[resnet, transformer_blocks, resample]` as in the checkpoint."""

    def __init__(self, config: EstimatorConfig):
        super().__init__()
        self.config = config
        channels = tuple(config.channels)
        time_dim = channels[0] * 4
        self.time_mlp = TimestepEmbedding(config.in_channels, time_dim)

        def transformers(dim: int) -> nn.ModuleList:
            return nn.ModuleList(
                TransformerBlock(dim, config.num_heads, config.attention_head_dim)
                for _ in range(config.n_blocks)
            )

        self.down_blocks = nn.ModuleList()
        out_ch = config.in_channels
        for i, ch in enumerate(channels):
            in_ch, out_ch = out_ch, ch
            last = i == len(channels) - 1
            resample = CausalConv1d(out_ch, out_ch, 3) if last else Downsample1D(out_ch)
            self.down_blocks.append(
                nn.ModuleList([CausalResnetBlock1D(in_ch, out_ch, time_dim), transformers(out_ch), resample])
            )
        self.mid_blocks = nn.ModuleList(
            nn.ModuleList(
                [CausalResnetBlock1D(channels[-1], channels[-1], time_dim), transformers(channels[-1])]
            )
            for _ in range(config.num_mid_blocks)
        )
        up_channels = channels[::-1] + (channels[0],)
        self.up_blocks = nn.ModuleList()
        for i in range(len(up_channels) - 1):
            in_ch, out_ch = up_channels[i] * 2, up_channels[i + 1]
            last = i == len(up_channels) - 2
            resample = CausalConv1d(out_ch, out_ch, 3) if last else Upsample1D(out_ch)
            self.up_blocks.append(
                nn.ModuleList([CausalResnetBlock1D(in_ch, out_ch, time_dim), transformers(out_ch), resample])
            )
        self.final_block = CausalBlock1D(up_channels[-1], up_channels[-1])
        self.final_proj = PointwiseConv1d(up_channels[-1], config.out_channels)

    def _transform(self, x: Tensor, attn_mask: Tensor, blocks: nn.ModuleList) -> Tensor:
        x = x.transpose(1, 2)
        for block in blocks:
            x = block(x, attn_mask)
        return x.transpose(1, 2)

    def forward(
        self,
        x: Tensor,
        mask: Tensor,
        mu: Tensor,
        t: Tensor,
        spks: Tensor,
        cond: Tensor,
        streaming: bool = False,
    ) -> Tensor:
        """x, mu, cond [B, 80, T]; mask [B, 1, T] (1 = valid); t [B]; spks [B, 80] → velocity [B, 80, T]."""
        time_emb = self.time_mlp(sinusoidal_time_embedding(t, self.config.in_channels))
        x = torch.cat([x, mu, spks.unsqueeze(-1).expand(-1, -1, x.size(-1)), cond], dim=1)

        chunk = self.config.static_chunk_size if streaming else 0
        made: list[tuple[Tensor, Tensor]] = []

        def attn(level_mask: Tensor) -> Tensor:
            """The level's float attention mask, made once per mask (the levels of one resolution share it)."""
            for known, attn_mask in made:
                if known is level_mask:
                    return attn_mask
            made.append((level_mask, additive_mask(attention_mask(level_mask.bool(), chunk), x.dtype)))
            return made[-1][1]

        skips = []
        masks = [mask]
        for resnet, blocks, downsample in self.down_blocks:
            level_mask = masks[-1]
            x = self._transform(resnet(x, level_mask, time_emb), attn(level_mask), blocks)
            skips.append(x)
            x = downsample(x * level_mask)
            masks.append(level_mask[:, :, ::2])
        masks = masks[:-1]
        mid_mask = masks[-1]
        for resnet, blocks in self.mid_blocks:
            x = self._transform(resnet(x, mid_mask, time_emb), attn(mid_mask), blocks)
        for resnet, blocks, upsample in self.up_blocks:
            level_mask = masks.pop()
            skip = skips.pop()
            x = torch.cat([x[:, :, : skip.size(-1)], skip], dim=1)
            x = self._transform(resnet(x, level_mask, time_emb), attn(level_mask), blocks)
            x = upsample(x * level_mask)
        x = self.final_block(x, level_mask)
        return self.final_proj(x * level_mask) * mask
