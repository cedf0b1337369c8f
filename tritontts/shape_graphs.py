"""A function of tensors replayed from CUDA graphs captured per input shape, for models whose outputs depend on
every input frame (no padding to buckets): the vocoders, whose streamed chunks repeat a few exact lengths.

A shape is captured the `min_uses`-th time it is seen (so one-off lengths, such as the last chunk of each
stream, stay eager), into one memory pool; the least recently used graph is dropped past `max_graphs`, and no
new shape is captured once the captures have reserved `memory_limit_mib` (the device memory reserved while
capturing, summed; a dropped graph's memory stays in the pool for the next captures). A call whose capture fails runs eagerly
from then on."""

from __future__ import annotations

import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import torch
from torch import Tensor

from tritontts.cuda_graphs import capture_graph, require_cuda

log = logging.getLogger(__name__)

Capture = Callable[[Callable[[], tuple[Tensor, ...]], torch.device, tuple], tuple[object, tuple[Tensor, ...]]]


@dataclass(frozen=True)
class ShapeGraphConfig:
    max_graphs: int = 32
    min_uses: int = 2
    memory_limit_mib: int = 1024

    def __post_init__(self) -> None:
        if self.max_graphs <= 0 or self.min_uses <= 0 or self.memory_limit_mib <= 0:
            raise ValueError(f"max_graphs, min_uses and memory_limit_mib must be positive: {self}")


@dataclass
class _Graph:
    graph: object
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    single: bool


class ShapeGraphs:
    """`graphs(*tensors, **options)` returns what `fn(*tensors, **options)` returns (a tensor or a tuple of
    them), from a graph once that call's shapes, dtypes and options have been seen `min_uses` times."""

    def __init__(
        self,
        fn: Callable[..., Tensor | tuple[Tensor, ...]],
        device: torch.device,
        config: ShapeGraphConfig | None = None,
        name: str = "shape graphs",
        capture: Capture = capture_graph,
    ) -> None:
        if capture is capture_graph:
            require_cuda(device)
        self.fn, self.device, self.config, self.name = fn, device, config or ShapeGraphConfig(), name
        self._capture = capture
        self._graphs: OrderedDict[Hashable, _Graph] = OrderedDict()
        self._seen: Counter[Hashable] = Counter()
        self._uncapturable: set[Hashable] = set()
        self._pool = torch.cuda.graph_pool_handle() if device.type == "cuda" else ()
        self.captured_bytes = 0
        self.replays = 0
        self.eager_calls = 0
        self.capture_seconds = 0.0

    def __call__(self, *tensors: Tensor, **options: Hashable) -> Tensor | tuple[Tensor, ...]:
        key = (tuple((t.shape, t.dtype) for t in tensors), tuple(sorted(options.items())))
        entry = self._graphs.get(key)
        if entry is None:
            self._seen[key] += 1
            if self._seen[key] < self.config.min_uses or key in self._uncapturable or not self._room():
                self.eager_calls += 1
                return self.fn(*tensors, **options)
            try:
                entry = self._record(key, tensors, options)
            except Exception as err:  # a call that cannot be captured stays eager
                log.warning("%s: %s not captured (%s); it runs eagerly", self.name, key[0], err)
                self._uncapturable.add(key)
                self.eager_calls += 1
                return self.fn(*tensors, **options)
        self._graphs.move_to_end(key)
        for static, value in zip(entry.inputs, tensors):
            static.copy_(value)
        entry.graph.replay()
        self.replays += 1
        outputs = tuple(out.clone() for out in entry.outputs)
        return outputs[0] if entry.single else outputs

    def _room(self) -> bool:
        return self.captured_bytes <= self.config.memory_limit_mib * 2**20

    def _reserved(self) -> int:
        return torch.cuda.memory_reserved(self.device) if self.device.type == "cuda" else 0

    def _record(self, key: Hashable, tensors: tuple[Tensor, ...], options: dict) -> _Graph:
        started, reserved = time.perf_counter(), self._reserved()
        inputs = tuple(t.clone() for t in tensors)
        single = False

        def run() -> tuple[Tensor, ...]:
            nonlocal single
            out = self.fn(*inputs, **options)
            single = isinstance(out, Tensor)
            return (out,) if single else tuple(out)

        graph, outputs = self._capture(run, self.device, self._pool)
        self.captured_bytes += max(0, self._reserved() - reserved)
        entry = _Graph(graph, inputs, outputs, single)
        self._graphs[key] = entry
        del self._seen[key]
        while len(self._graphs) > self.config.max_graphs:
            self._graphs.popitem(last=False)
        self.capture_seconds += time.perf_counter() - started
        log.info("%s: captured %s in %.0f ms", self.name, key[0], 1000 * (time.perf_counter() - started))
        return entry

    @property
    def captured(self) -> int:
        return len(self._graphs)
