"""Where a request's time goes: named stages, each lasting from the end of the one before (no torch here: the
torch-free BLS time their stages with it; `tritontts.devices.mark_on_device` ends a stage on a GPU)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class StageTimer:
    stages: dict[str, float] = field(default_factory=dict)
    """seconds per stage, in the order they were first marked"""
    last: float = field(default_factory=time.perf_counter)

    def mark(self, stage: str) -> None:
        """Ends `stage` now (a stage marked again adds to its time)."""
        now = time.perf_counter()
        self.stages[stage] = self.stages.get(stage, 0.0) + now - self.last
        self.last = now
