"""`CausalCFM.solve_after` of one voice's prefix over a batch of rows, replayed from CUDA graphs, one per (rows,
prefix frames, padded frames after the prefix).

Every graph reads the prefix from one static set of buffers, as long as the longest prefix length captured (a
shorter prefix is a view of its first frames), so a call copies its voice's prefix in only when another voice's
(or another length's) is there. Rows pad to the next captured batch size (zeros, mask 1) and frames to the next
bucket (mask 0). Without a graph for a call (CPU, or past the memory limit) the same padded call runs eagerly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from tritontts.cosyvoice2.flow.cfm import CausalCFM
from tritontts.cosyvoice2.flow.prefix import LayerPrefix
from tritontts.cuda_graphs import CaptureReport, FlowGraphConfig, capture_graph, capture_within_limit


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph | None
    mu: Tensor
    spks: Tensor
    cond: Tensor
    mask: Tensor
    out: Tensor | None = None


class GraphedPrefixCFM:
    """`__call__(voice, prefixes, mu, spks, cond, mask)` as `cfm.solve_after(prefixes, mu, spks, cond, steps,
    mask=mask)[0]`; `voice` names the prefixes (same voice and length: same prefixes)."""

    def __init__(
        self, cfm: CausalCFM, n_timesteps: int, config: FlowGraphConfig, prefix_frames: Sequence[int]
    ) -> None:
        self.cfm = cfm
        self.n_timesteps = n_timesteps
        self.config = config
        self.prefix_frames = tuple(sorted(set(prefix_frames)))
        self.device = cfm.rand_noise.device
        self.dtype = next(cfm.estimator.parameters()).dtype
        self._graphs: dict[tuple[int, int, int], _Graph] = {}
        self._static: list[LayerPrefix] | None = None
        self._loaded: tuple[str, int] | None = None
        self.captured = False
        self.calls = {"graph": 0, "padded": 0, "copied": 0}

    def routes(self, rows: int, prefix: int, frames: int) -> bool:
        """Whether a call of `rows` rows and `frames` frames after a prefix of `prefix` frames runs here: it fits
        a batch size and a bucket and, once graphs are captured, one of them (uncaptured: padded, eagerly)."""
        batch, bucket = self.config.batch_for(rows), self.config.bucket(frames)
        if batch is None or bucket is None or prefix not in self.prefix_frames:
            return False
        return not self.captured or (batch, prefix, bucket) in self._graphs

    @torch.inference_mode()
    def capture(self) -> CaptureReport:
        """The static prefix buffers (a prefix of the longest length, made once over zeros), then every (rows,
        prefix frames, bucket) graph, smallest first, until the pool passes the memory limit."""
        self._static = self._make_static(max(self.prefix_frames))
        keys = [
            (batch, prefix, frames)
            for prefix in self.prefix_frames
            for frames in self.config.buckets
            for batch in self.config.batch_sizes
        ]

        def capture_key(key: tuple[int, int, int], pool: tuple) -> None:
            batch, prefix, frames = key
            g = self._inputs(batch, frames)
            g.mask.fill_(1)
            views = _views(self._static, prefix)
            g.graph, g.out = capture_graph(
                lambda: self.cfm.solve_after(views, g.mu, g.spks, g.cond, self.n_timesteps, mask=g.mask)[0],
                self.device,
                pool,
            )
            self._graphs[key] = g

        ordered = sorted(keys, key=lambda k: (k[0] * (k[1] + k[2]), k))
        return capture_within_limit(
            ordered, capture_key, self.device, self.config.memory_limit_mib, "flow prefix"
        )

    @torch.inference_mode()
    def __call__(
        self,
        voice: str,
        prefixes: Sequence[LayerPrefix],
        mu: Tensor,
        spks: Tensor,
        cond: Tensor,
        mask: Tensor,
    ) -> Tensor:
        """mu, cond [B, 80, T] after the prefix, spks [B, 80], mask [B, 1, T] → mel [B, 80, T] fp32."""
        rows, _, frames = mu.shape
        prefix = prefixes[0].frames
        batch, bucket = self.config.batch_for(rows), self.config.bucket(frames)
        if batch is None or bucket is None:
            return self.cfm.solve_after(prefixes, mu, spks, cond, self.n_timesteps, mask=mask)[0]
        mu, spks, cond, mask = _padded(mu, spks, cond, mask, batch, bucket)
        g = self._graphs.get((batch, prefix, bucket))
        if g is None:
            self.calls["padded"] += 1
            out = self.cfm.solve_after(prefixes, mu, spks, cond, self.n_timesteps, mask=mask)[0]
            return out[:rows, :, :frames]
        self._load(voice, prefixes)
        self.calls["graph"] += 1
        g.mu.copy_(mu)
        g.spks.copy_(spks)
        g.cond.copy_(cond)
        g.mask.copy_(mask)
        g.graph.replay()
        return g.out[:rows, :, :frames].clone()

    def _make_static(self, frames: int) -> list[LayerPrefix]:
        bins = self.cfm.mel_bins
        zeros = torch.zeros(1, bins, frames, device=self.device, dtype=self.dtype)
        spks = torch.zeros(1, bins, device=self.device, dtype=self.dtype)
        _, prefixes = self.cfm.solve_after(None, zeros, spks, zeros, self.n_timesteps, keep=frames)
        return [_contiguous(p) for p in prefixes]

    def _inputs(self, batch: int, frames: int) -> _Graph:
        def zeros(*shape: int) -> Tensor:
            return torch.zeros(*shape, device=self.device, dtype=self.dtype)

        bins = self.cfm.mel_bins
        return _Graph(
            None,
            zeros(batch, bins, frames),
            zeros(batch, bins),
            zeros(batch, bins, frames),
            zeros(batch, 1, frames),
        )

    def _load(self, voice: str, prefixes: Sequence[LayerPrefix]) -> None:
        """Copies the voice's prefixes into the static buffers unless they hold them already."""
        frames = prefixes[0].frames
        if self._loaded == (voice, frames):
            return
        for static, prefix in zip(_views(self._static, frames), prefixes):
            for into, source in zip(
                (*static.convs, *static.keys, *static.values), (*prefix.convs, *prefix.keys, *prefix.values)
            ):
                into.copy_(source)
        self._loaded = (voice, frames)
        self.calls["copied"] += 1


def _views(static: list[LayerPrefix], frames: int) -> list[LayerPrefix]:
    """The static prefixes' first `frames` frames. Only the attention's keys and values have frames: the
    convolutions' histories are copied in whole for every length."""
    return [
        LayerPrefix(frames, p.convs, [k[:, :, :frames] for k in p.keys], [v[:, :, :frames] for v in p.values])
        for p in static
    ]


def _contiguous(prefix: LayerPrefix) -> LayerPrefix:
    return LayerPrefix(
        prefix.frames,
        [t.contiguous() for t in prefix.convs],
        [t.contiguous() for t in prefix.keys],
        [t.contiguous() for t in prefix.values],
    )


def _padded(
    mu: Tensor, spks: Tensor, cond: Tensor, mask: Tensor, batch: int, frames: int
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Rows of zeros (mask 1) up to `batch`, then frames (mask 0) up to `frames`."""
    rows, pad = batch - mu.size(0), frames - mu.size(2)
    mu = F.pad(mu, (0, pad, 0, 0, 0, rows))
    cond = F.pad(cond, (0, pad, 0, 0, 0, rows))
    spks = F.pad(spks, (0, 0, 0, rows))
    mask = F.pad(F.pad(mask.to(mu.dtype), (0, 0, 0, 0, 0, rows), value=1), (0, pad))
    return mu, spks, cond, mask
