"""Fused decode attention: one query per sequence against the static KV cache, in two Triton kernels.

Flash-decoding: the first kernel runs programs over (key split, KV head, row); each loads the queries of all
`groups` query heads that share its KV head, reads the cache buffers `[slots, kv_heads, max_seq_len, dim]`
in place and keeps an online softmax in fp32 over the keys of its split that the row may see, its first
`lengths[b]` (a tensor, so that one CUDA graph serves every length). A second kernel combines the splits'
partial outputs. No host sync and no allocation that depends on the data, so it runs inside CUDA graph
capture and, as a `torch.library.triton_op`, inside torch.compile.

Importing this module imports triton and registers the op `torch.ops.tritontts.decode_attention`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

BLOCK_N = 64  # keys per loop iteration of a split
LOG2E = 1.4426950408889634


@triton.jit
def _dot(a, b, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    """fp32 products; UPCAST: bf16 operands widened first (exact), as Triton's CPU interpreter needs."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    return tl.dot(a, b)


@triton.jit
def _split_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    len_ptr,
    out_ptr,
    part_ptr,
    stats_ptr,
    max_len,
    scale_log2,
    stride_qb,
    stride_qh,
    stride_qd,
    stride_ks,
    stride_kh,
    stride_kt,
    stride_kd,
    stride_vs,
    stride_vh,
    stride_vt,
    stride_vd,
    stride_len,
    GROUPS: tl.constexpr,
    G_PAD: tl.constexpr,
    DIM: tl.constexpr,
    SPLIT: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK: tl.constexpr,
    DIRECT: tl.constexpr,
    IEEE: tl.constexpr,
    UPCAST: tl.constexpr,
):
    split = tl.program_id(0)
    kv_head = tl.program_id(1)
    row = tl.program_id(2)
    heads = tl.num_programs(1) * GROUPS
    length = tl.minimum(tl.maximum(tl.load(len_ptr + row * stride_len), 1), max_len).to(tl.int32)
    start = split * SPLIT
    end = tl.minimum(start + SPLIT, length)

    offs_g = tl.arange(0, G_PAD)
    offs_d = tl.arange(0, DIM)
    head = kv_head * GROUPS + offs_g
    g_mask = offs_g < GROUPS
    q = tl.load(
        q_ptr + row * stride_qb + head[:, None] * stride_qh + offs_d[None, :] * stride_qd,
        mask=g_mask[:, None],
        other=0.0,
    )
    k_base = k_ptr + row.to(tl.int64) * stride_ks + kv_head * stride_kh
    v_base = v_ptr + row.to(tl.int64) * stride_vs + kv_head * stride_vh

    if UPCAST:
        q = q.to(tl.float32)
    m = tl.full([G_PAD], float("-inf"), dtype=tl.float32)
    denom = tl.zeros([G_PAD], dtype=tl.float32)
    acc = tl.zeros([G_PAD, DIM], dtype=tl.float32)
    for n0 in range(start, end, BLOCK):
        offs_n = n0 + tl.arange(0, BLOCK)
        n_mask = offs_n < end
        k = tl.load(
            k_base + offs_n[:, None] * stride_kt + offs_d[None, :] * stride_kd,
            mask=n_mask[:, None],
            other=0.0,
        )
        scores = _dot(q, tl.trans(k), IEEE, UPCAST)
        scores = (scores * scale_log2).to(tl.float32)  # torch.compile may pass the scale as a float64
        scores = tl.where(n_mask[None, :], scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(scores - m_new[:, None])
        denom = denom * alpha + tl.sum(p, axis=1)
        v = tl.load(
            v_base + offs_n[:, None] * stride_vt + offs_d[None, :] * stride_vd,
            mask=n_mask[:, None],
            other=0.0,
        )
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, IEEE, UPCAST)
        m = m_new

    if DIRECT:  # one split: the output itself
        out = acc / denom[:, None]
        out_offs = row * heads * DIM + head[:, None] * DIM + offs_d[None, :]
        tl.store(out_ptr + out_offs, out.to(out_ptr.dtype.element_ty), mask=g_mask[:, None])
    else:
        live = g_mask & (offs_g * 0 + start < length)  # a tensor: the interpreter refuses a scalar mask
        part = (row * heads + head) * NUM_SPLITS + split
        tl.store(part_ptr + part[:, None] * DIM + offs_d[None, :], acc, mask=live[:, None])
        tl.store(stats_ptr + part * 2, m, mask=live)
        tl.store(stats_ptr + part * 2 + 1, denom, mask=live)


@triton.jit
def _combine_kernel(
    len_ptr,
    out_ptr,
    part_ptr,
    stats_ptr,
    max_len,
    stride_len,
    DIM: tl.constexpr,
    SPLIT: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    S_PAD: tl.constexpr,
):
    head = tl.program_id(0)
    row = tl.program_id(1)
    heads = tl.num_programs(0)
    length = tl.minimum(tl.maximum(tl.load(len_ptr + row * stride_len), 1), max_len).to(tl.int32)
    offs_s = tl.arange(0, S_PAD)
    offs_d = tl.arange(0, DIM)
    live = offs_s * SPLIT < length  # split 0 always holds key 0
    part = (row * heads + head) * NUM_SPLITS + offs_s
    m = tl.load(stats_ptr + part * 2, mask=live, other=float("-inf"))
    denom = tl.load(stats_ptr + part * 2 + 1, mask=live, other=0.0)
    acc = tl.load(part_ptr + part[:, None] * DIM + offs_d[None, :], mask=live[:, None], other=0.0)
    weight = tl.exp2(m - tl.max(m, axis=0))
    weight = tl.where(live, weight, 0.0)
    out = tl.sum(acc * weight[:, None], axis=0) / tl.sum(denom * weight, axis=0)
    tl.store(out_ptr + (row * heads + head) * DIM + offs_d, out.to(out_ptr.dtype.element_ty))


def split_size(rows: int, max_len: int) -> int:
    """Keys per split: one loop iteration while few (row, KV head) pairs run, longer splits for big batches
    (they already fill the GPU, and fewer splits mean less partial output to combine)."""
    size = BLOCK_N * triton.next_power_of_2(max(1, rows // 64))
    return min(size, BLOCK_N * triton.cdiv(max_len, BLOCK_N))


@triton_op("tritontts::decode_attention", mutates_args={})
def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    lengths: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Attention of `q [B, heads, dim]` over the first `lengths[b]` (at least 1) keys of row b of
    `k_cache`/`v_cache [B, kv_heads, max_seq_len, dim]` (views of the cache: no copy); returns
    `[B, heads * dim]`."""
    batch, heads, dim = q.shape
    kv_heads, max_len = k_cache.shape[1], k_cache.shape[2]
    groups = heads // kv_heads
    split = split_size(batch * kv_heads, max_len)
    num_splits = triton.cdiv(max_len, split)
    out = torch.empty(batch, heads * dim, device=q.device, dtype=q.dtype)
    direct = num_splits == 1
    shape = (1, 2) if direct else (batch * heads * num_splits, dim)
    part = torch.empty(shape, device=q.device, dtype=torch.float32)
    stats = torch.empty(shape[0], 2, device=q.device, dtype=torch.float32)
    wrap_triton(_split_kernel)[(num_splits, kv_heads, batch)](
        q,
        k_cache,
        v_cache,
        lengths,
        out,
        part,
        stats,
        max_len,
        scale * LOG2E,
        *q.stride(),
        *k_cache.stride(),
        *v_cache.stride(),
        lengths.stride(0),
        GROUPS=groups,
        G_PAD=max(16, triton.next_power_of_2(groups)),
        DIM=dim,
        SPLIT=split,
        NUM_SPLITS=num_splits,
        BLOCK=BLOCK_N,
        DIRECT=direct,
        IEEE=q.dtype == torch.float32,
        UPCAST=q.device.type == "cpu" and q.dtype == torch.bfloat16,
        num_warps=4,
        num_stages=2,
    )
    if not direct:
        wrap_triton(_combine_kernel)[(heads, batch)](
            lengths,
            out,
            part,
            stats,
            max_len,
            lengths.stride(0),
            DIM=dim,
            SPLIT=split,
            NUM_SPLITS=num_splits,
            S_PAD=triton.next_power_of_2(num_splits),
            num_warps=2,
        )
    return out
