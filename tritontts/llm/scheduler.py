"""Who runs this step: waiting requests take free slots; running ones stay compact in slots [0, n)."""

from __future__ import annotations

from collections import deque

from tritontts.llm.sequence import Sequence


class Scheduler:
    def __init__(self, max_batch_size: int):
        self.max_batch_size = max_batch_size
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # running[i].slot == i

    def __len__(self) -> int:
        return len(self.waiting) + len(self.running)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def admit(self) -> Sequence | None:
        """The next waiting request, placed in the first free slot, or None when full or nothing waits."""
        if not self.waiting or len(self.running) >= self.max_batch_size:
            return None
        seq = self.waiting.popleft()
        seq.slot = len(self.running)
        self.running.append(seq)
        return seq

    def release(self, seq: Sequence) -> tuple[int, int] | None:
        """Take `seq` out. Returns (src, dst) when the last running sequence moved into its slot.

        Release several sequences in descending slot order so that the one moved is never a released one.
        """
        if seq in self.waiting:
            self.waiting.remove(seq)
            return None
        slot = seq.slot
        seq.slot = None
        last = self.running.pop()
        if last is seq:
            return None
        self.running[slot] = last
        last.slot = slot
        return len(self.running), slot

    def find(self, request_id: int) -> Sequence | None:
        for seq in (*self.running, *self.waiting):
            if seq.request_id == request_id:
                return seq
        return None
