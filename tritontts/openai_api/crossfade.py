"""Joining overlapping streamed chunks as they arrive, the incremental form of `streaming.crossfade_concat`."""

from __future__ import annotations

import numpy as np


class StreamCrossfader:
    """Each chunk shares its first `overlap` samples with the previous chunk's last ones: `push` returns the
    audio that is final so far (holding back the tail the next chunk fades into), `finish` the held tail."""

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
