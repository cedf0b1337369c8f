"""What the flows' CUDA-graph runners share: their configuration (and the deployment parameters that make one),
bucket lists, one capture, and capturing many graphs into one memory pool until the memory they add passes a limit."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import torch

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


def check_buckets(name: str, buckets: Sequence[int]) -> None:
    if not buckets or list(buckets) != sorted(set(buckets)) or buckets[0] <= 0:
        raise ValueError(f"{name} must be positive and ascending, got {tuple(buckets)}")


def bucket_for(buckets: Sequence[int], size: int) -> int | None:
    """The smallest bucket that holds `size`, or None past the largest."""
    return next((b for b in buckets if b >= size), None)


def require_cuda(device: torch.device) -> None:
    if device.type != "cuda":
        raise ValueError(f"CUDA graphs need a CUDA model, this one is on {device}")


def capture_graph(
    run: Callable[[], T], device: torch.device, pool: tuple, warm_up: Callable[[], object] | None = None
) -> tuple[torch.cuda.CUDAGraph, T]:
    """Run `warm_up` (default: `run`) once on a side stream (lazy kernels, workspaces), then capture `run` into
    `pool`; returns the graph and what the captured run returned (its static outputs). A `warm_up` must launch
    every kernel `run` does, at the same shapes (a loop's body once, not all its iterations)."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        (warm_up or run)()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = run()
    return graph, out


@dataclass
class CaptureReport:
    graphs: int
    seconds: float
    pool_mib: float
    skipped: list = field(default_factory=list)
    """the keys not captured because the memory limit was passed"""


def capture_within_limit(
    keys: Sequence[K],
    capture_key: Callable[[K, tuple], None],
    device: torch.device,
    memory_limit_mib: int,
    what: str,
) -> CaptureReport:
    """`capture_key(key, pool)` for each key in order, all into one new graph pool, skipping the rest once the
    memory reserved since the start passes `memory_limit_mib`."""
    require_cuda(device)
    started = time.perf_counter()
    pool = torch.cuda.graph_pool_handle()
    report = CaptureReport(0, 0.0, 0.0)
    base = torch.cuda.memory_reserved(device)
    limit = memory_limit_mib * 2**20
    for key in keys:
        if torch.cuda.memory_reserved(device) - base > limit:
            report.skipped.append(key)
            continue
        capture_key(key, pool)
        report.graphs += 1
    torch.cuda.synchronize(device)
    report.seconds = time.perf_counter() - started
    report.pool_mib = (torch.cuda.memory_reserved(device) - base) / 2**20
    log.info(
        "%s CUDA graphs: %d captured in %.1f s, %.0f MiB; %d skipped over the %d MiB limit",
        what,
        report.graphs,
        report.seconds,
        report.pool_mib,
        len(report.skipped),
        memory_limit_mib,
    )
    return report


DEFAULT_BUCKETS = (128, 192, 256, 320, 384, 448, 512, 576, 640, 768, 1024, 1536)


@dataclass(frozen=True)
class FlowGraphConfig:
    buckets: tuple[int, ...] = DEFAULT_BUCKETS
    """Padded mel frame counts (50 per second), ascending; longer calls run eagerly."""
    batch_sizes: tuple[int, ...] = (1,)
    streaming: tuple[bool, ...] = (False, True)
    memory_limit_mib: int = 4096
    compile: bool = False
    """Capture the estimator compiled by torch.compile (inductor, sizes dynamic: one compilation for every
    bucket, minutes at load, kept in inductor's on-disk cache) instead of eager."""

    def __post_init__(self) -> None:
        check_buckets("buckets", self.buckets)
        if not self.batch_sizes or min(self.batch_sizes) <= 0:
            raise ValueError(f"batch_sizes must be positive, got {self.batch_sizes}")

    def bucket(self, frames: int) -> int | None:
        return bucket_for(self.buckets, frames)

    def batch_for(self, rows: int) -> int | None:
        """The smallest captured batch size that holds `rows` rows, or None past the largest."""
        return bucket_for(sorted(self.batch_sizes), rows)


def graphs_wanted(switch: str, device: torch.device) -> bool:
    """A deployment's `cuda_graphs` parameter: auto (on for CUDA), true (CUDA required) or false."""
    if switch not in ("auto", "true", "false"):
        raise ValueError(f"cuda_graphs must be auto, true or false, got {switch!r}")
    if switch == "true" and device.type != "cuda":
        raise ValueError(f"cuda_graphs true needs a CUDA device, got {device}")
    return switch == "true" or (switch == "auto" and device.type == "cuda")


def compile_wanted(
    switch: str, graphs: bool, name: str = "compile", graphs_name: str = "CUDA graphs"
) -> bool:
    """A deployment's switch for torch.compile inside its CUDA graphs: auto (where there are graphs), true (graphs
    required) or false."""
    if switch not in ("auto", "true", "false"):
        raise ValueError(f"{name} must be auto, true or false, got {switch!r}")
    if switch == "true" and not graphs:
        raise ValueError(f"{name} true needs {graphs_name} (cuda_graphs auto or true on CUDA)")
    return switch == "true" or (switch == "auto" and graphs)


def flow_graph_config(
    switch: str, batch_sizes: str, device: torch.device, compile: str = "false", stream_calls: str = "true"
) -> FlowGraphConfig | None:
    """A deployment's `cuda_graphs` (auto: on for CUDA), `cuda_graph_batch_sizes` ("1,2,4,8"), `flow_compile`
    (auto: where there are graphs; true: graphs required) and `stream_calls` (false: an offline deployment, whose
    calls are whole utterances, so only the non-streaming graphs are captured) parameters."""
    graphs = graphs_wanted(switch, device)
    compiled = compile_wanted(compile, graphs, "flow_compile", "the flow's CUDA graphs")
    if stream_calls not in ("true", "false"):
        raise ValueError(f"stream_calls must be true or false, got {stream_calls!r}")
    if not graphs:
        return None
    try:
        sizes = tuple(sorted({int(b) for b in batch_sizes.split(",")}))
    except ValueError:
        raise ValueError(
            f"cuda_graph_batch_sizes must be comma-separated integers, got {batch_sizes!r}"
        ) from None
    streaming = (False, True) if stream_calls == "true" else (False,)
    return FlowGraphConfig(batch_sizes=sizes, streaming=streaming, compile=compiled)
