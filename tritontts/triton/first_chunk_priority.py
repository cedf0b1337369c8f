"""First chunks before LLM steps on a shared GPU: the LLM engine holds its next decode step while a token2wav
instance on the same GPU computes a stream's first chunk, as long as every stream it decodes has audio in hand
to cover the wait.

Two processes take turns on a GPU (without MPS they time-slice): a token2wav first chunk that takes 38 ms alone
took 56 ms beside a decoding LLM on an H200 (docs/gpu-hosts.md). Once a stream's first chunk is being made, its
LLM tokens are far ahead of what the listener needs (25 speech tokens a second of audio; the engine makes
hundreds a second), so the LLM can wait.

The token2wav instances of one server and GPU share a small board in shared memory: one slot per instance, the
monotonic time until which it holds the GPU for a first chunk (a bounded hold: a stub that dies holding it
stops counting once that time passes). The LLM engine reads the board before each step (`YieldToFirstChunks`).
"""

from __future__ import annotations

import fcntl
import hashlib
import mmap
import os
import time
from collections.abc import Callable, Iterator
from collections.abc import Sequence as Seq
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from tritontts.llm.sequence import Sequence
from tritontts.processes import pid_alive
from tritontts.triton.params import model_param

SLOTS = 64
ENTRY = np.dtype([("pid", "<i8"), ("until", "<f8")])
BOARD_DIR = Path("/dev/shm")
DEFAULT_MAX_HOLD_S = 0.2
"""the longest one first chunk holds the LLM: a hold past it ends even if the chunk is not done"""
REOPEN_EVERY_S = 1.0


def board_path(model_repository: str | Path, device: torch.device) -> Path:
    """The board of the models of one repository on one device (`args["model_repository"]` of any of them: the
    model's own folder; its parent is the repository)."""
    repo = Path(model_repository).resolve().parent
    index = device.index
    if device.type == "cuda" and index is None:
        index = torch.cuda.current_device()
    key = hashlib.sha1(f"{repo}|{device.type}:{index}".encode()).hexdigest()[:16]
    return BOARD_DIR / f"tritontts-first-chunks-{key}"


def first_chunk_holder(config: dict, args: dict, device: torch.device) -> FirstChunkHolder | None:
    """A token2wav instance's holder when its `first_chunk_priority` parameter is true (default false)."""
    if not model_param(config, "first_chunk_priority", bool, default=False):
        return None
    return FirstChunkHolder(board_path(args["model_repository"], device))


def llm_pause_check(config: dict, args: dict, device: torch.device) -> YieldToFirstChunks | None:
    """The LLM engine's pause check when its `first_chunk_priority` parameter is true (default false), with
    `audio_tokens_per_s` (default 25, CosyVoice's speech tokens) and `first_chunk_tokens` (default 18: the
    BLS's token_hop_len + pre_lookahead_len)."""
    if not model_param(config, "first_chunk_priority", bool, default=False):
        return None
    rate = model_param(config, "audio_tokens_per_s", float, default=25.0)
    first_chunk = model_param(config, "first_chunk_tokens", int, default=18)
    return YieldToFirstChunks(board_path(args["model_repository"], device), rate, first_chunk)


def _map(path: Path, create: bool) -> tuple[mmap.mmap, np.ndarray] | None:
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
        mapped = _map(path, create=True)
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

    def close(self) -> None:
        """Frees the slot; the last holder of a board removes its file."""
        if self._memory is None:
            return
        with open(self.path, "r+b") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            self._entries[self.slot] = (0, 0.0)
            if not any(int(p) and pid_alive(int(p)) for p in self._entries["pid"]):
                self.path.unlink(missing_ok=True)
        _unmap(self)


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


def _unmap(owner: FirstChunkHolder | YieldToFirstChunks) -> None:
    memory, owner._memory, owner._entries = owner._memory, None, None
    try:
        memory.close()
    except BufferError:  # a view of the entries still alive somewhere: the mapping goes with it
        pass


@dataclass
class YieldToFirstChunks:
    """The LLM engine's pause check (LLMEngine `pause_check`): seconds its next step may still wait.

    It waits while some token2wav instance of its board holds the GPU, and only while each running sequence
    has the tokens of its own first chunk (`first_chunk_tokens`) and has streamed more audio than the hold can
    still last: `tokens / audio_tokens_per_s` seconds of audio since its first token, less the time since
    then. A sequence short of either keeps the engine stepping."""

    path: Path
    audio_tokens_per_s: float
    first_chunk_tokens: int = 0
    clock: Callable[[], float] = time.monotonic
    _entries: np.ndarray | None = field(default=None, repr=False)
    _memory: mmap.mmap | None = field(default=None, repr=False)
    _next_open: float = 0.0

    def _board(self, now: float) -> np.ndarray | None:
        if self._entries is None and now >= self._next_open:
            self._next_open = now + REOPEN_EVERY_S
            mapped = _map(self.path, create=False)
            if mapped is not None:
                self._memory, self._entries = mapped
        return self._entries

    def __call__(self, running: Seq[Sequence]) -> float:
        now = self.clock()
        entries = self._board(now)
        if entries is None or not running:
            return 0.0
        hold = float(entries["until"].max()) - now
        if hold <= 0:
            return 0.0
        for seq in running:
            if seq.first_token_at is None or len(seq.output_ids) < self.first_chunk_tokens:
                return 0.0
            ahead = len(seq.output_ids) / self.audio_tokens_per_s - (now - seq.first_token_at)
            if ahead < hold:
                return 0.0
        return hold

    def close(self) -> None:
        if self._memory is not None:
            _unmap(self)
