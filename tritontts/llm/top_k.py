"""The sampler's candidates, the k largest logits of each row, in Triton kernels.

`torch.topk` over a 166k vocabulary is a multi-block radix selection of ten-odd kernels: about 65 µs at batch 1
on an H100, 8% of a Spark-TTS decode step. Here each logit becomes one 64-bit key (an order-preserving image of
its fp32 bits above the complement of its id, so ties go to the lower id), every program keeps the top `K` of
one chunk of a row with a bitonic sort, and the same kernel runs on the winners until one chunk is left, whose
keys are unpacked into values and ids. No host sync, no data-dependent allocation: it runs inside CUDA graph
capture and, as a `torch.library.triton_op`, inside torch.compile.

Importing this module imports triton and registers `torch.ops.tritontts.top_k`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

CHUNK = 512
"""Keys one program sorts (of 256-1024, the fastest at batch 1, 16 and 64 on an H100 for k = 64). The
runner uses the kernels up to k = SMALL_TOP_K: at k = 1024 they are 2-7x slower than `torch.topk`."""
MAX_K = 1024
"""The largest k (rounded up to a power of two) the kernels select."""
HAS_TOPK = hasattr(tl, "topk")


@triton.jit
def _chunk_top_kernel(
    src_ptr,
    out_ptr,
    values_ptr,
    ids_ptr,
    n,
    k,
    width,
    stride_src,
    stride_out,
    FROM_LOGITS: tl.constexpr,
    LAST: tl.constexpr,
    CHUNK: tl.constexpr,
    K: tl.constexpr,
    USE_TOPK: tl.constexpr,
):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    offs = chunk * CHUNK + tl.arange(0, CHUNK)
    inside = offs < n
    if FROM_LOGITS:
        x = tl.load(src_ptr + row * stride_src + offs, mask=inside, other=0.0)
        bits = x.to(tl.uint32, bitcast=True)
        key = tl.where((bits >> 31) != 0, ~bits, bits | 0x80000000)
        packed = (key.to(tl.uint64) << 32) | (0xFFFFFFFF - offs.to(tl.uint32)).to(tl.uint64)
        packed = tl.where(inside, packed, 0)
    else:
        packed = tl.load(src_ptr + row * stride_src + offs, mask=inside, other=0)
    if USE_TOPK:
        top = tl.topk(packed, K)
        rank = tl.arange(0, K)
    else:
        top = tl.sort(packed, descending=True)
        rank = tl.arange(0, CHUNK)
    if LAST:
        key = (top >> 32).to(tl.uint32)
        bits = tl.where((key >> 31) != 0, key & 0x7FFFFFFF, ~key)
        ids = 0xFFFFFFFF - (top & 0xFFFFFFFF).to(tl.uint32)
        values = tl.where(rank < k, bits.to(tl.float32, bitcast=True), float("-inf"))
        tl.store(values_ptr + row * width + rank, values, mask=rank < width)
        tl.store(ids_ptr + row * width + rank, tl.where(rank < k, ids.to(tl.int64), 0), mask=rank < width)
        for start in range(K, width, K):
            fill = start + tl.arange(0, K)
            tl.store(
                values_ptr + row * width + fill, tl.full([K], float("-inf"), tl.float32), mask=fill < width
            )
            tl.store(ids_ptr + row * width + fill, tl.zeros([K], tl.int64), mask=fill < width)
    else:
        tl.store(out_ptr + row * stride_out + chunk * K + rank, top, mask=rank < K)


def padded_k(k: int) -> int:
    return 1 << max(k - 1, 0).bit_length()


def stage_sizes(n: int, k: int, chunk: int = CHUNK) -> list[int]:
    """Keys per row going into each launch: the row, then `chunks * K` winners, until one chunk is left."""
    width = padded_k(k)
    if n > chunk and 2 * width > chunk:
        raise ValueError(f"a chunk of {chunk} keys cannot reduce to the top {width}")
    sizes = [n]
    while sizes[-1] > chunk:
        sizes.append(triton.cdiv(sizes[-1], chunk) * width)
    return sizes


@triton_op("tritontts::top_k", mutates_args={})
def top_k(
    logits: torch.Tensor, k: int, width: int = 0, chunk: int = CHUNK, warps: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(values `[B, max(k, width)]` descending, their ids int64) of fp32 `logits [B, V]`, `k` <= min(V, MAX_K):
    the top `k`, then -inf with id 0 up to `width` (a sampler's fixed candidate count)."""
    batch, vocab = logits.shape
    if not 0 < k <= min(vocab, MAX_K) or (vocab > chunk and 2 * padded_k(k) > chunk):
        raise ValueError(f"top_k needs 0 < k <= min(vocab {vocab}, {MAX_K}, half the chunk {chunk}), got {k}")
    if logits.dtype != torch.float32 or logits.stride(1) != 1:
        raise ValueError("top_k takes fp32 logits with contiguous rows")
    columns, padded = max(k, width), padded_k(k)
    values = torch.empty(batch, columns, dtype=torch.float32, device=logits.device)
    ids = torch.empty(batch, columns, dtype=torch.int64, device=logits.device)
    sizes = stage_sizes(vocab, k, chunk)
    warps = warps or (8 if batch * triton.cdiv(vocab, chunk) <= 1024 else 1)
    src, stride = logits, logits.stride(0)
    for index, size in enumerate(sizes):
        last = index == len(sizes) - 1
        chunks = triton.cdiv(size, chunk)
        out = (
            values if last else torch.empty(batch, chunks * padded, dtype=torch.uint64, device=logits.device)
        )
        wrap_triton(_chunk_top_kernel)[(batch, chunks)](
            src,
            out,
            values,
            ids,
            size,
            k,
            columns,
            stride,
            out.stride(0),
            FROM_LOGITS=index == 0,
            LAST=last,
            CHUNK=chunk,
            K=padded,
            USE_TOPK=HAS_TOPK,
            num_warps=warps,
        )
        src, stride = out, out.stride(0)
    return values, ids
