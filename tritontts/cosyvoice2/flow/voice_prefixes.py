"""Each voice's flow prefixes (tritontts.cosyvoice2.flow.prefix), kept while they fit a byte budget.

A voice's prompt mel comes first in every call of its streams. The prefixes over the prompt's whole chunks whose
encoder output no later token changes are the same for every call of the voice, so they are made once and shared;
the least recently used voice goes first when a new one would pass the budget."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable

import torch
from torch import Tensor

from tritontts.cosyvoice2.flow.prefix import LayerPrefix


def voice_key(prompt_tokens: Tensor, prompt_feat: Tensor, embedding: Tensor) -> str:
    """A digest of what a voice's flow prefix depends on."""
    digest = hashlib.sha256()
    for tensor in (prompt_tokens, prompt_feat, embedding):
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(str(tensor.dtype).encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def stable_prompt_frames(prompt_tokens: int, lookahead: int, chunk_tokens: int, token_mel_ratio: int) -> int:
    """The prompt's mel frames in whole chunks that no target token changes: a chunk of tokens is final once
    `lookahead` tokens after it are known."""
    return max(0, (prompt_tokens - lookahead) // chunk_tokens) * chunk_tokens * token_mel_ratio


class VoicePrefixes:
    """`get(key, make)`: the voice's prefixes, made by `make()` the first time; at most `budget_bytes` kept.
    `nbytes` and `made` are plain counters another thread may read."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self._kept: OrderedDict[str, list[LayerPrefix]] = OrderedDict()
        self._sizes: dict[str, int] = {}
        self.nbytes = 0
        self.made = 0

    def get(self, key: str, make: Callable[[], list[LayerPrefix]]) -> list[LayerPrefix]:
        if key in self._kept:
            self._kept.move_to_end(key)
            return self._kept[key]
        prefixes = make()
        self.made += 1
        size = sum(p.nbytes() for p in prefixes)
        if size <= self.budget_bytes:
            while self._kept and self.nbytes + size > self.budget_bytes:
                dropped, _ = self._kept.popitem(last=False)
                self.nbytes -= self._sizes.pop(dropped)
            self._kept[key] = prefixes
            self._sizes[key] = size
            self.nbytes += size
        return prefixes

    def __contains__(self, key: str) -> bool:
        return key in self._kept
