"""Cutting a token stream into overlapping audio chunks, and joining the chunks' audio again."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ChunkSchedule:
    """The upstream Spark-TTS streaming schedule, in tokens.

    The first chunk is emitted after `first_tokens`; each later chunk is `scale` times the previous, up to
    `max_tokens`. Consecutive chunks share `overlap_tokens`, which the client cross-fades.
    """

    first_tokens: int
    max_tokens: int
    scale: float
    overlap_tokens: int

    @classmethod
    def from_durations(
        cls,
        chunk_seconds: float,
        max_chunk_seconds: float,
        scale: float,
        overlap_seconds: float,
        token_rate: float,
    ) -> ChunkSchedule:
        if chunk_seconds <= 0 or max_chunk_seconds < chunk_seconds:
            raise ValueError("need 0 < audio_chunk_duration <= max_audio_chunk_duration")
        if scale < 1.0:
            raise ValueError("audio_chunk_size_scale_factor must be >= 1")
        first = math.ceil(chunk_seconds * token_rate)
        overlap = math.ceil(overlap_seconds * token_rate)
        if not 0 <= overlap < first:
            raise ValueError(
                "audio_chunk_overlap_duration must be >= 0 and shorter than audio_chunk_duration"
            )
        return cls(first, math.ceil(max_chunk_seconds * token_rate), scale, overlap)


class TokenChunker:
    """Collects generated tokens and hands out chunks as the schedule allows."""

    def __init__(self, schedule: ChunkSchedule) -> None:
        self.schedule = schedule
        self.pending: list[int] = []
        self.chunk_tokens = schedule.first_tokens
        self.emitted = 0

    def push(self, tokens: Sequence[int]) -> Iterator[list[int]]:
        self.pending.extend(int(t) for t in tokens)
        while len(self.pending) >= self.chunk_tokens:
            chunk = self.pending[: self.chunk_tokens]
            self.pending = self.pending[self.chunk_tokens - self.schedule.overlap_tokens :]
            self.chunk_tokens = min(self.schedule.max_tokens, int(self.chunk_tokens * self.schedule.scale))
            self.emitted += 1
            yield chunk

    def finish(self) -> list[int] | None:
        """The last chunk: whatever is left, including the overlap carried from the previous chunk."""
        if self.emitted and len(self.pending) <= self.schedule.overlap_tokens:
            return None
        chunk, self.pending = self.pending, []
        return chunk or None


def crossfade_concat(chunks: Sequence[np.ndarray], overlap_samples: int) -> np.ndarray:
    """Join chunks that overlap by `overlap_samples`, with a linear cross-fade over each overlap."""
    chunks = [np.asarray(c, dtype=np.float32).reshape(-1) for c in chunks]
    if not chunks:
        return np.zeros(0, dtype=np.float32)
    if len(chunks) == 1 or overlap_samples <= 0:
        return np.concatenate(chunks)
    fade_in = np.linspace(0.0, 1.0, overlap_samples, dtype=np.float32)
    pieces = [chunks[0][:-overlap_samples]]
    for previous, current in zip(chunks, chunks[1:]):
        pieces.append(current[:overlap_samples] * fade_in + previous[-overlap_samples:] * (1.0 - fade_in))
        pieces.append(current[overlap_samples:-overlap_samples])
    pieces.append(chunks[-1][-overlap_samples:])
    return np.concatenate(pieces)
