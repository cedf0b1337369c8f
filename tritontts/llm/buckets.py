"""The padded sizes the runner captures graphs for: batch, key-length and prompt-length buckets."""

from __future__ import annotations

import bisect


def prefill_chunks(lengths: list[int], max_tokens: int) -> list[int]:
    """Ends of consecutive runs of prompts whose right-padded size (count * longest) stays within
    `max_tokens`; a longer prompt runs alone."""
    ends, count, longest = [], 0, 0
    for i, length in enumerate(lengths):
        if count and (count + 1) * max(longest, length) > max_tokens:
            ends.append(i)
            count, longest = 0, 0
        count, longest = count + 1, max(longest, length)
    return [*ends, len(lengths)]


def batch_buckets(max_batch_size: int) -> list[int]:
    sizes = [1, 2, 4, 8]
    sizes += list(range(16, max_batch_size + 1, 16))
    return sorted({s for s in sizes if s < max_batch_size} | {max_batch_size})


def kv_buckets(max_seq_len: int) -> list[int]:
    """Key lengths a decode step attends to: 256, 512, 1024, ... below `max_seq_len`, then `max_seq_len`."""
    sizes = [256 << i for i in range(16) if 256 << i < max_seq_len]
    return [*sizes, max_seq_len]


def prefill_buckets(max_seq_len: int) -> list[int]:
    """Padded prompt lengths with a prefill graph (prompts must be shorter than `max_seq_len`)."""
    return [
        n for n in (32, 64, 96, 128, 192, 256, 320, 384, 448, 512, 640, 768, 896, 1024) if n < max_seq_len
    ]


def bucket_of(buckets: list[int], n: int) -> int:
    return buckets[bisect.bisect_left(buckets, n)]
