"""Later chunks make way for first chunks in token2wav's queue.

Under load a stream's first chunk waits in the token2wav model's queue behind other streams' later chunks, which
are larger and seldom urgent: once a stream plays, the audio it already sent covers the next chunk for a while.
The BLS instances of one server share a board in shared memory (`tritontts.triton.first_chunk_board`): an instance marks its slot while its stream's first chunk is asked of
token2wav, and an instance about to ask for a later chunk waits while another slot is marked, as long as its
listener still has more than `margin_s` of audio in hand. Every wait is bounded by that audio, so no stream
runs dry for it.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tritontts.triton.first_chunk_board import BOARD_DIR, FirstChunkHolder
from tritontts.triton.params import model_param

DEFAULT_MARGIN_S = 0.5
"""audio a listener keeps in hand while its later chunk waits: what a later chunk takes under load, and more"""
MAX_PENDING_S = 2.0
"""the longest one first chunk counts as pending (a stub that dies with its slot marked stops counting then)"""
POLL_S = 0.002


def pacing_board_path(model_repository: str | Path) -> Path:
    """The board of the BLS instances of one repository (`args["model_repository"]`: the model's own folder)."""
    repo = Path(model_repository).resolve().parent
    key = hashlib.sha1(f"{repo}|bls".encode()).hexdigest()[:16]
    return BOARD_DIR / f"tritontts-pending-first-chunks-{key}"


def chunk_pacer(config: dict, args: dict) -> ChunkPacer | None:
    """A BLS instance's pacer when its `chunk_pacing` parameter is true (default false), with
    `chunk_pacing_margin_s` (default 0.5)."""
    if not model_param(config, "chunk_pacing", bool, default=False):
        return None
    margin = model_param(config, "chunk_pacing_margin_s", float, default=DEFAULT_MARGIN_S)
    if margin < 0:
        raise ValueError(f"chunk_pacing_margin_s must be at least 0, got {margin}")
    holder = FirstChunkHolder(pacing_board_path(args["model_repository"]), max_hold_s=MAX_PENDING_S)
    return ChunkPacer(holder, margin)


@dataclass
class ChunkPacer:
    holder: FirstChunkHolder
    margin_s: float = DEFAULT_MARGIN_S
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep

    @contextmanager
    def first_chunk(self) -> Iterator[None]:
        """Marks this instance's slot while its stream's first chunk is asked for."""
        self.holder.hold()
        try:
            yield
        finally:
            self.holder.release()

    def wait_turn(self, audio_in_hand_s: float) -> float:
        """Before a later chunk: waits while another stream's first chunk is pending, until the listener would
        have only `margin_s` of audio left; returns the seconds waited."""
        start = self.clock()
        deadline = start + audio_in_hand_s - self.margin_s
        while self.clock() < deadline and self.holder.others_hold(self.clock()):
            self.sleep(POLL_S)
        return self.clock() - start

    def close(self) -> None:
        self.holder.close()
