"""Custom Triton metrics of the python-backend models."""

from __future__ import annotations

from typing import Any


def voice_cache_counters(pb_utils: Any, model_name: str) -> tuple[Any, Any]:
    """The (hits, misses) counters `tritontts_voice_cache_{hits,misses}_total{model=...}` of a model's voice cache."""
    counters = []
    for kind, what in (("hits", "found in the voice cache"), ("misses", "computed")):
        family = pb_utils.MetricFamily(
            name=f"tritontts_voice_cache_{kind}_total",
            description=f"reference audios whose results were {what}",
            kind=pb_utils.MetricFamily.COUNTER,
        )
        counters.append(family.Metric(labels={"model": model_name}))
    return counters[0], counters[1]
