"""A batch-1 decode step's residual add and RMSNorm inside the projection that reads them.

Every program of the projection adds the layer's input to what the previous block wrote (the attention's output
projection, or the MLP's fp32 shares: see `skinny_linear_partials`), rounds the sum to the model's dtype as the
residual stream holds it, normalizes it (RMSNorm with its weight) and multiplies its rows of the weight with it; the
first program also writes the new residual. The add + norm kernel between the blocks goes, twice a layer. The
row is one loop step of the skinny kernel (hidden sizes up to 1024), which every program reads from L2.

Importing this module imports triton and registers `torch.ops.tritontts.norm_linear`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from tritontts.llm.pdl import gdc_launch_dependents, gdc_wait, launch_options
from tritontts.llm.skinny_linear import block_n

MAX_IN = 1024
"""The widest residual stream a program normalizes in one step."""


@triton.jit
def _norm_linear_kernel(
    x_ptr,
    d_ptr,
    norm_ptr,
    w_ptr,
    b_ptr,
    out_ptr,
    res_ptr,
    n_out,
    k_in,
    up_offset,
    eps,
    stride_ds,
    stride_wn,
    SHARES: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SILU_MUL: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:
        gdc_launch_dependents()
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK)
    n_mask = offs_n < n_out
    k_mask = offs_k < k_in
    w_mask = n_mask[:, None] & k_mask[None, :]
    w = tl.load(w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :], mask=w_mask, other=0.0)
    if SILU_MUL:
        up_rows = offs_n + up_offset
        u = tl.load(w_ptr + up_rows[:, None] * stride_wn + offs_k[None, :], mask=w_mask, other=0.0)
    if HAS_BIAS:
        bias = tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    norm = tl.load(norm_ptr + offs_k, mask=k_mask, other=0.0).to(tl.float32)
    if PDL:
        gdc_wait()
    total = tl.load(x_ptr + offs_k, mask=k_mask, other=0.0).to(tl.float32)
    for s in tl.static_range(SHARES):
        total += tl.load(d_ptr + s * stride_ds + offs_k, mask=k_mask, other=0.0).to(tl.float32)
    residual = total.to(res_ptr.dtype.element_ty)
    if tl.program_id(0) == 0:
        tl.store(res_ptr + offs_k, residual, mask=k_mask)
    h = residual.to(tl.float32)
    scale = tl.rsqrt(tl.sum(h * h, axis=0) / k_in + eps)
    normed = (h * scale).to(res_ptr.dtype.element_ty).to(tl.float32)
    xin = (norm * normed).to(res_ptr.dtype.element_ty).to(tl.float32)
    acc = tl.sum(xin[None, :] * w.to(tl.float32), axis=1)
    if SILU_MUL:
        acc_up = tl.sum(xin[None, :] * u.to(tl.float32), axis=1)
    if HAS_BIAS:
        acc += bias
    if SILU_MUL:
        acc = acc * tl.sigmoid(acc) * acc_up
    tl.store(out_ptr + offs_n, acc.to(out_ptr.dtype.element_ty), mask=n_mask)


@triton_op("tritontts::norm_linear", mutates_args={})
def norm_linear(
    x: torch.Tensor,
    delta: torch.Tensor | None,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    silu_mul: bool,
    width: int = 0,
    warps: int = 4,
    pdl: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(`F.linear(rms_norm(r), weight, bias)`, `r`) for the residual `r = x + delta` of one row `x [1, K]`,
    rounded to x's dtype, where `delta` is `[S, 1, K]` whose S rows (fp32 shares, or one row in x's dtype) are
    added to x in order in fp32 (None: r is x); with `silu_mul` the weight's gate then up rows give
    `silu(gate) * up`. `pdl`: launched with programmatic dependent launch (`tritontts.llm.pdl`; eager callers
    only)."""
    k_in = x.shape[-1]
    n_out = weight.shape[0] // 2 if silu_mul else weight.shape[0]
    out = torch.empty(1, n_out, device=x.device, dtype=x.dtype)
    residual = torch.empty(1, k_in, device=x.device, dtype=x.dtype)
    width = width or block_n(n_out, k_in, silu_mul)  # the skinny kernel's widths at one row
    wrap_triton(_norm_linear_kernel)[(triton.cdiv(n_out, width),)](
        x,
        x if delta is None else delta,
        norm_weight,
        weight,
        bias if bias is not None else weight,
        out,
        residual,
        n_out,
        k_in,
        n_out,
        eps,
        0 if delta is None else delta.stride(0),
        weight.stride(0),
        SHARES=0 if delta is None else delta.shape[0],
        BLOCK_N=width,
        BLOCK=triton.next_power_of_2(k_in),
        HAS_BIAS=bias is not None,
        SILU_MUL=silu_mul,
        PDL=pdl,
        num_warps=warps,
        **launch_options(pdl),
    )
    return out, residual
