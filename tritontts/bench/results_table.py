"""The benchmark files as loaded and the table pieces that RESULTS.md (results.py) and the pages' generated
blocks (results_views.py) both write with."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_GPU = re.compile(r"\b(GH200|GB200|B200|B100|H200|H100|H20|A100|A10G?|L40S|L40|L20|L4|T4|V100)\b")


@dataclass(frozen=True)
class BenchFile:
    """A benchmark JSON as loaded: its name relative to benchmarks/, whether archived, its data."""

    name: str
    archived: bool
    data: dict


def gpu_label(meta: dict) -> str:
    """A short name of the machine's GPU (H100, H200, ...), CPU where gpu_count is 0."""
    if meta["gpu_count"] == 0:
        return "CPU"
    found = _GPU.search(meta["device"])
    return found.group(1) if found else meta["device"].split(",")[0][:40]


def _cell(value: Any) -> str:
    if value is None:
        return "–"
    return str(value).replace("\n", " ").replace("|", "\\|")


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def headline_rows(
    files: list[BenchFile],
) -> tuple[list[tuple[BenchFile, dict]], list[tuple[BenchFile, dict]]]:
    """The serving rows and the metric rows of the files not archived, in RESULTS.md's order."""
    serving, metrics = [], []
    for file in files:
        if file.archived:
            continue
        for index, row in enumerate(file.data["headline"]):
            (metrics if "metric" in row else serving).append((file, index, row))
    serving.sort(
        key=lambda item: (
            item[2]["model"],
            item[2]["mode"],
            gpu_label(item[0].data["meta"]),
            item[2]["layout"],
            item[2].get("gpu_count", item[0].data["meta"]["gpu_count"]),
            item[2]["concurrency"],
            item[0].name,
            item[1],
        )
    )
    metrics.sort(key=lambda item: (item[2]["model"], item[0].name, item[1]))
    return [(f, r) for f, _, r in serving], [(f, r) for f, _, r in metrics]
