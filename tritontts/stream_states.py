"""The per-stream state a streaming model keeps between the calls of one request id.

A stream normally ends with its final call, which drops its state. One that never makes it (a cancelled or
abandoned request, a caller that died) would hold its state for ever: the DiT token2wav keeps about 0.4 GB of
flow caches per stream on a full-size checkpoint, and a GPU soak with cancelled streams filled an H200 in
10 minutes. `StreamStates` therefore drops every state left untouched for `idle_timeout_s` whenever it is used.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

DEFAULT_IDLE_TIMEOUT_S = 60.0
"""Longer than any pause of a live stream: the BLS waits at most 30 s (bistream_idle_timeout_s) for text."""

S = TypeVar("S")


class StreamStates(Generic[S]):
    """States by stream id, each dropped when its stream ends (`pop`) or after `idle_timeout_s` unused."""

    def __init__(
        self, idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if idle_timeout_s <= 0:
            raise ValueError(f"idle_timeout_s must be > 0, got {idle_timeout_s}")
        self.idle_timeout_s = idle_timeout_s
        self._clock = clock
        self._states: dict[str, tuple[S, float]] = {}
        self._lock = threading.Lock()

    def _expire(self, now: float) -> None:
        quiet = [key for key, (_, used) in self._states.items() if now - used > self.idle_timeout_s]
        for key in quiet:
            del self._states[key]

    def get(self, stream_id: str) -> S | None:
        """The stream's state (None: a new stream, or one that went quiet for too long), marked as used."""
        now = self._clock()
        with self._lock:
            self._expire(now)
            entry = self._states.get(stream_id)
            if entry is None:
                return None
            self._states[stream_id] = (entry[0], now)
            return entry[0]

    def put(self, stream_id: str, state: S) -> None:
        now = self._clock()
        with self._lock:
            self._expire(now)
            self._states[stream_id] = (state, now)

    def holds(self, stream_id: str, state: S) -> bool:
        """Whether `state` is still the stream's (not dropped or replaced meanwhile); if so, marked as used."""
        now = self._clock()
        with self._lock:
            entry = self._states.get(stream_id)
            if entry is None or entry[0] is not state:
                return False
            self._states[stream_id] = (state, now)
            return True

    def pop(self, stream_id: str) -> None:
        """Drop a stream's state; nothing happens for an unknown id."""
        with self._lock:
            self._states.pop(stream_id, None)

    def ids(self) -> list[str]:
        """The open streams (those gone quiet for too long are dropped first)."""
        now = self._clock()
        with self._lock:
            self._expire(now)
            return list(self._states)

    def __getstate__(self) -> dict:
        """Copies (copy.deepcopy of a model) get a lock of their own."""
        state = self.__dict__.copy()
        del state["_lock"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
