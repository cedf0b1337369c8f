"""The torch device of one python-backend model instance, from the `args` of its `initialize`.

A `KIND_GPU` instance group (`{ count: N, kind: KIND_GPU, gpus: [0, 1] }`: run.sh's `--gpu_layout instances`)
starts N instances on each listed GPU, in one tritonserver that sees them all, and tells each instance its GPU in
`args["model_instance_device_id"]`. Any other instance runs where the model's `device` parameter says, as before.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from tritontts.devices import resolve_device


def instance_device(args: Mapping[str, str], device: str | torch.device = "auto") -> torch.device:
    """`cuda:<model_instance_device_id>` for a KIND_GPU instance whose `device` is not `cpu`, made this thread's
    current device (kernels, streams and CUDA graphs that take the current one land there too); otherwise
    `resolve_device(device)`."""
    if args.get("model_instance_kind") != "GPU" or str(device) == "cpu":
        return resolve_device(device)
    if str(device) != "auto":
        resolve_device(device)  # refuses a name that is no device
    raw = args.get("model_instance_device_id", "")
    if not str(raw).isdigit():
        raise ValueError(f"a KIND_GPU instance needs a GPU index in model_instance_device_id, got {raw!r}")
    index = int(raw)
    torch.cuda.set_device(index)
    return torch.device("cuda", index)
