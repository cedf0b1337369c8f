"""A board in shared memory on which processes mark the first chunks they make or wait for: one slot per process,
the monotonic time until which it holds (a bounded hold: a process that dies holding stops counting once that time
passes). `tritontts.triton.first_chunk_priority` (token2wav instances hold, the LLM engine reads) and
`tritontts.triton.chunk_pacing` (BLS instances hold and read) keep their boards here."""

from __future__ import annotations

import fcntl
import mmap
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from tritontts.processes import pid_alive

SLOTS = 64
ENTRY = np.dtype([("pid", "<i8"), ("until", "<f8")])
BOARD_DIR = Path("/dev/shm")
DEFAULT_MAX_HOLD_S = 0.2
"""the longest one first chunk holds: a hold past it ends even if the chunk is not done"""


def map_board(path: Path, create: bool) -> tuple[mmap.mmap, np.ndarray] | None:
    flags = os.O_RDWR | (os.O_CREAT if create else 0)
    try:
        fd = os.open(path, flags, 0o600)
    except FileNotFoundError:
        return None
    try:
        with open(fd, "r+b", closefd=False) as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            if os.fstat(fd).st_size < SLOTS * ENTRY.itemsize:
                os.ftruncate(fd, SLOTS * ENTRY.itemsize)
            fcntl.flock(handle, fcntl.LOCK_UN)
        memory = mmap.mmap(fd, SLOTS * ENTRY.itemsize)
    finally:
        os.close(fd)
    return memory, np.frombuffer(memory, dtype=ENTRY)


class FirstChunkHolder:
    """A token2wav instance's slot on its board: `hold()` before computing first chunks, `release()` after."""

    def __init__(self, path: Path, max_hold_s: float = DEFAULT_MAX_HOLD_S) -> None:
        self.path = path
        self.max_hold_s = max_hold_s
        mapped = map_board(path, create=True)
        assert mapped is not None
        self._memory, self._entries = mapped
        self.slot = self._claim()

    def _claim(self) -> int:
        pid = os.getpid()
        with open(self.path, "r+b") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            for slot, entry in enumerate(self._entries):
                owner = int(entry["pid"])
                if owner in (0, pid) or not pid_alive(owner):
                    self._entries[slot] = (pid, 0.0)
                    return slot
        raise RuntimeError(f"{self.path}: all {SLOTS} slots are held by running processes")

    def hold(self) -> None:
        self._entries["until"][self.slot] = time.monotonic() + self.max_hold_s

    def release(self) -> None:
        self._entries["until"][self.slot] = 0.0

    def others_hold(self, now: float) -> bool:
        """Whether another slot of the board holds at `now` (monotonic seconds)."""
        if self._entries is None:
            return False
        until = self._entries["until"].copy()
        until[self.slot] = 0.0
        return bool((until > now).any())

    def close(self) -> None:
        """Frees the slot; the last holder of a board removes its file."""
        if self._memory is None:
            return
        with open(self.path, "r+b") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            self._entries[self.slot] = (0, 0.0)
            if not any(int(p) and pid_alive(int(p)) for p in self._entries["pid"]):
                self.path.unlink(missing_ok=True)
        unmap(self)


@contextmanager
def holding(holder: FirstChunkHolder | None, first_chunk: bool) -> Iterator[None]:
    """Holds the LLM on `holder`'s board for the block when it makes a first chunk."""
    if holder is None or not first_chunk:
        yield
        return
    holder.hold()
    try:
        yield
    finally:
        holder.release()


def unmap(owner: Any) -> None:
    """Closes `owner`'s mapping of a board (`_memory`, `_entries`)."""
    memory, owner._memory, owner._entries = owner._memory, None, None
    try:
        memory.close()
    except BufferError:  # a view of the entries still alive somewhere: the mapping goes with it
        pass
