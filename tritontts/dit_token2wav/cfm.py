"""CausalConditionalCFM of the DiT flow: Euler steps over a cosine schedule with classifier-free guidance.

Each step runs the estimator on a batch of 2, the conditioned input and the unconditioned one (mu, speaker
and cond zeroed), and moves x by dt * ((1 + r) v_cond - r v_uncond). The starting noise comes from a fixed
buffer of 600 s of mel: a chunk starts at the buffer offset equal to the frames its estimator cache holds,
as upstream does. Upstream fills that buffer from torch's global RNG when the module is built (so it is
whatever the process's RNG state was); ours is the seed-0 draw, the same in every process.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from tritontts.cosyvoice2.flow.cfm import fixed_noise, time_schedule
from tritontts.dit_token2wav.dit import DiT, DiTCache, FramePadding

NOISE_FRAMES = 50 * 600
SCHEDULER = "cosine"


KeyWindow = tuple[int, int]
"""(head, tail): a stream keeps the first `head` and the last `tail` key frames of its estimator cache."""


def frames_between(parts: list[Tensor], start: int, end: int) -> list[Tensor]:
    """Views of key frames [start, end) of `parts` laid end to end along the frame axis (4)."""
    views, offset = [], 0
    for part in parts:
        length = part.shape[4]
        low, high = max(start - offset, 0), min(end - offset, length)
        if low < high:
            views.append(part[:, :, :, :, low:high])
        offset += length
    return views


def kept_frames(parts: list[Tensor], keep: KeyWindow | None) -> list[Tensor]:
    """The views of `parts` (end to end) that `keep` leaves: all of them while they hold at most head + tail
    frames, else the first head and the last tail."""
    total = sum(part.shape[4] for part in parts)
    if keep is None or total <= sum(keep):
        return parts
    head, tail = keep
    return frames_between(parts, 0, head) + frames_between(parts, total - tail, total)


@dataclass(frozen=True)
class EstimatorCache:
    """One DiT cache per Euler step, stacked: what the next chunk's step i attends to."""

    cnn: Tensor
    """[steps, depth, 2B, 2 * hidden, 2]"""
    att: Tensor
    """[steps, depth, 2B, heads, T, 2 * head_dim]"""

    @property
    def frames(self) -> int:
        return self.att.shape[4]

    def trimmed(self, head: int, tail: int) -> EstimatorCache:
        """Keep the first `head` and the last `tail` key frames once there are more than head + tail."""
        if self.frames <= head + tail:
            return self
        return EstimatorCache(self.cnn, torch.cat(kept_frames([self.att], (head, tail)), dim=4))

    def extended(self, chunk: EstimatorCache, keep: KeyWindow | None = None) -> EstimatorCache:
        """The cache after a chunk whose own entries are `chunk`: its convolution inputs, its keys first; with
        `keep`, trimmed as `trimmed(*keep)` in the same copy (one allocation of the kept frames, not two)."""
        return EstimatorCache(chunk.cnn, torch.cat(kept_frames([chunk.att, self.att], keep), dim=4))


class DiTCFM(nn.Module):
    def __init__(self, estimator: DiT, inference_cfg_rate: float = 0.7) -> None:
        super().__init__()
        self.estimator = estimator
        self.inference_cfg_rate = inference_cfg_rate
        self.mel_bins = estimator.config.out_channels
        self.register_buffer("rand_noise", fixed_noise(self.mel_bins, NOISE_FRAMES), persistent=False)

    def reset_noise(self) -> None:
        """Refill the noise buffer (after `to_empty`), keeping its device and dtype."""
        noise = fixed_noise(self.mel_bins, NOISE_FRAMES)
        self.rand_noise = noise.to(device=self.rand_noise.device, dtype=self.rand_noise.dtype)

    def noise(self, offset: int, frames: int, dtype: torch.dtype) -> Tensor:
        """[1, 80, frames] of the fixed noise from frame `offset` on."""
        if offset + frames > self.rand_noise.size(2):
            raise ValueError(
                f"{offset + frames} mel frames exceed the fixed noise ({self.rand_noise.size(2)} frames)"
            )
        return self.rand_noise[:, :, offset : offset + frames].to(dtype)

    def solve(
        self,
        x: Tensor,
        mu: Tensor,
        spks: Tensor,
        cond: Tensor,
        n_timesteps: int,
        cache: EstimatorCache | None = None,
        padding: FramePadding | None = None,
        entries_out: Tensor | None = None,
        estimator: Callable[..., tuple[Tensor, DiTCache | None]] | None = None,
    ) -> tuple[Tensor, EstimatorCache | None]:
        """The Euler loop from x [B, 80, T] → (mel [B, 80, T] in x's dtype, this chunk's own cache entries:
        each step's convolution inputs after it and its keys ‖ values [steps, depth, 2B, heads, T, 2 head_dim];
        None without `cache`).

        `padding` (2B rows, the conditioned then the unconditioned ones) marks a right-padded call's valid
        frames; `entries_out` is where to put the keys ‖ values; `estimator` runs in place of the module's
        own (the compiled one the graphs capture). Only tensor operations: a CUDA graph can capture it whole."""
        estimator = self.estimator if estimator is None else estimator
        t_span = time_schedule(n_timesteps, SCHEDULER, mu.device, mu.dtype)
        rate = self.inference_cfg_rate
        mu_in = torch.cat([mu, torch.zeros_like(mu)])
        spks_in = torch.cat([spks, torch.zeros_like(spks)])
        cond_in = torch.cat([cond, torch.zeros_like(cond)])
        t, dt = t_span[0], t_span[1] - t_span[0]
        new_caches = []
        for step in range(1, n_timesteps + 1):
            step_cache = None if cache is None else DiTCache(cache.cnn[step - 1], cache.att[step - 1])
            t_in = t.expand(2 * x.size(0)).to(x.dtype)
            velocity, step_cache = estimator(
                torch.cat([x, x]), mu_in, t_in, spks_in, cond_in, step_cache, padding
            )
            conditioned, unconditioned = velocity.chunk(2)
            x = x + dt * ((1.0 + rate) * conditioned - rate * unconditioned)
            t = t + dt
            if step < n_timesteps:
                dt = t_span[step + 1] - t
            new_caches.append(step_cache)
        if cache is None:
            return x, None
        cnn = torch.stack([c.cnn for c in new_caches])
        att = torch.stack([c.att for c in new_caches], out=entries_out)
        return x, EstimatorCache(cnn, att)

    def forward(
        self, mu: Tensor, spks: Tensor, cond: Tensor, n_timesteps: int = 10, noise: Tensor | None = None
    ) -> Tensor:
        """mu, cond [1, 80, T]; spks [1, 80] → mel [1, 80, T] in mu's dtype, over the whole utterance.

        The start is `noise` [1, 80, T] when given (upstream draws it from the global RNG per call),
        else the first T frames of the fixed buffer."""
        x = (noise if noise is not None else self.noise(0, mu.size(2), mu.dtype)).to(mu.device, mu.dtype)
        x, _ = self.solve(x, mu, spks, cond, n_timesteps)
        return x

    def forward_chunk(
        self,
        mu: Tensor,
        spks: Tensor,
        cond: Tensor,
        n_timesteps: int = 10,
        cache: EstimatorCache | None = None,
        keep: KeyWindow | None = None,
    ) -> tuple[Tensor, EstimatorCache]:
        """mu, cond [1, 80, T] of the frames after the cached ones → (mel [1, 80, T], the cache after them,
        its keys cut to `keep`)."""
        cache = self.checked_cache(cache, mu, n_timesteps)
        x = self.noise(cache.frames, mu.size(2), mu.dtype)
        x, entries = self.solve(x, mu, spks, cond, n_timesteps, cache)
        return x, cache.extended(entries, keep)

    def checked_cache(self, cache: EstimatorCache | None, mu: Tensor, n_timesteps: int) -> EstimatorCache:
        """`cache`, or the empty one (no frame yet) for None, once it has one entry per step."""
        if cache is None:
            empty = self.estimator.empty_cache(2 * mu.size(0), mu.device, mu.dtype)
            cache = EstimatorCache(
                empty.cnn.expand(n_timesteps, *empty.cnn.shape),
                empty.att.expand(n_timesteps, *empty.att.shape),
            )
        if cache.cnn.size(0) != n_timesteps:
            raise ValueError(f"the estimator cache holds {cache.cnn.size(0)} steps, not {n_timesteps}")
        return cache
