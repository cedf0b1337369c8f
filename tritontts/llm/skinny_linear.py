"""Linear layers of a decode step at small batch in one Triton kernel each, with their epilogues fused.

At batch 1-4 a decode step's projections are matrix-vector products: cuBLAS runs them as GEMM kernels (some with
a split-K reduction after them), and the bias, the SiLU gating and their launches come on top. Here programs over
blocks of output features each read their rows of the weight once, multiply them with every input row in fp32
and write the output with the bias added, or, for the fused gate/up projection, `silu(gate) * up` (the weight's
first half gives the gate rows, its second half the up rows), so the MLP's activation kernel goes too.

Long inputs (the MLP's down projection) split their features over more programs (`skinny_linear_partials`): each
writes the fp32 sum of its share, and whoever reads the output adds the shares up (the next layer's residual +
RMSNorm, compiled into one kernel), so no reduction kernel runs after the projection. No host
sync, no data-dependent allocation: it runs inside CUDA graph capture and, as a `torch.library.triton_op`, inside
torch.compile.

Importing this module imports triton and registers `torch.ops.tritontts.skinny_linear`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from tritontts.llm.pdl import gdc_launch_dependents, gdc_wait, launch_options

MAX_ROWS = 1
"""Input rows (decode batch) up to which programs multiply on the CUDA cores (fp32 products of every weight element
with every row); more rows go through `tl.dot` (tensor cores, the rows padded to 16)."""
DOT_ROWS = 64
"""The most rows the `tl.dot` path is meant for."""
MAX_IN = 2048
"""The longest input rows `skinny_linear` takes: for the MLP's down projection (4864) cuBLAS was as fast;
`skinny_linear_partials` takes any."""
DOWN_SPLITS = 4
"""Shares of the input features `skinny_linear_partials` sums apart by default."""


@triton.jit
def _dot(a, b, IEEE: tl.constexpr):
    """fp32 products; IEEE: fp32 (or, on Triton's CPU interpreter, widened bf16) operands without TF32."""
    if IEEE:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b)


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
    k_chunk,
    stride_xm,
    stride_wn,
    stride_om,
    stride_os,
    M_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SILU_MUL: tl.constexpr,
    DOT: tl.constexpr,
    IEEE: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:
        gdc_launch_dependents()
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k_start = tl.program_id(1) * k_chunk
    k_end = tl.minimum(k_start + k_chunk, k_in)
    offs_m = tl.arange(0, M_PAD)
    n_mask = offs_n < n_out
    m_mask = offs_m < rows
    if DOT:
        acc = tl.zeros([M_PAD, BLOCK_N], dtype=tl.float32)
        acc_up = tl.zeros([M_PAD, BLOCK_N], dtype=tl.float32)
    else:
        acc3 = tl.zeros([M_PAD, BLOCK_N, BLOCK], dtype=tl.float32)
        up3 = tl.zeros([M_PAD, BLOCK_N, BLOCK], dtype=tl.float32)
    for k0 in range(k_start, k_end, BLOCK):
        offs_k = k0 + tl.arange(0, BLOCK)
        k_mask = offs_k < k_end
        w_mask = n_mask[:, None] & k_mask[None, :]
        w = tl.load(w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :], mask=w_mask, other=0.0)
        if SILU_MUL:
            up_rows = offs_n + up_offset
            u = tl.load(w_ptr + up_rows[:, None] * stride_wn + offs_k[None, :], mask=w_mask, other=0.0)
        if PDL:
            if k0 == k_start:  # the first weights are on their way: now the previous kernel's output
                gdc_wait()
        x = tl.load(
            x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :],
            mask=m_mask[:, None] & k_mask[None, :],
            other=0.0,
        )
        if DOT:
            acc += _dot(x, tl.trans(w), IEEE)
            if SILU_MUL:
                acc_up += _dot(x, tl.trans(u), IEEE)
        else:
            x32 = x.to(tl.float32)
            acc3 += x32[:, None, :] * w.to(tl.float32)[None, :, :]
            if SILU_MUL:
                up3 += x32[:, None, :] * u.to(tl.float32)[None, :, :]
    if not DOT:
        acc = tl.sum(acc3, axis=2)
        if SILU_MUL:
            acc_up = tl.sum(up3, axis=2)
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    if SILU_MUL:
        acc = acc * tl.sigmoid(acc) * acc_up
    out = out_ptr + tl.program_id(1) * stride_os + offs_m[:, None] * stride_om + offs_n[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


def block_n(n_out: int, k_in: int, silu_mul: bool = False, rows: int = 1) -> int:
    """Output features per program, as measured best on an H100 (scripts/bench_skinny_linear.py): at one row 2 for the
    gated MLP and above 1024 outputs (more programs in flight), else 4; with `tl.dot` (16 or more) 32 for the gated
    MLP, else 16."""
    if rows > MAX_ROWS:
        return 32 if silu_mul else 16
    return 2 if silu_mul or n_out > 1024 else 4


def default_block_k(k_in: int, rows: int = 1, silu_mul: bool = False) -> int:
    """Input features per loop step (H100): at one row all of a 896-wide input at once (at most 1024); with
    `tl.dot` 128 for the gated MLP, else 256."""
    if rows > MAX_ROWS:
        return 128 if silu_mul else 256
    return min(1024, triton.next_power_of_2(k_in))


def _launch(x, weight, bias, out, n_out, silu_mul, width, block_k, splits=1, warps=4, pdl=False) -> None:
    rows, k_in = x.shape
    dot = rows > MAX_ROWS
    block = block_k or default_block_k(k_in, rows, silu_mul)
    k_chunk = triton.cdiv(triton.cdiv(k_in, splits), block) * block
    wrap_triton(_skinny_kernel)[(triton.cdiv(n_out, width), triton.cdiv(k_in, k_chunk))](
        x,
        weight,
        bias if bias is not None else weight,
        out,
        rows,
        n_out,
        k_in,
        n_out,
        k_chunk,
        x.stride(0),
        weight.stride(0),
        out.stride(-2),
        out.stride(0) if out.dim() == 3 else 0,
        M_PAD=max(16, triton.next_power_of_2(rows)) if dot else triton.next_power_of_2(rows),
        BLOCK_N=width,
        BLOCK=block,
        HAS_BIAS=bias is not None,
        SILU_MUL=silu_mul,
        DOT=dot,
        IEEE=x.dtype == torch.float32 or x.device.type == "cpu",
        PDL=pdl,
        num_warps=warps,
        **launch_options(pdl),
    )


@triton_op("tritontts::skinny_linear", mutates_args={})
def skinny_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    silu_mul: bool,
    width: int = 0,
    block_k: int = 0,
    warps: int = 4,
    pdl: bool = False,
) -> torch.Tensor:
    """`F.linear(x, weight, bias)` for `x [M, K]` (contiguous rows; see MAX_ROWS, DOT_ROWS); with `silu_mul`, weight
    `[2 N, K]` holds gate rows then up rows and the result is `silu(gate) * up`, `[M, N]`. `width` (output
    features per program) and `block_k`: 0 for the defaults; `warps` per program; `pdl`: launched with programmatic
    dependent launch (`tritontts.llm.pdl`; eager callers only)."""
    rows, k_in = x.shape
    n_out = weight.shape[0] // 2 if silu_mul else weight.shape[0]
    out = torch.empty(rows, n_out, device=x.device, dtype=x.dtype)
    width = width or block_n(n_out, k_in, silu_mul, rows)
    _launch(x, weight, bias, out, n_out, silu_mul, width, block_k, 1, warps, pdl)
    return out


@triton_op("tritontts::skinny_linear_partials", mutates_args={})
def skinny_linear_partials(
    x: torch.Tensor,
    weight: torch.Tensor,
    splits: int = DOWN_SPLITS,
    width: int = 0,
    block_k: int = 0,
    warps: int = 4,
    pdl: bool = False,
) -> torch.Tensor:
    """`x @ weight.T` for `x [M, K]` as fp32 shares `[S, M, N]` whose sum over the first dimension is the product:
    share s sums about `K / splits` consecutive input features (S is `splits` or fewer, when K is short)."""
    rows, k_in = x.shape
    n_out = weight.shape[0]
    block = block_k or default_block_k(k_in, rows)
    shares = triton.cdiv(k_in, triton.cdiv(triton.cdiv(k_in, splits), block) * block)
    out = torch.empty(shares, rows, n_out, device=x.device, dtype=torch.float32)
    width = width or (2 if rows <= MAX_ROWS else 16)
    _launch(x, weight, None, out, n_out, False, width, block, splits, warps, pdl)
    return out
