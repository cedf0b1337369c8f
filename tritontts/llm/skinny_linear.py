"""Linear layers of a decode step at small batch in one Triton kernel each, with their epilogues fused.

At batch 1-4 a decode step's projections are matrix-vector products: cuBLAS runs them as GEMM kernels (some with
a split-K reduction after them), and the bias, the SiLU gating and their launches come on top. Here programs over
blocks of output features each read their rows of the weight once, multiply them with every input row in fp32
and write the output with the bias added, or, for the fused gate/up projection, `silu(gate) * up` (the weight's
first half gives the gate rows, its second half the up rows), so the MLP's activation kernel goes too. No host
sync, no data-dependent allocation: it runs inside CUDA graph capture and, as a `torch.library.triton_op`, inside
torch.compile.

Importing this module imports triton and registers `torch.ops.tritontts.skinny_linear`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

MAX_ROWS = 1
"""The most input rows (decode batch) the kernel takes: at 4 rows cuBLAS was faster in every projection (H100)."""
MAX_IN = 2048
"""The longest input rows it takes: for the MLP's down projection (4864) cuBLAS was as fast."""


@triton.jit
def _skinny_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    out_ptr,
    rows,
    n_out,
    k_in,
    up_offset,
    stride_xm,
    stride_wn,
    stride_om,
    M_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SILU_MUL: tl.constexpr,
):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, M_PAD)
    n_mask = offs_n < n_out
    m_mask = offs_m < rows
    acc3 = tl.zeros([M_PAD, BLOCK_N, BLOCK], dtype=tl.float32)
    up3 = tl.zeros([M_PAD, BLOCK_N, BLOCK], dtype=tl.float32)
    for k0 in range(0, k_in, BLOCK):
        offs_k = k0 + tl.arange(0, BLOCK)
        k_mask = offs_k < k_in
        x = tl.load(
            x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :],
            mask=m_mask[:, None] & k_mask[None, :],
            other=0.0,
        ).to(tl.float32)
        w_mask = n_mask[:, None] & k_mask[None, :]
        w = tl.load(w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :], mask=w_mask, other=0.0)
        acc3 += x[:, None, :] * w.to(tl.float32)[None, :, :]
        if SILU_MUL:
            up_rows = offs_n + up_offset
            u = tl.load(w_ptr + up_rows[:, None] * stride_wn + offs_k[None, :], mask=w_mask, other=0.0)
            up3 += x[:, None, :] * u.to(tl.float32)[None, :, :]
    acc = tl.sum(acc3, axis=2)
    if SILU_MUL:
        acc_up = tl.sum(up3, axis=2)
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    if SILU_MUL:
        acc = acc * tl.sigmoid(acc) * acc_up
    out = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


def block_n(n_out: int, k_in: int, silu_mul: bool = False) -> int:
    """Output features per program, as measured best on an H100 at one row (scripts/bench_skinny_linear.py):
    4 for the gated MLP and for up to 1024 outputs, 2 above (more programs in flight)."""
    return 4 if silu_mul or n_out <= 1024 else 2


def default_block_k(silu_mul: bool) -> int:
    return 256 if silu_mul else 512


@triton_op("tritontts::skinny_linear", mutates_args={})
def skinny_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    silu_mul: bool,
    width: int = 0,
    block_k: int = 0,
) -> torch.Tensor:
    """`F.linear(x, weight, bias)` for `x [M, K]` (contiguous rows; it pays for M ≤ MAX_ROWS); with `silu_mul`, weight
    `[2 N, K]` holds gate rows then up rows and the result is `silu(gate) * up`, `[M, N]`. `width` (output
    features per program) and `block_k`: 0 for the defaults."""
    rows, k_in = x.shape
    n_out = weight.shape[0] // 2 if silu_mul else weight.shape[0]
    out = torch.empty(rows, n_out, device=x.device, dtype=x.dtype)
    width = width or block_n(n_out, k_in, silu_mul)
    wrap_triton(_skinny_kernel)[(triton.cdiv(n_out, width),)](
        x,
        weight,
        bias if bias is not None else weight,
        out,
        rows,
        n_out,
        k_in,
        n_out,
        x.stride(0),
        weight.stride(0),
        out.stride(0),
        M_PAD=triton.next_power_of_2(rows),
        BLOCK_N=width,
        BLOCK=block_k or default_block_k(silu_mul),
        HAS_BIAS=bias is not None,
        SILU_MUL=silu_mul,
        num_warps=4,
    )
    return out
