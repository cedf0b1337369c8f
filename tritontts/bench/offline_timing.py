"""Timing a stage on a device: its queue drained before and after, and the device's name for the report."""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable

import torch

CUDA = torch.device("cuda")


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device: torch.device, fn: Callable, *args):
    """`fn(*args)` and its seconds, the device synchronized on both sides."""
    synchronize(device)
    start = time.perf_counter()
    out = fn(*args)
    synchronize(device)
    return out, time.perf_counter() - start


def median_ms(
    call: Callable[[], object],
    reps: int,
    device: torch.device = CUDA,
    *,
    warmup: int = 3,
    setup: Callable[[], object] | None = None,
) -> float:
    """The median milliseconds of `reps` calls after `warmup` untimed ones, `setup()` untimed before each."""
    times = []
    for rep in range(warmup + reps):
        if setup is not None:
            setup()
        _, seconds = timed(device, call)
        if rep >= warmup:
            times.append(1000 * seconds)
    return statistics.median(times)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine() or "cpu"
