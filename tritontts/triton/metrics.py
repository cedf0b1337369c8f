"""Custom Triton metrics of the python-backend models."""

from __future__ import annotations

from typing import Any


class VoiceCacheCounters:
    """`tritontts_voice_cache_{hits,misses}_total{model=...}` of a model's voice cache.

    Holds the metric families too: Triton drops a family's metrics when the family object is deleted.
    """

    def __init__(self, pb_utils: Any, model_name: str) -> None:
        self.families = [
            pb_utils.MetricFamily(
                name=f"tritontts_voice_cache_{kind}_total",
                description=f"reference audios whose results were {what}",
                kind=pb_utils.MetricFamily.COUNTER,
            )
            for kind, what in (("hits", "found in the voice cache"), ("misses", "computed"))
        ]
        self.hits, self.misses = (family.Metric(labels={"model": model_name}) for family in self.families)

    def count(self, hit: bool, n: int = 1) -> None:
        (self.hits if hit else self.misses).increment(n)
