"""The flow's whole Euler loop replayed from CUDA graphs, one per (streaming, batch, padded frame count).

A call pads its frames to the smallest bucket that holds them (mask 0 on the padding: the estimator's causal
convolutions, masked resampling and key-masked attention leave the valid frames as they were), copies its
inputs into that graph's static buffers, replays it and copies the valid frames out. Longer calls, other batch
sizes and CPU models run eagerly. Graphs share one memory pool, so their activations cost about what the largest
needs; `capture` goes from the smallest up and stops adding graphs once the pool passes `memory_limit_mib`.
With `compile`, the graphs hold the estimator as torch.compile made it (fewer, fused kernels); calls that run
eagerly keep the plain one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from tritontts.cosyvoice2.flow.cfm import CausalCFM
from tritontts.cuda_graphs import CaptureReport, FlowGraphConfig, capture_graph, capture_within_limit

WARM_UP_STEPS = 2
"""Euler steps of the eager run before each capture: every kernel of the loop at the graph's shapes (the step
update included) without launching the other steps (launch-bound eagerly: an estimated third of a capture)"""


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph | None
    x: Tensor
    mu: Tensor
    mask: Tensor
    spks: Tensor
    cond: Tensor
    out: Tensor | None = None


class GraphedCFM:
    """Runs `cfm` like `CausalCFM.forward` (temperature 1), from captured graphs where a bucket fits."""

    def __init__(self, cfm: CausalCFM, n_timesteps: int, config: FlowGraphConfig | None = None) -> None:
        self.cfm = cfm
        self.n_timesteps = n_timesteps
        self.config = config or FlowGraphConfig()
        self.device = cfm.rand_noise.device
        self.dtype = next(cfm.estimator.parameters()).dtype
        self._graphs: dict[tuple[bool, int, int], _Graph] = {}
        self.captured_estimator = torch.compile(cfm.estimator, dynamic=True) if self.config.compile else None
        self.calls = {"graph": 0, "padded": 0, "eager": 0}

    @property
    def keys(self) -> list[tuple[bool, int, int]]:
        return sorted(self._graphs)

    def _static(self, batch: int, frames: int) -> _Graph:
        device, dtype, bins = self.device, self.dtype, self.cfm.mel_bins

        def zeros(*shape: int) -> Tensor:
            return torch.zeros(*shape, device=device, dtype=dtype)

        return _Graph(
            graph=None,
            x=self.cfm.start(batch, frames, dtype).contiguous(),
            mu=zeros(2 * batch, bins, frames),
            mask=zeros(2 * batch, 1, frames),
            spks=zeros(2 * batch, bins),
            cond=zeros(2 * batch, bins, frames),
        )

    def _solve(self, g: _Graph, streaming: bool, steps: int | None = None) -> Tensor:
        return self.cfm.solve(
            g.x, g.mu, g.mask, g.spks, g.cond, steps or self.n_timesteps, streaming, self.captured_estimator
        )

    @torch.inference_mode()
    def capture(self) -> CaptureReport:
        """Capture every (streaming, batch, bucket) graph, smallest first (the first chunks of streams), until
        the pool has grown past the memory limit."""
        keys = [
            (streaming, batch, frames)
            for frames in self.config.buckets
            for batch in self.config.batch_sizes
            for streaming in self.config.streaming
        ]

        def capture_key(key: tuple[bool, int, int], pool: tuple) -> None:
            streaming, batch, frames = key
            g = self._static(batch, frames)
            g.mask.fill_(1)
            g.graph, g.out = capture_graph(
                lambda: self._solve(g, streaming),
                self.device,
                pool,
                warm_up=lambda: self._solve(g, streaming, min(WARM_UP_STEPS, self.n_timesteps)),
            )
            self._graphs[key] = g

        ordered = sorted(keys, key=lambda k: (k[1] * k[2], k))
        return capture_within_limit(ordered, capture_key, self.device, self.config.memory_limit_mib, "flow")

    def __call__(
        self, mu: Tensor, mask: Tensor, spks: Tensor, cond: Tensor, n_timesteps: int, streaming: bool = False
    ) -> Tensor:
        """As `CausalCFM.forward`: mu, cond [B, 80, T]; mask [B, 1, T]; spks [B, 80] → mel [B, 80, T] fp32."""
        batch, _, frames = mu.shape
        bucket = self.config.bucket(frames)
        key = (streaming, batch, bucket)
        if n_timesteps != self.n_timesteps or bucket is None or batch not in self.config.batch_sizes:
            self.calls["eager"] += 1
            return self.cfm(mu, mask, spks, cond, n_timesteps, streaming)
        pad = bucket - frames
        mu_in, mask_in, spks_in, cond_in = self.cfm.guided_inputs(
            F.pad(mu, (0, pad)), F.pad(mask, (0, pad)), spks, F.pad(cond, (0, pad))
        )
        g = self._graphs.get(key)
        if g is None:  # no graph for it (CPU, or over the memory limit): the same padded call, eagerly
            self.calls["padded"] += 1
            x = self.cfm.start(batch, bucket, mu_in.dtype)
            out = self.cfm.solve(x, mu_in, mask_in, spks_in, cond_in, n_timesteps, streaming)
            return out[:, :, :frames]
        self.calls["graph"] += 1
        g.mu.copy_(mu_in)
        g.mask.copy_(mask_in)
        g.spks.copy_(spks_in)
        g.cond.copy_(cond_in)
        g.graph.replay()
        return g.out[:, :, :frames].clone()

    def run_rows(
        self, rows: Sequence[tuple[Tensor, Tensor, Tensor]], n_timesteps: int, streaming: bool
    ) -> list[Tensor]:
        """Several calls (mu, spks, cond of batch 1, any lengths) as few batched calls: shortest first, up to
        the largest captured batch each, padded to the longest of the batch (mask 0) and, in rows, to the next
        captured batch size (rows of zeros, mask 1). Returns each call's mel [1, 80, T] fp32, in order."""
        order = sorted(range(len(rows)), key=lambda i: rows[i][0].size(2))
        widest = max(self.config.batch_sizes)
        mels: list[Tensor | None] = [None] * len(rows)
        for start in range(0, len(order), widest):
            picked = order[start : start + widest]
            longest = max(rows[i][0].size(2) for i in picked)
            frames = self.config.bucket(longest) or longest  # padded once, here
            batch = self.config.batch_for(len(picked)) or len(picked)
            first = rows[picked[0]][0]
            mu = first.new_zeros(batch, first.size(1), frames)
            cond = torch.zeros_like(mu)
            mask = first.new_ones(batch, 1, frames)
            spks = rows[picked[0]][1].new_zeros(batch, rows[picked[0]][1].size(1))
            for row, i in enumerate(picked):
                row_mu, row_spks, row_cond = rows[i]
                length = row_mu.size(2)
                mu[row, :, :length], cond[row, :, :length], spks[row] = row_mu[0], row_cond[0], row_spks[0]
                mask[row, :, length:] = 0
            out = self(mu, mask, spks, cond, n_timesteps, streaming)
            for row, i in enumerate(picked):
                mels[i] = out[row : row + 1, :, : rows[i][0].size(2)]
        return mels
