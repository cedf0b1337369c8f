"""Writing a benchmark's results: summary.json, a markdown table in the upstream runtimes' format, a PNG."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np

from tritontts.bench.stats import BenchmarkRun, LatencyStats, summarize

TABLE_COLUMNS = (
    "Mode",
    "Concurrency",
    "Requests",
    "Errors",
    "Avg Latency",
    "P50 Latency",
    "P90 Latency",
    "P99 Latency",
    "First Chunk Latency (Avg)",
    "First Chunk Latency (P50)",
    "RTF",
    "Throughput (audio s/s)",
)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.2f} ms"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _stat(stats: LatencyStats | None, name: str) -> float | None:
    return None if stats is None else getattr(stats, name)


def markdown_table(runs: Sequence[BenchmarkRun]) -> str:
    """One row per run; latencies in milliseconds, '-' where a value does not apply (e.g. offline first chunk)."""
    lines = ["| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "---|" * len(TABLE_COLUMNS)]
    for run in runs:
        s = summarize(run)
        cells = (
            s.mode.capitalize(),
            str(s.concurrency),
            str(s.requests),
            str(s.failed),
            _ms(_stat(s.latency, "avg")),
            _ms(_stat(s.latency, "p50")),
            _ms(_stat(s.latency, "p90")),
            _ms(_stat(s.latency, "p99")),
            _ms(_stat(s.first_chunk_latency, "avg")),
            _ms(_stat(s.first_chunk_latency, "p50")),
            _num(s.rtf),
            _num(s.throughput),
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def summary_dict(runs: Sequence[BenchmarkRun], metadata: dict | None = None) -> dict:
    """Everything a run measured: its metadata, each run's summary and every request's record."""
    return {
        **(metadata or {}),
        "runs": [
            {**summarize(run).to_dict(), "records": [asdict(r) | {"rtf": r.rtf} for r in run.records]}
            for run in runs
        ],
    }


def plot_latencies(runs: Sequence[BenchmarkRun], path: Path) -> None:
    """Left: the CDF of total latency per run. Right: a histogram of first-chunk latency of streaming runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (cdf_ax, hist_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
    for run in runs:
        latencies = sorted(r.latency * 1000 for r in run.records if r.ok)
        if latencies:
            fractions = [(i + 1) / len(latencies) for i in range(len(latencies))]
            cdf_ax.step(
                latencies, fractions, where="post", label=f"{run.mode}, concurrency {run.concurrency}"
            )
    cdf_ax.set(xlabel="total latency (ms)", ylabel="fraction of requests", title="Latency CDF")
    cdf_ax.grid(alpha=0.3)
    if cdf_ax.lines:
        cdf_ax.legend(fontsize="small")

    firsts_by_run = {
        run.concurrency: [
            r.first_chunk_latency * 1000 for r in run.records if r.ok and r.first_chunk_latency is not None
        ]
        for run in runs
        if run.mode == "streaming"
    }
    everything = [v for values in firsts_by_run.values() for v in values]
    if everything:
        bins = np.linspace(min(everything), max(everything) + 1e-6, 21)
        for concurrency, firsts in firsts_by_run.items():
            if firsts:
                hist_ax.hist(firsts, bins=bins, alpha=0.5, label=f"concurrency {concurrency}")
    hist_ax.set(xlabel="first-chunk latency (ms)", ylabel="requests", title="First-chunk latency (streaming)")
    if hist_ax.patches:
        hist_ax.legend(fontsize="small")
    else:
        hist_ax.text(0.5, 0.5, "no streaming results", ha="center", va="center", transform=hist_ax.transAxes)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=100)
    plt.close(fig)


def write_report(
    runs: Sequence[BenchmarkRun], log_dir: Path, metadata: dict | None = None
) -> dict[str, Path]:
    """Writes summary.json, summary.md and latency.png into `log_dir`; returns their paths by kind."""
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "json": log_dir / "summary.json",
        "markdown": log_dir / "summary.md",
        "plot": log_dir / "latency.png",
    }
    paths["json"].write_text(json.dumps(summary_dict(runs, metadata), indent=2, ensure_ascii=False) + "\n")
    paths["markdown"].write_text(markdown_table(runs))
    plot_latencies(runs, paths["plot"])
    return paths
