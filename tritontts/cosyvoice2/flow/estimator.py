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
from tritontts.cosyvoice2.flow.prefix import PrefixRun, chunk_mask_after


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

    def _transform(
        self, x: Tensor, attn_mask: Tensor, blocks: nn.ModuleList, run: PrefixRun | None = None
    ) -> Tensor:
        x = x.transpose(1, 2)
        for block in blocks:
            x = block(x, attn_mask, run)
        return x.transpose(1, 2)

    def _resample(self, resample: nn.Module, x: Tensor, run: PrefixRun | None) -> Tensor:
        return resample(x) if run is None else run.conv(resample, x)

    def forward(
        self,
        x: Tensor,
        mask: Tensor,
        mu: Tensor,
        t: Tensor,
        spks: Tensor,
        cond: Tensor,
        streaming: bool = False,
        run: PrefixRun | None = None,
    ) -> Tensor:
        """x, mu, cond [B, 80, T]; mask [B, 1, T] (1 = valid); t [B]; spks [B, 80] → velocity [B, 80, T].

        With `run` (streaming only, one level), the T frames follow `run.prefix`'s frames."""
        if run is not None and (not streaming or len(self.down_blocks) != 1):
            raise ValueError("a prefix run needs streaming and an estimator of one level")
        time_emb = self.time_mlp(sinusoidal_time_embedding(t, self.config.in_channels))
        x = torch.cat([x, mu, spks.unsqueeze(-1).expand(-1, -1, x.size(-1)), cond], dim=1)

        chunk = self.config.static_chunk_size if streaming else 0
        made: list[tuple[Tensor, Tensor]] = []

        def attn(level_mask: Tensor) -> Tensor:
            """The level's float attention mask, made once per mask (the levels of one resolution share it)."""
            for known, attn_mask in made:
                if known is level_mask:
                    return attn_mask
            if run is None:
                boolean = attention_mask(level_mask.bool(), chunk)
            else:
                boolean = chunk_mask_after(run.offset, level_mask.size(-1), chunk, level_mask.bool())
            made.append((level_mask, additive_mask(boolean, x.dtype)))
            return made[-1][1]

        skips = []
        masks = [mask]
        for resnet, blocks, downsample in self.down_blocks:
            level_mask = masks[-1]
            x = self._transform(resnet(x, level_mask, time_emb, run), attn(level_mask), blocks, run)
            skips.append(x)
            x = self._resample(downsample, x * level_mask, run)
            masks.append(level_mask[:, :, ::2])
        masks = masks[:-1]
        mid_mask = masks[-1]
        for resnet, blocks in self.mid_blocks:
            x = self._transform(resnet(x, mid_mask, time_emb, run), attn(mid_mask), blocks, run)
        for resnet, blocks, upsample in self.up_blocks:
            level_mask = masks.pop()
            skip = skips.pop()
            x = torch.cat([x[:, :, : skip.size(-1)], skip], dim=1)
            x = self._transform(resnet(x, level_mask, time_emb, run), attn(level_mask), blocks, run)
            x = self._resample(upsample, x * level_mask, run)
        x = self.final_block(x, level_mask, run)
        return self.final_proj(x * level_mask) * mask
