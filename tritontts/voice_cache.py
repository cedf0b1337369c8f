"""A bounded cache of what a reference voice costs to compute, keyed by the audio's content."""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

import numpy as np

from tritontts.voice_store import SharedVoiceStore

V = TypeVar("V")


def audio_key(wav: np.ndarray, sample_rate: int, extra: str = "") -> str:
    """A content hash of the samples (as float32), the rate and any extra text such as a model name."""
    digest = hashlib.sha256()
    digest.update(np.ascontiguousarray(wav, dtype=np.float32).tobytes())
    digest.update(f"|{sample_rate}|{extra}".encode())
    return digest.hexdigest()


class VoiceCache(Generic[V]):
    """Thread-safe LRU map from `audio_key` to a value, holding at most `capacity` entries; with a `store`, what
    this process misses is looked up there (the voices the other instances computed) and what it puts is saved
    there too."""

    def __init__(self, capacity: int = 256, store: SharedVoiceStore[V] | None = None) -> None:
        self.capacity = capacity
        self.store = store if capacity > 0 else None
        self._items: OrderedDict[str, V] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> V | None:
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
                self.hits += 1
                return value
        value = self.store.load(key) if self.store is not None else None
        with self._lock:
            if value is None:
                self.misses += 1
                return None
            self.hits += 1
            self._remember(key, value)
            return value

    def put(self, key: str, value: V) -> None:
        if self.capacity <= 0:
            return
        with self._lock:
            self._remember(key, value)
        if self.store is not None:
            self.store.save(key, value)

    def _remember(self, key: str, value: V) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def get_or_compute(self, key: str, compute: Callable[[], V]) -> tuple[V, bool]:
        """The cached value and True, or `compute()` (then cached) and False."""
        value = self.get(key)
        if value is not None:
            return value, True
        value = compute()
        self.put(key, value)
        return value, False

    def __len__(self) -> int:
        return len(self._items)
