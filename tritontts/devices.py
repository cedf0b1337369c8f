"""The torch device and dtype a model runs on, from the names that configs and command lines use."""

from __future__ import annotations

import torch

from tritontts.stage_timer import StageTimer

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """`auto` is the GPU when torch sees one, else the CPU."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError:
        resolved = None
    if resolved is None or resolved.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda[:N]', got {str(device)!r}")
    return resolved


def resolve_dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
        return DTYPES[dtype]
    if dtype not in DTYPES.values():
        raise ValueError(f"dtype must be float32, float16 or bfloat16, got {dtype}")
    return dtype


def resolve_flow_dtype(name: str, device: torch.device) -> torch.dtype:
    """A token2wav flow's dtype: `auto` is float16 on CUDA (upstream runs the flow in fp16), float32 elsewhere."""
    if name == "auto":
        return torch.float16 if device.type == "cuda" else torch.float32
    if name not in DTYPES:
        raise ValueError(f"token2wav dtype must be one of {('auto', *DTYPES)}, got {name!r}")
    return DTYPES[name]


def mark_on_device(timer: StageTimer | None, stage: str, device: torch.device) -> None:
    """Ends `stage` once the device has done its queued work (CUDA runs asynchronously); no timer: nothing."""
    if timer is None:
        return
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    timer.mark(stage)
