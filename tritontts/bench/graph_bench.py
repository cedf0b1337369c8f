"""What the token2wav graph benches share: a CPU stand-in for `tritontts.cuda_graphs.capture_graph`, so that their
dry checks run the bucketed encoder's replay path without CUDA, and the graphed path's distance from the eager one."""

from __future__ import annotations

from collections.abc import Callable

import torch


class EagerReplay:
    """A captured CUDA graph's stand-in: `replay()` runs the call again into the captured output."""

    def __init__(self, run: Callable[[], torch.Tensor]) -> None:
        self.run = run
        self.out = run()

    def replay(self) -> None:
        self.out.copy_(self.run())


def capture_eagerly(
    run: Callable[[], torch.Tensor], device: torch.device, pool: tuple, warm_up: Callable | None = None
) -> tuple[EagerReplay, torch.Tensor]:
    graph = EagerReplay(run)
    return graph, graph.out


def max_diff(graphed: torch.Tensor, eager: torch.Tensor) -> float:
    """The largest absolute difference; shapes must agree (a padded call that returned its padding would not)."""
    if graphed.shape != eager.shape:
        raise RuntimeError(
            f"graphed and eager shapes differ: {tuple(graphed.shape)} and {tuple(eager.shape)}"
        )
    return float((graphed.float() - eager.float()).abs().max())
