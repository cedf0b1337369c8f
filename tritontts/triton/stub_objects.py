"""Keeping python-backend objects alive until the stub's own threads are done with them.

The stub of tritonserver 2.51's python backend (r24.10) releases the numpy arrays of its tensors without
holding the GIL when the last reference to a tensor goes away on one of its C++ threads (python_backend #390,
fixed in r24.12). A decoupled BLS call is the common case: its response iterator sits in the stub's map until
the stub-to-parent thread erases it after the last response; if Python has already dropped the iterator, that
erase destroys every response and tensor of the stream on the C++ thread, and the arrays are freed while
Python code runs on another thread: heap corruption, then a segmentation fault in whatever allocates next.
Holding the iterator (and its request) here for `HOLD_S` seconds lets the stub erase its entry first, so the
last reference is always ours, released on a Python thread with the GIL.
"""

from __future__ import annotations

import gc
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

HOLD_S = 20.0


class Holder:
    """Objects kept for at least `hold_s` seconds; the expired ones are released by the next `hold`."""

    def __init__(self, hold_s: float = HOLD_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.hold_s = hold_s
        self.clock = clock
        self.held: deque[tuple[float, Any]] = deque()
        self.lock = threading.Lock()

    def hold(self, obj: Any) -> None:
        now = self.clock()
        expired = []
        with self.lock:
            self.held.append((now, obj))
            while self.held and now - self.held[0][0] > self.hold_s:
                expired.append(self.held.popleft())
        expired.clear()  # the last references, dropped here with the GIL

    def release(self) -> None:
        with self.lock:
            held, self.held = self.held, deque()
        held.clear()

    def __len__(self) -> int:
        return len(self.held)


_holder = Holder()


def hold_until_stub_done(obj: Any) -> None:
    """Keep `obj` (a BLS request, response iterator, tensors) out of the stub's C++ threads' reach."""
    _holder.hold(obj)


def release_held() -> None:
    """For a BLS's `finalize`: drop every held object now and collect it, while the stub can still tell the
    server; one destroyed in the stub's teardown, after its IPC is gone, crashes the stub at unload."""
    _holder.release()
    gc.collect()
