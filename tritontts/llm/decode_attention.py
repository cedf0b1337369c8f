"""Fused decode attention: one query per sequence against the static KV cache, in one or two Triton kernels.

Flash-decoding: the split kernel runs programs over (key split, KV head, row); each loads the queries of all
`groups` query heads that share its KV head, reads the cache buffers `[slots, kv_heads, max_seq_len, dim]`
in place and keeps an online softmax in fp32 over the keys of its split that the row may see, its first
`lengths[b]` (a tensor, so that one CUDA graph serves every length). The splits' partial outputs are combined
by a second kernel or, given a zeroed counter per (row, KV head), by the split that finishes last.

A decode step hands the kernel its q/k/v projection as it comes, with the rows' RoPE rows and positions: the
split kernel rotates the queries as it loads them, and the program whose split holds a row's position rotates
the new key and writes it, and the new value, into the cache before it reads its keys, so the step launches no
kernel for RoPE or the cache write. No host sync and no allocation that depends on the data, so it runs inside
CUDA graph capture and, as a `torch.library.triton_op`, inside torch.compile.

Importing this module imports triton and registers the op `torch.ops.tritontts.decode_attention`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from tritontts.llm.pdl import gdc_launch_dependents, gdc_wait, launch_options

BLOCK_N = 64  # keys per loop iteration of a split
LOG2E = 1.4426950408889634
FOLD_COMBINE = True
"""True: the last split of a (row, KV head) to finish combines, counted with the op's `counters` (no second
kernel); False: the combine kernel. Read when the op is traced: compiled callers keep the value they were compiled
with (inductor's caches too)."""


@triton.jit
def _dot(a, b, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    """fp32 products; UPCAST: bf16 operands widened first (exact), as Triton's CPU interpreter needs."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    return tl.dot(a, b)


@triton.jit
def _rotate(x_ptrs, half_ptrs, mask, cos, sin, DIM: tl.constexpr):
    """Rotate-half RoPE of the rows at `x_ptrs` (their halves swapped at `half_ptrs`): x * cos + [-x2, x1] * sin,
    in fp32, rounded to the input's dtype."""
    offs_d = tl.arange(0, DIM)
    x = tl.load(x_ptrs, mask=mask, other=0.0)
    x_half = tl.load(half_ptrs, mask=mask, other=0.0)
    sign = tl.where(offs_d < DIM // 2, -1.0, 1.0)
    rotated = x.to(tl.float32) * cos[None, :] + x_half.to(tl.float32) * (sign * sin)[None, :]
    return rotated.to(x.dtype)


@triton.jit
def _combine(part_ptr, stats_ptr, base, length, DIM: tl.constexpr, SPLIT: tl.constexpr, S_PAD: tl.constexpr):
    """The output of one query head from its splits' partial sums at `base` (part index of split 0)."""
    offs_s = tl.arange(0, S_PAD)
    offs_d = tl.arange(0, DIM)
    live = offs_s * SPLIT < length  # split 0 always holds key 0
    part = base + offs_s
    m = tl.load(stats_ptr + part * 2, mask=live, other=float("-inf"))
    denom = tl.load(stats_ptr + part * 2 + 1, mask=live, other=0.0)
    acc = tl.load(part_ptr + part[:, None] * DIM + offs_d[None, :], mask=live[:, None], other=0.0)
    weight = tl.exp2(m - tl.max(m, axis=0))
    weight = tl.where(live, weight, 0.0)
    return tl.sum(acc * weight[:, None], axis=0) / tl.sum(denom * weight, axis=0)


@triton.jit
def _combine_groups(part_ptr, stats_ptr, first_head, length, GROUPS: tl.constexpr, G_PAD: tl.constexpr,
                    DIM: tl.constexpr, SPLIT: tl.constexpr, NUM_SPLITS: tl.constexpr, CHUNK: tl.constexpr):  # fmt: skip
    """The outputs `[G_PAD, DIM]` of query heads first_head.. (a KV head's group) from their live splits'
    partial sums, CHUNK splits at a time for all heads at once; read past L1 (other programs wrote them)."""
    offs_g = tl.arange(0, G_PAD)
    offs_d = tl.arange(0, DIM)
    g_mask = offs_g < GROUPS
    live = tl.cdiv(length, SPLIT)
    m_run = tl.full([G_PAD], -1e30, dtype=tl.float32)
    denom = tl.zeros([G_PAD], dtype=tl.float32)
    acc = tl.zeros([G_PAD, DIM], dtype=tl.float32)
    for s0 in range(0, live, CHUNK):
        offs_s = s0 + tl.arange(0, CHUNK)
        mask = g_mask[:, None] & (offs_s < live)[None, :]
        part = (first_head + offs_g[:, None]) * NUM_SPLITS + offs_s[None, :]
        m = tl.load(stats_ptr + part * 2, mask=mask, other=-1e30, cache_modifier=".cg")
        d = tl.load(stats_ptr + part * 2 + 1, mask=mask, other=0.0, cache_modifier=".cg")
        a = tl.load(part_ptr + part[:, :, None] * DIM + offs_d[None, None, :], mask=mask[:, :, None], other=0.0,
                    cache_modifier=".cg")  # fmt: skip
        m_new = tl.maximum(m_run, tl.max(m, axis=1))
        rescale = tl.exp2(m_run - m_new)
        weight = tl.where(mask, tl.exp2(m - m_new[:, None]), 0.0)
        denom = denom * rescale + tl.sum(d * weight, axis=1)
        acc = acc * rescale[:, None] + tl.sum(a * weight[:, :, None], axis=1)
        m_run = m_new
    return acc / tl.where(g_mask, denom, 1.0)[:, None]


@triton.jit
def _split_kernel(
    q_ptr,
    nk_ptr,
    nv_ptr,
    k_ptr,
    v_ptr,
    len_ptr,
    pos_ptr,
    cos_ptr,
    sin_ptr,
    out_ptr,
    part_ptr,
    stats_ptr,
    count_ptr,
    first_slot,
    max_len,
    scale_log2,
    stride_cb,
    stride_qb,
    stride_qh,
    stride_qd,
    stride_nb,
    stride_nh,
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
    ROPE: tl.constexpr,
    WRITE: tl.constexpr,
    FOLD: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:  # the cache and the q/k/v projection are read only after the kernels before have ended
        gdc_launch_dependents()
        gdc_wait()
    split = tl.program_id(0)
    kv_head = tl.program_id(1)
    row = tl.program_id(2)
    heads = tl.num_programs(1) * GROUPS
    length = tl.minimum(tl.maximum(tl.load(len_ptr + row * stride_len), 1), max_len).to(tl.int32)
    start = split * SPLIT
    end = tl.minimum(start + SPLIT, length)

    offs_g = tl.arange(0, G_PAD)
    offs_d = tl.arange(0, DIM)
    half = (offs_d + DIM // 2) % DIM
    head = kv_head * GROUPS + offs_g
    g_mask = offs_g < GROUPS
    k_base = k_ptr + (first_slot + row).to(tl.int64) * stride_ks + kv_head * stride_kh
    v_base = v_ptr + (first_slot + row).to(tl.int64) * stride_vs + kv_head * stride_vh
    if ROPE:
        cos = tl.load(cos_ptr + row * stride_cb + offs_d).to(tl.float32)
        sin = tl.load(sin_ptr + row * stride_cb + offs_d).to(tl.float32)
    q_rows = q_ptr + row * stride_qb + head[:, None] * stride_qh
    if ROPE:
        q = _rotate(q_rows + offs_d[None, :] * stride_qd, q_rows + half[None, :] * stride_qd, g_mask[:, None],
                    cos, sin, DIM)  # fmt: skip
    else:
        q = tl.load(q_rows + offs_d[None, :] * stride_qd, mask=g_mask[:, None], other=0.0)
    if WRITE:  # the split holding the row's position writes its new key and value there first
        position = tl.load(pos_ptr + row)
        here = (offs_d * 0 + position >= start) & (offs_d * 0 + position < start + SPLIT)
        new = nk_ptr + row * stride_nb + kv_head * stride_nh
        if ROPE:
            key = _rotate(new + offs_d[None, :], new + half[None, :], here[None, :], cos, sin, DIM)
        else:
            key = tl.load(new + offs_d[None, :], mask=here[None, :], other=0.0)
        value = tl.load(nv_ptr + row * stride_nb + kv_head * stride_nh + offs_d, mask=here, other=0.0)
        tl.store(k_base + position * stride_kt + offs_d[None, :] * stride_kd, key, mask=here[None, :])
        tl.store(v_base + position * stride_vt + offs_d * stride_vd, value, mask=here)
        tl.debug_barrier()  # this program's loads below see its stores

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
    elif start < length:
        part = (row * heads + head) * NUM_SPLITS + split
        tl.store(part_ptr + part[:, None] * DIM + offs_d[None, :], acc, mask=g_mask[:, None])
        tl.store(stats_ptr + part * 2, m, mask=g_mask)
        tl.store(stats_ptr + part * 2 + 1, denom, mask=g_mask)
        if FOLD:  # the last live split of this (row, KV head) combines
            # Every thread's stores, then one thread's acq_rel atomic at GPU scope (as cooperative groups' grid
            # sync orders them): the last to count sees all splits' partial sums, read past L1.
            tl.debug_barrier()
            counter = count_ptr + row * tl.num_programs(1) + kv_head
            done = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
            if done == tl.cdiv(length, SPLIT) - 1:
                tl.atomic_xchg(counter, 0, sem="relaxed", scope="gpu")
                tl.debug_barrier()
                first = row * heads + kv_head * GROUPS
                out = _combine_groups(
                    part_ptr, stats_ptr, first, length, GROUPS, G_PAD, DIM, SPLIT, NUM_SPLITS, 8
                )
                out_offs = (first + offs_g[:, None]) * DIM + offs_d[None, :]
                tl.store(out_ptr + out_offs, out.to(out_ptr.dtype.element_ty), mask=g_mask[:, None])


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
    out = _combine(part_ptr, stats_ptr, (row * heads + head) * NUM_SPLITS, length, DIM, SPLIT, S_PAD)
    tl.store(out_ptr + (row * heads + head) * DIM + tl.arange(0, DIM), out.to(out_ptr.dtype.element_ty))


def split_size(rows: int, max_len: int) -> int:
    """Keys per split: one loop iteration while few (row, KV head) pairs run, longer splits for big batches
    (they already fill the GPU, and fewer splits mean less partial output to combine)."""
    size = BLOCK_N * triton.next_power_of_2(max(1, rows // 64))
    return min(size, BLOCK_N * triton.cdiv(max_len, BLOCK_N))


@triton_op("tritontts::decode_attention", mutates_args={"k_cache", "v_cache", "counters"})
def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    lengths: torch.Tensor,
    scale: float,
    counters: torch.Tensor,
    cos: torch.Tensor | None = None,
    sin: torch.Tensor | None = None,
    first_slot: int = 0,
    new_k: torch.Tensor | None = None,
    new_v: torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
    pdl: bool = False,
) -> torch.Tensor:
    """Attention of `q [B, heads, dim]` over the first `lengths[b]` (at least 1) keys of cache row
    `first_slot + b` of `k_cache`/`v_cache [slots, kv_heads, max_seq_len, dim]` (read in place); returns
    `[B, heads * dim]`.

    With `cos`, `sin` `[B, dim]` (rows of contiguous features), the queries are rotated by them first
    (rotate-half RoPE). With `new_k`, `new_v` `[B, kv_heads, dim]` (contiguous features) and `positions [B]`,
    each row's new key (rotated, given `cos`) and value are written into its cache row at its position first.
    `counters`: int32 zeros, one per row and KV head (left zeroed), with which the last split combines (where
    FOLD_COMBINE says so; a mutable argument may not be optional in torch 2.11, so it is always passed). `pdl`:
    launched with programmatic dependent launch (`tritontts.llm.pdl`; eager callers only)."""
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
    fold = FOLD_COMBINE and not direct
    write = new_k is not None
    wrap_triton(_split_kernel)[(num_splits, kv_heads, batch)](
        q,
        new_k if write else q,
        new_v if write else q,
        k_cache,
        v_cache,
        lengths,
        positions if write else lengths,
        cos if cos is not None else q,
        sin if sin is not None else q,
        out,
        part,
        stats,
        counters if fold else lengths,
        first_slot,
        max_len,
        scale * LOG2E,
        cos.stride(0) if cos is not None else 0,
        *q.stride(),
        *(new_k.stride()[:2] if write else (0, 0)),
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
        ROPE=cos is not None,
        WRITE=write,
        FOLD=fold,
        PDL=pdl,
        num_warps=4,
        num_stages=2,
        **launch_options(pdl),
    )
    if not direct and not fold:
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
