"""Static key/value buffers, one pair per layer: `[slots, kv_heads, max_seq_len, head_dim]` each."""

from __future__ import annotations

import torch

from tritontts.llm.config import Qwen2Config


class KVCache:
    def __init__(
        self, config: Qwen2Config, slots: int, max_seq_len: int, device: torch.device, dtype: torch.dtype
    ):
        shape = (slots, config.num_key_value_heads, max_seq_len, config.head_dim)
        layers = range(config.num_hidden_layers)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in layers]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in layers]
        self.max_seq_len = max_seq_len

    def move(self, src: int, dst: int, length: int) -> None:
        """Copy the first `length` positions of slot `src` into slot `dst`."""
        for buffer in (*self.k, *self.v):
            buffer[dst, :, :length] = buffer[src, :, :length]

    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in (*self.k, *self.v))
