"""Where the flow of a token2wav Triton model runs: the `device`, `dtype`, `cuda_graphs`, `flow_compile`,
`stream_calls`, `cuda_graph_batch_sizes` and `voice_prefix_gib` parameters (how its calls run:
tritontts.triton.token2wav_calls)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from tritontts.cuda_graphs import FlowGraphConfig, flow_graph_config
from tritontts.devices import resolve_flow_dtype
from tritontts.triton.instance_device import instance_device
from tritontts.triton.params import ParameterError, model_param


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


def voice_prefix_bytes(config: dict[str, Any]) -> int:
    """The `voice_prefix_gib` parameter (0: off) in bytes: how much of its voices' flow prefixes a token2wav keeps."""
    gib = model_param(config, "voice_prefix_gib", float, 0.0)
    if not gib >= 0:
        raise ParameterError(f"parameter 'voice_prefix_gib' must be 0 (off) or more GiB, got {gib}")
    return int(gib * 2**30)
