"""Looking up a synthetic checkpoint's preset (`tiny`, `full`, ...) by name."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

V = TypeVar("V")


def preset_entry(presets: Mapping[str, V], preset: str) -> V:
    """`presets[preset]`, or a ValueError naming the preset and the known ones."""
    if preset not in presets:
        raise ValueError(f"unknown preset {preset!r}; choose from {sorted(presets)}")
    return presets[preset]
