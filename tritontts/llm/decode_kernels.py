"""Which decode kernels a device can run: the Triton kernels of each setting on CUDA, torch elsewhere."""

from __future__ import annotations

import importlib
import os

import torch

DECODE_ATTENTION = ("auto", "torch", "triton")


DECODE_KERNELS = {
    "decode_attention": ("tritontts.llm.decode_attention",),
    "decode_linear": ("tritontts.llm.skinny_linear", "tritontts.llm.norm_linear"),
    "top_k_kernel": ("tritontts.llm.top_k",),
}


def decode_kernel_problem(
    device: torch.device, head_dim: int, setting: str = "decode_attention"
) -> str | None:
    """Why the Triton kernels of `setting` (decode_attention, decode_linear, top_k_kernel) cannot run on
    `device` (None: they can, and their op is registered). Off CUDA they run only under Triton's CPU
    interpreter (TRITON_INTERPRET=1, for tests)."""
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        return f"needs a CUDA device, not {device}"
    if setting == "decode_attention" and (head_dim < 16 or head_dim & (head_dim - 1)):
        return f"needs a power-of-two head_dim of at least 16, not {head_dim}"
    try:
        for module in DECODE_KERNELS[setting]:
            importlib.import_module(module)
    except ImportError as error:
        return f"needs the triton package ({error})"
    return None


def resolve_decode_attention(
    choice: str, device: torch.device, head_dim: int = 64, setting: str = "decode_attention"
) -> str:
    """The setting `decode_attention` (or `decode_linear`) as the path decode steps take: "auto" is "triton"
    (the Triton kernels) on CUDA when triton imports, else "torch"; "triton" raises where they cannot run."""
    if choice not in DECODE_ATTENTION:
        raise ValueError(f"{setting} must be one of {DECODE_ATTENTION}, got {choice!r}")
    if choice == "torch" or (choice == "auto" and device.type != "cuda"):
        return "torch"
    problem = decode_kernel_problem(device, head_dim, setting)
    if problem is None:
        return "triton"
    if choice == "auto":
        return "torch"
    raise ValueError(f"{setting}='triton' {problem}")
