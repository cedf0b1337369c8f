"""CausalConditionalCFM at inference: Euler steps of a conditional flow from fixed noise to mel."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from tritontts.cosyvoice2.config import CFMConfig
from tritontts.cosyvoice2.flow.estimator import Estimator
from tritontts.cosyvoice2.flow.prefix import LayerPrefix, PrefixRun

NOISE_SEED = 0
NOISE_FRAMES = 50 * 300  # 300 s of mel at 50 frames/s


def fixed_noise(mel_bins: int, frames: int = NOISE_FRAMES, seed: int = NOISE_SEED) -> Tensor:
    """The reference's noise: `torch.manual_seed(0); torch.randn(1, mel_bins, frames)` on the CPU."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn(1, mel_bins, frames, generator=generator, device="cpu")


def time_schedule(n_timesteps: int, scheduler: str, device: torch.device, dtype: torch.dtype) -> Tensor:
    """[n_timesteps + 1] times from 0 to 1; `cosine` bunches them near 0 (1 - cos(t * pi / 2))."""
    t = torch.linspace(0, 1, n_timesteps + 1, device=device, dtype=dtype)
    return 1 - torch.cos(t * 0.5 * math.pi) if scheduler == "cosine" else t


class CausalCFM(nn.Module):
    def __init__(self, config: CFMConfig, estimator: Estimator, mel_bins: int):
        super().__init__()
        self.config = config
        self.mel_bins = mel_bins
        self.estimator = estimator
        self.register_buffer("rand_noise", fixed_noise(mel_bins), persistent=False)

    def reset_noise(self) -> None:
        """Refill the noise buffer (after `to_empty`), keeping its device and dtype."""
        noise = fixed_noise(self.mel_bins)
        self.rand_noise = noise.to(device=self.rand_noise.device, dtype=self.rand_noise.dtype)

    def guided_inputs(
        self, mu: Tensor, mask: Tensor, spks: Tensor, cond: Tensor
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The estimator's batch of 2B: the B conditioned rows, then the B unconditioned ones (mu, spks,
        cond = 0); in the speaker embedding's dtype."""
        dtype = spks.dtype
        mask_in = torch.cat([mask, mask]).to(dtype)
        mu_in = torch.cat([mu, torch.zeros_like(mu)]).to(dtype)
        spks_in = torch.cat([spks, torch.zeros_like(spks)])
        cond_in = torch.cat([cond, torch.zeros_like(cond)]).to(dtype)
        return mu_in, mask_in, spks_in, cond_in

    def start(
        self, batch: int, frames: int, dtype: torch.dtype, temperature: float = 1.0, offset: int = 0
    ) -> Tensor:
        """[batch, 80, frames]: every row starts from the fixed noise's frames from `offset` on."""
        if offset + frames > self.rand_noise.size(2):
            raise ValueError(
                f"{offset + frames} mel frames exceed the fixed noise ({self.rand_noise.size(2)} frames)"
            )
        x = self.rand_noise[:, :, offset : offset + frames].to(dtype) * temperature
        return x.expand(batch, -1, -1)

    def solve(
        self,
        x: Tensor,
        mu_in: Tensor,
        mask_in: Tensor,
        spks_in: Tensor,
        cond_in: Tensor,
        n_timesteps: int,
        streaming: bool = False,
        estimator: Callable[..., Tensor] | None = None,
    ) -> Tensor:
        """The Euler loop from x [B, 80, T] over the guided inputs [2B, ...] → mel [B, 80, T] fp32.

        Each step runs the estimator (`estimator`: another callable of the same weights, e.g. compiled) on the conditioned and unconditioned rows as one batch and mixes
        them: (1 + r) * v_cond - r * v_uncond. Only tensor operations: a CUDA graph can capture it whole.
        """
        dtype = spks_in.dtype
        t_span = time_schedule(n_timesteps, self.config.t_scheduler, mu_in.device, mu_in.dtype)
        rate = self.config.inference_cfg_rate
        t, dt = t_span[:1], t_span[1] - t_span[0]
        for step in range(1, len(t_span)):
            x_in = torch.cat([x, x]).to(dtype)
            velocity = (self.estimator if estimator is None else estimator)(
                x_in, mask_in, mu_in, t.expand(x_in.size(0)).to(dtype), spks_in, cond_in, streaming
            )
            conditioned, unconditioned = velocity.chunk(2)
            x = x + dt * ((1.0 + rate) * conditioned - rate * unconditioned)
            t = t + dt
            if step < len(t_span) - 1:
                dt = t_span[step + 1] - t
        return x.float()

    def solve_after(
        self,
        prefixes: Sequence[LayerPrefix] | None,
        mu: Tensor,
        spks: Tensor,
        cond: Tensor,
        n_timesteps: int,
        keep: int | None = None,
        mask: Tensor | None = None,
    ) -> tuple[Tensor, list[LayerPrefix] | None]:
        """The Euler loop over frames that follow `prefixes` (one per step, as a call over the frames before
        these recorded them; None: from frame 0), streaming: mu, cond [B, 80, T], spks [B, 80], `mask` [B, 1, T]
        (1 on each row's frames, 0 on the padding after them; None: all 1) → (mel [B, 80, T] fp32, with `keep`,
        at most the shortest row: the prefixes after the first `keep` of these frames)."""
        if prefixes is not None and len(prefixes) != n_timesteps:
            raise ValueError(f"need one prefix per step ({n_timesteps}), got {len(prefixes)}")
        offset = 0 if prefixes is None else prefixes[0].frames
        mask = torch.ones_like(mu[:, :1]) if mask is None else mask.to(mu.dtype)
        runs: list[PrefixRun] = []

        def estimate(*inputs: Tensor | bool) -> Tensor:
            run = PrefixRun(None if prefixes is None else prefixes[len(runs)], keep)
            runs.append(run)
            return self.estimator(*inputs, run=run)

        x = self.start(mu.size(0), mu.size(2), mu.dtype, offset=offset)
        mel = self.solve(x, *self.guided_inputs(mu, mask, spks, cond), n_timesteps, True, estimate)
        return mel, [run.recorded() for run in runs] if keep is not None else None

    def forward(
        self,
        mu: Tensor,
        mask: Tensor,
        spks: Tensor,
        cond: Tensor,
        n_timesteps: int,
        streaming: bool = False,
        temperature: float = 1.0,
    ) -> Tensor:
        """mu, cond [B, 80, T]; mask [B, 1, T]; spks [B, 80] → mel [B, 80, T] fp32 (eager)."""
        x = self.start(mu.size(0), mu.size(2), mu.dtype, temperature)
        return self.solve(x, *self.guided_inputs(mu, mask, spks, cond), n_timesteps, streaming)
