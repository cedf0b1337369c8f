"""What the flow-based token2wav Triton models share: where the flow runs (the `device`, `dtype`, `cuda_graphs`
and `cuda_graph_batch_sizes` parameters) and, for the ones that decode a Triton batch together (CosyVoice2's
token2wav, CosyVoice3's), the execute loop: parse each request, one `run_many` over the valid calls, the
stage seconds, one response per request in order (an error response naming the field for a refused one)."""

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


def execute_batched(
    pb_utils: Any,
    requests: Sequence[Any],
    parse: Callable[[Any], Call],
    run_many: Callable[[list[Call], StageTimer], Sequence[Any]],
    stages: StageSeconds,
    first_chunk: Callable[[Call], bool],
    respond: Callable[[Any], Any],
    holder: FirstChunkHolder | None = None,
) -> list[Any]:
    """`parse(request)` each (an exception: that request's error response), `run_many(calls, timer)` once,
    the timer's stages labelled `chunk="first"` when every call is a stream's first, `respond(result)` each.
    With a `holder`, the LLM on this GPU holds its steps while `run_many` makes some stream's first chunk."""
    outcomes: list[Any] = [None] * len(requests)
    calls, slots = [], []
    for i, request in enumerate(requests):
        try:
            calls.append(parse(request))
            slots.append(i)
        except Exception as err:
            outcomes[i] = err
    timer = StageTimer()
    firsts = [first_chunk(call) for call in calls]
    with holding(holder, any(firsts)):
        results = run_many(calls, timer)
    for slot, result in zip(slots, results):
        outcomes[slot] = result
    if calls:
        stages.add(timer.stages, chunk="first" if all(firsts) else "other")
    return [
        error_response(pb_utils, outcome) if isinstance(outcome, Exception) else respond(outcome)
        for outcome in outcomes
    ]
