"""The DiT flow's whole Euler loop replayed from CUDA graphs: a streamed chunk from the graph of (batch, padded
chunk frames, padded cache frames), an offline call from the graph of (batch, padded frames).

A call pads its new frames, and a chunk the key frames of its estimator cache, up to the smallest buckets that
hold them. `FramePadding` masks the padded keys out of attention and takes the convolution caches from the last
valid frames; every other op of the DiT works frame by frame and there are no positions, so the valid frames
come out as without padding. The call copies its inputs into the graph's static buffers, replays it and copies
out the valid frames: the mel and, for a chunk, the new cache = the chunk's own entries (its valid frames)
before the cache it was given (that tensor, not the padded copy). Several streams' calls can run as one batch
(`run`); rows of zeros fill it up to a captured batch size. Calls that fit no bucket, other step counts and
other batch shapes run as `DiTCFM` does; without a graph (CPU, or over the memory limit) the padded call runs
eagerly. With the config's `compile`, the graphs hold the estimator as torch.compile made it (sizes dynamic);
calls that run without a graph keep the plain one. Graphs share one memory pool, the padded cache input is one
buffer per batch size (the largest cache bucket; smaller buckets read its first frames), and the keys ‖ values
output one per batch size and chunk bucket; `capture` goes from the fewest frames up and stops adding graphs once
they pass `memory_limit_mib`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace

import torch
from torch import Tensor

from tritontts.cuda_graphs import (
    CaptureReport,
    FlowGraphConfig,
    bucket_for,
    capture_graph,
    capture_within_limit,
    check_buckets,
)
from tritontts.dit_token2wav.cfm import DiTCFM, EstimatorCache, KeyWindow
from tritontts.dit_token2wav.dit import frame_padding

DEFAULT_CHUNK_BUCKETS = (64, 128, 256)
DEFAULT_CACHE_BUCKETS = (128, 256, 384, 512, 768, 1024)

GraphKey = tuple[bool, int, int, int]
"""(streaming, batch, padded frames, padded cache frames; 0 offline)"""


@dataclass(frozen=True)
class DiTFlowGraphConfig(FlowGraphConfig):
    """`FlowGraphConfig` (`buckets`: offline calls' padded frames, prompt included; `streaming`: which of the
    offline (False) and chunk (True) graphs to capture) with the buckets of streamed chunks."""

    chunk_buckets: tuple[int, ...] = DEFAULT_CHUNK_BUCKETS
    """Padded counts of a chunk's new mel frames (a 25-token chunk has 50)."""
    cache_buckets: tuple[int, ...] = DEFAULT_CACHE_BUCKETS
    """Padded counts of the cached key frames a chunk attends to (the prompt's and at most 100 more)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_buckets("chunk_buckets", self.chunk_buckets)
        check_buckets("cache_buckets", self.cache_buckets)

    @classmethod
    def of(cls, config: FlowGraphConfig | None) -> DiTFlowGraphConfig:
        """`config` as it is, or a plain FlowGraphConfig with the default chunk and cache buckets."""
        if isinstance(config, cls):
            return config
        if config is None:
            return cls()
        return cls(**{f.name: getattr(config, f.name) for f in fields(FlowGraphConfig)})


@dataclass(frozen=True)
class FlowRow:
    """One call of batch 1: mu, cond [1, 80, T]; spks [1, 80]; a chunk's estimator cache before it (None:
    empty); an offline call's start `noise` [1, 80, T] (None: the fixed noise)."""

    mu: Tensor
    spks: Tensor
    cond: Tensor
    cache: EstimatorCache | None = None
    noise: Tensor | None = None
    keep: KeyWindow | None = None
    """a chunk's key frames kept in the cache after it (None: all)"""

    @property
    def frames(self) -> int:
        return self.mu.size(2)

    @property
    def cache_frames(self) -> int:
        return 0 if self.cache is None else self.cache.frames


@dataclass
class _Inputs:
    """A padded call's inputs: B rows of T frames (over C cache frames); `entries` receives the keys ‖ values."""

    x: Tensor
    mu: Tensor
    spks: Tensor
    cond: Tensor
    frames: Tensor
    """int64 [B] valid frames per row"""
    cache_frames: Tensor
    """int64 [B] valid cache frames per row (zeros offline)"""
    cache: EstimatorCache | None = None
    entries: Tensor | None = None


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    inputs: _Inputs
    out: tuple[Tensor, EstimatorCache | None]


class GraphedDiTCFM:
    """Runs `cfm` like `DiTCFM.forward` / `forward_chunk`, from captured graphs where buckets fit."""

    def __init__(self, cfm: DiTCFM, n_timesteps: int, config: FlowGraphConfig | None = None) -> None:
        self.cfm = cfm
        self.n_timesteps = n_timesteps
        self.config = DiTFlowGraphConfig.of(config)
        self.device = cfm.rand_noise.device
        self.dtype = next(cfm.estimator.parameters()).dtype
        self._graphs: dict[GraphKey, _Graph] = {}
        self._shared: dict[tuple, Tensor] = {}
        self._lock = threading.Lock()
        self.captured_estimator = torch.compile(cfm.estimator, dynamic=True) if self.config.compile else None
        self.calls = {"graph": 0, "padded": 0, "eager": 0}

    @property
    def keys(self) -> list[GraphKey]:
        return sorted(self._graphs)

    def __call__(
        self, mu: Tensor, spks: Tensor, cond: Tensor, n_timesteps: int = 10, noise: Tensor | None = None
    ) -> Tensor:
        """As `DiTCFM.forward`."""
        mel, _ = self.run([FlowRow(mu, spks, cond, noise=noise)], n_timesteps, streaming=False)[0]
        return mel

    def forward_chunk(
        self,
        mu: Tensor,
        spks: Tensor,
        cond: Tensor,
        n_timesteps: int = 10,
        cache: EstimatorCache | None = None,
        keep: KeyWindow | None = None,
    ) -> tuple[Tensor, EstimatorCache]:
        """As `DiTCFM.forward_chunk`."""
        return self.run([FlowRow(mu, spks, cond, cache, keep=keep)], n_timesteps, streaming=True)[0]

    @torch.inference_mode()
    def run(
        self, rows: Sequence[FlowRow], n_timesteps: int, streaming: bool
    ) -> list[tuple[Tensor, EstimatorCache | None]]:
        """Each row's (mel [1, 80, T], the cache after the chunk or None offline), as `DiTCFM` makes them.

        Rows that fit the buckets run in batched calls of up to the largest configured batch size, rows of
        similar cache and chunk lengths together; the others run eagerly, one by one."""
        if streaming:
            rows = [replace(r, cache=self.cfm.checked_cache(r.cache, r.mu, n_timesteps)) for r in rows]
        results: list[tuple[Tensor, EstimatorCache | None] | None] = [None] * len(rows)
        fitting = []
        for index, row in enumerate(rows):
            if n_timesteps == self.n_timesteps and self._fits(row, streaming):
                fitting.append(index)
            else:
                self.calls["eager"] += 1
                results[index] = self._eager(row, n_timesteps, streaming)
        fitting.sort(key=lambda i: (rows[i].cache_frames, rows[i].frames))
        widest = max(self.config.batch_sizes)
        for start in range(0, len(fitting), widest):
            picked = fitting[start : start + widest]
            for index, result in zip(picked, self._padded([rows[i] for i in picked], streaming)):
                results[index] = result
        return results

    def _fits(self, row: FlowRow, streaming: bool) -> bool:
        if row.mu.size(0) != 1 or streaming not in self.config.streaming:
            return False
        if not streaming:
            return self.config.bucket(row.frames) is not None
        return (
            bucket_for(self.config.chunk_buckets, row.frames) is not None
            and bucket_for(self.config.cache_buckets, row.cache_frames) is not None
        )

    def _eager(self, row: FlowRow, n_timesteps: int, streaming: bool) -> tuple[Tensor, EstimatorCache | None]:
        if streaming:
            return self.cfm.forward_chunk(row.mu, row.spks, row.cond, n_timesteps, row.cache, row.keep)
        return self.cfm(row.mu, row.spks, row.cond, n_timesteps, row.noise), None

    def _key(self, rows: Sequence[FlowRow], streaming: bool) -> GraphKey:
        batch = next(b for b in sorted(self.config.batch_sizes) if b >= len(rows))
        frames = max(r.frames for r in rows)
        if not streaming:
            return False, batch, self.config.bucket(frames), 0
        cache_frames = max(r.cache_frames for r in rows)
        return (
            True,
            batch,
            bucket_for(self.config.chunk_buckets, frames),
            bucket_for(self.config.cache_buckets, cache_frames),
        )

    def _padded(self, rows: Sequence[FlowRow], streaming: bool) -> list[tuple[Tensor, EstimatorCache | None]]:
        key = self._key(rows, streaming)
        g = self._graphs.get(key)
        if g is None:
            self.calls["padded"] += 1
            inputs = self._inputs(key, shared=False)
            self._fill(inputs, rows)
            return self._unpack(self._solve(inputs), rows)
        with self._lock:
            self.calls["graph"] += 1
            self._fill(g.inputs, rows)
            g.graph.replay()
            return self._unpack(g.out, rows)

    def _buffer(self, name: str, shape: tuple[int, ...], shared: bool, *key: int) -> Tensor:
        """Zeros of `shape`; with `shared`, the one buffer under (name, *key)."""
        if not shared:
            return torch.zeros(shape, device=self.device, dtype=self.dtype)
        if (name, *key) not in self._shared:
            self._shared[(name, *key)] = torch.zeros(shape, device=self.device, dtype=self.dtype)
        return self._shared[(name, *key)]

    def _inputs(self, key: GraphKey, shared: bool) -> _Inputs:
        streaming, batch, frames, cache_frames = key
        bins = self.cfm.mel_bins

        def zeros(*shape: int, dtype: torch.dtype | None = None) -> Tensor:
            return torch.zeros(shape, device=self.device, dtype=dtype or self.dtype)

        inputs = _Inputs(
            x=zeros(batch, bins, frames),
            mu=zeros(batch, bins, frames),
            spks=zeros(batch, bins),
            cond=zeros(batch, bins, frames),
            frames=zeros(batch, dtype=torch.long),
            cache_frames=zeros(batch, dtype=torch.long),
        )
        if not streaming:
            return inputs
        dit = self.cfm.estimator.config
        steps, rows = self.n_timesteps, 2 * batch
        widest = max(self.config.cache_buckets) if shared else cache_frames
        att = self._buffer(
            "att", (steps, dit.depth, rows, dit.num_heads, widest, 2 * dit.head_dim), shared, batch
        )
        cnn = self._buffer("cnn", (steps, dit.depth, rows, 2 * dit.hidden_size, 2), shared, batch)
        inputs.cache = EstimatorCache(cnn, att[:, :, :, :, :cache_frames])
        if shared:
            entries = (steps, dit.depth, rows, dit.num_heads, frames, 2 * dit.head_dim)
            inputs.entries = self._buffer("entries", entries, shared, batch, frames)
        return inputs

    def _fill(self, inputs: _Inputs, rows: Sequence[FlowRow]) -> None:
        batch, _, padded = inputs.mu.shape
        for i in range(batch):
            if i >= len(rows):  # a row of zeros, all its frames valid
                for t in (inputs.x, inputs.mu, inputs.spks, inputs.cond):
                    t[i].zero_()
                inputs.frames[i].fill_(padded)
                inputs.cache_frames[i].fill_(0)
                continue
            row = rows[i]
            frames = row.frames
            start = (
                row.noise if row.noise is not None else self.cfm.noise(row.cache_frames, frames, self.dtype)
            )
            for t, value in ((inputs.x, start), (inputs.mu, row.mu), (inputs.cond, row.cond)):
                t[i, :, :frames].copy_(value[0])
                t[i, :, frames:].zero_()
            inputs.spks[i].copy_(row.spks[0])
            inputs.frames[i].fill_(frames)
            inputs.cache_frames[i].fill_(row.cache_frames)
            if inputs.cache is not None:
                inputs.cache.cnn[:, :, i::batch].copy_(row.cache.cnn)
                inputs.cache.att[:, :, i::batch, :, : row.cache_frames].copy_(row.cache.att)

    def _solve(
        self, inputs: _Inputs, estimator: Callable[..., tuple] | None = None
    ) -> tuple[Tensor, EstimatorCache | None]:
        frames = torch.cat([inputs.frames, inputs.frames])
        if inputs.cache is None:
            padding = frame_padding(frames, inputs.mu.size(2))
        else:
            cache_frames = torch.cat([inputs.cache_frames, inputs.cache_frames])
            padding = frame_padding(frames, inputs.mu.size(2), cache_frames, inputs.cache.frames)
        return self.cfm.solve(
            inputs.x,
            inputs.mu,
            inputs.spks,
            inputs.cond,
            self.n_timesteps,
            inputs.cache,
            padding,
            inputs.entries,
            estimator,
        )

    @staticmethod
    def _unpack(
        out: tuple[Tensor, EstimatorCache | None], rows: Sequence[FlowRow]
    ) -> list[tuple[Tensor, EstimatorCache | None]]:
        mel, entries = out
        batch = mel.size(0)
        results = []
        for i, row in enumerate(rows):
            row_mel = mel[i : i + 1, :, : row.frames].clone()
            if entries is None:
                results.append((row_mel, None))
                continue
            own = EstimatorCache(
                entries.cnn[:, :, i::batch].clone(), entries.att[:, :, i::batch, :, : row.frames]
            )
            results.append((row_mel, row.cache.extended(own, row.keep)))
        return results

    @torch.inference_mode()
    def capture(self) -> CaptureReport:
        """Capture every configured graph, fewest frames first (a stream's chunks before long offline calls),
        until the memory they take has grown past the limit."""
        config = self.config
        keys: list[GraphKey] = []
        for batch in config.batch_sizes:
            if True in config.streaming:
                keys += [
                    (True, batch, frames, cache_frames)
                    for frames in config.chunk_buckets
                    for cache_frames in config.cache_buckets
                ]
            if False in config.streaming:
                keys += [(False, batch, frames, 0) for frames in config.buckets]

        def capture_key(key: GraphKey, pool: tuple) -> None:
            inputs = self._inputs(key, shared=True)
            inputs.frames.fill_(key[2])
            inputs.cache_frames.fill_(key[3])
            graph, out = capture_graph(
                lambda: self._solve(inputs, self.captured_estimator), self.device, pool
            )
            self._graphs[key] = _Graph(graph, inputs, out)

        ordered = sorted(keys, key=lambda k: (k[1] * k[2], k[3], not k[0], k))
        return capture_within_limit(ordered, capture_key, self.device, config.memory_limit_mib, "DiT flow")
