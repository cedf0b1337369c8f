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


class StreamCrossfader:
    """Joins chunks whose first `overlap` samples repeat the previous chunk's last ones, as they arrive: `push`
    returns the audio that is final so far (holding back the tail the next chunk fades into), `finish` the tail."""

    def __init__(self, overlap: int) -> None:
        self.overlap = max(0, overlap)
        self._tail = np.zeros(0, dtype=np.float32)
        self._first = True

    def push(self, chunk: np.ndarray) -> np.ndarray:
        chunk = np.asarray(chunk, dtype=np.float32).reshape(-1)
        if chunk.size == 0:
            return chunk
        if self._first:
            self._first = False
            head = np.zeros(0, dtype=np.float32)
        else:
            length = min(self._tail.size, chunk.size)
            fade_in = np.linspace(0.0, 1.0, self.overlap, dtype=np.float32)[:length]
            blended = chunk[:length] * fade_in + self._tail[:length] * (1.0 - fade_in)
            head, chunk = np.concatenate([blended, self._tail[length:]]), chunk[length:]
        keep = min(self.overlap, chunk.size)
        self._tail = chunk[chunk.size - keep :]
        return np.concatenate([head, chunk[: chunk.size - keep]])

    def finish(self) -> np.ndarray:
        tail, self._tail = self._tail, np.zeros(0, dtype=np.float32)
        return tail


def crossfade_concat(chunks: Sequence[np.ndarray], overlap_samples: int) -> np.ndarray:
    """Join chunks that overlap by `overlap_samples`, with a linear cross-fade over each overlap."""
    joiner = StreamCrossfader(overlap_samples)
    pieces = [joiner.push(chunk) for chunk in chunks]
    return np.concatenate([*pieces, joiner.finish()]) if pieces else np.zeros(0, dtype=np.float32)
