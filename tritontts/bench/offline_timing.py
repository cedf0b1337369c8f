"""Timing a stage on a device: its queue drained before and after, and the device's name for the report."""

from __future__ import annotations

import platform
import time
from collections.abc import Callable

import torch


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


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine() or "cpu"
