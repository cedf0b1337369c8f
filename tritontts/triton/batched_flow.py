"""What the flow-based token2wav Triton models share: where the flow runs (the `device`, `dtype`, `cuda_graphs`
and `cuda_graph_batch_sizes` parameters) and, for the ones that decode a Triton batch together (CosyVoice2's
token2wav, the DiT's, CosyVoice3's), the execute loop: parse each request, `run_many` over the valid calls
(first chunks first), the stage seconds, one response per request through its response sender (an error
response naming the field for a refused one)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import torch

from tritontts.cuda_graphs import FlowGraphConfig, flow_graph_config
from tritontts.devices import resolve_flow_dtype
from tritontts.stage_timer import StageTimer
from tritontts.triton.first_chunk_priority import FirstChunkHolder, holding
from tritontts.triton.instance_device import instance_device
from tritontts.triton.metrics import StageSeconds
from tritontts.triton.params import error_response, model_param

Call = TypeVar("Call")


def flow_placement(
    config: dict[str, Any],
    args: Mapping[str, str],
    default_batch_sizes: str = "1,2,4,8",
    batch_sizes_param: bool = True,
) -> tuple[torch.device, torch.dtype, FlowGraphConfig | None]:
    """(device, flow dtype, CUDA graph settings) from the model config and the instance (`args` of
    `initialize`: a KIND_GPU instance's own GPU); without `batch_sizes_param` the graph batch sizes are
    `default_batch_sizes`, not a parameter."""
    device = instance_device(args, model_param(config, "device", default="auto"))
    dtype = resolve_flow_dtype(model_param(config, "dtype", default="auto"), device)
    sizes = default_batch_sizes
    if batch_sizes_param:
        sizes = model_param(config, "cuda_graph_batch_sizes", default=default_batch_sizes)
    compile = model_param(config, "flow_compile", default="false")
    stream_calls = model_param(config, "stream_calls", default="true")
    switch = model_param(config, "cuda_graphs", default="auto")
    return device, dtype, flow_graph_config(switch, sizes, device, compile, stream_calls)


def first_chunks_first(config: dict[str, Any]) -> bool:
    """The `first_chunks_first` parameter (default true): see `execute_batched`."""
    return model_param(config, "first_chunks_first", bool, default=True)


def execute_batched(
    pb_utils: Any,
    requests: Sequence[Any],
    parse: Callable[[Any], Call],
    run_many: Callable[[list[Call], StageTimer], Sequence[Any]],
    stages: StageSeconds,
    first_chunk: Callable[[Call], bool],
    respond: Callable[[Any], Any],
    holder: FirstChunkHolder | None = None,
    first_chunks_first: bool = True,
) -> None:
    """`parse(request)` each (an exception: that request's error response), `run_many(calls, timer)` over the
    valid calls, `respond(result)` each; every response goes out through its request's response sender as soon
    as its group is done, and `execute` returns None.

    With `first_chunks_first` the streams' first chunks of this batch are one group, made and sent before the
    other calls run (a first chunk no longer waits for the later chunks Triton batched with it), else all
    calls are one group. A group's timer stages are labelled `chunk="first"` when every call in it is a
    stream's first. With a `holder`, the LLM on this GPU holds its steps while a group makes some stream's
    first chunk."""
    calls, slots = [], []
    for i, request in enumerate(requests):
        try:
            calls.append(parse(request))
            slots.append(i)
        except Exception as err:
            _send(pb_utils, request, error_response(pb_utils, err))
    firsts = [first_chunk(call) for call in calls]
    for group in _groups(firsts, first_chunks_first):
        timer = StageTimer()
        try:
            with holding(holder, any(firsts[j] for j in group)):
                results = run_many([calls[j] for j in group], timer)
            stages.add(timer.stages, chunk="first" if all(firsts[j] for j in group) else "other")
        except Exception as err:
            results = [err] * len(group)
        for j, result in zip(group, results):
            response = error_response(pb_utils, result) if isinstance(result, Exception) else respond(result)
            _send(pb_utils, requests[slots[j]], response)
    return None


def _groups(firsts: list[bool], first_chunks_first: bool) -> list[list[int]]:
    everything = list(range(len(firsts)))
    if not first_chunks_first or all(firsts) or not any(firsts):
        return [everything] if everything else []
    return [[j for j in everything if firsts[j]], [j for j in everything if not firsts[j]]]


def _send(pb_utils: Any, request: Any, response: Any) -> None:
    request.get_response_sender().send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
