"""Kernels per call of a function, as torch.profiler sees them: on CUDA the GPU kernels (those a replayed CUDA
graph runs included), on the CPU the aten operators (nested ones included). The token2wav benches report it per
chunk, so a change that fuses kernels shows as a smaller count beside its time."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile


def kernels_per_call(
    call: Callable[[], object],
    device: torch.device,
    calls: int = 3,
    top: int = 15,
    setup: Callable[[], object] | None = None,
) -> dict:
    """`call` `calls` times, each alone under the profiler (`setup` before each, outside it): the mean count
    and device time per call, and the `top` kernels by time."""
    cuda = device.type == "cuda"
    kind = "CUDA" if cuda else "CPU"
    counts: Counter[str] = Counter()
    micros: Counter[str] = Counter()
    for _ in range(calls):
        if setup is not None:
            setup()
        if cuda:
            torch.cuda.synchronize(device)
        with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
            call()
            if cuda:
                torch.cuda.synchronize(device)
        for event in prof.key_averages():
            if event.device_type.name != kind:
                continue
            counts[event.key] += event.count
            micros[event.key] += event.self_device_time_total if cuda else event.self_cpu_time_total
    ranked = sorted(counts, key=lambda name: -micros[name])[:top]
    return {
        "unit": "CUDA kernels" if cuda else "CPU operators",
        "calls": calls,
        "per_call": round(sum(counts.values()) / calls, 1),
        "ms_per_call": round(sum(micros.values()) / calls / 1e3, 3),
        "top": [
            {
                "name": name[:120],
                "per_call": round(counts[name] / calls, 1),
                "us_per_call": round(micros[name] / calls, 1),
            }
            for name in ranked
        ],
    }
