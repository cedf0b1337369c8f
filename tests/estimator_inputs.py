"""One call's inputs for the CosyVoice2 flow estimator, for tests that compare two paths of it."""

from __future__ import annotations

import torch


def estimator_inputs(mel: int, frames: int = 50, seed: int = 1) -> tuple[torch.Tensor, ...]:
    """(x, mask, mu, t, spks, cond) for a batch of 2, the second row padded after 40 frames: the estimator's
    positional arguments before `streaming`."""
    gen = torch.Generator().manual_seed(seed)
    x, mu, cond = (torch.randn(2, mel, frames, generator=gen) for _ in range(3))
    spks, t = torch.randn(2, mel, generator=gen), torch.rand(2, generator=gen)
    mask = torch.ones(2, 1, frames)
    mask[1, :, 40:] = 0
    return x, mask, mu, t, spks, cond
