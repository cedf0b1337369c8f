"""Programmatic dependent launch (PDL, sm_90 and later) for the Triton kernels of a batch-1 decode step.

A kernel launched with PDL may start while the one before it still runs. Each program of the decode kernels
first lets the next kernel start (`gdc_launch_dependents`), reads its weights, then waits (`gdc_wait`) until the
previous kernel has finished and its writes are visible before it reads its inputs or writes anything. A step's
chain of about 120 small kernels then overlaps each one's ramp and weight reads with the tail of the one before.
"""

from __future__ import annotations

import torch

try:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # a Triton without griddepcontrol
    gdc_launch_dependents = gdc_wait = None

__all__ = ["gdc_launch_dependents", "gdc_wait", "launch_options", "pdl_problem"]


def pdl_problem(device: torch.device) -> str | None:
    """Why the decode kernels cannot launch with PDL on `device` (None: they can)."""
    if gdc_wait is None:
        return "needs a Triton with griddepcontrol (triton.language.extra.cuda.gdc_wait)"
    if device.type != "cuda":
        return f"needs a CUDA device, not {device}"
    major, _ = torch.cuda.get_device_capability(device)
    if major < 9:
        return f"needs compute capability 9.0 or later (Hopper), not {major}.x"
    return None


def launch_options(pdl: bool) -> dict:
    """The launch keyword of a kernel call: PDL's launch attribute where asked for."""
    return {"launch_pdl": True} if pdl else {}
