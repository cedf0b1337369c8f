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


def _first_chunk_panel(ax, runs: Sequence[BenchmarkRun]) -> int:
    """A histogram of first-chunk latency per streaming run; returns the requests drawn."""
    firsts_by_run = {
        run.concurrency: [
            r.first_chunk_latency * 1000 for r in run.records if r.ok and r.first_chunk_latency is not None
        ]
        for run in runs
        if run.mode == "streaming"
    }
    everything = [v for values in firsts_by_run.values() for v in values]
    bins = np.linspace(min(everything), max(everything) + 1e-6, 21)
    for concurrency, firsts in firsts_by_run.items():
        if firsts:
            ax.hist(firsts, bins=bins, alpha=0.5, label=f"concurrency {concurrency}")
    ax.set(xlabel="first-chunk latency (ms)", ylabel="requests", title="First-chunk latency (streaming)")
    return len(everything)


def _latency_vs_audio_panel(ax, runs: Sequence[BenchmarkRun]) -> int:
    """Each request's latency against the seconds of audio it returned, with the real-time line (RTF 1):
    what an offline run has instead of a first chunk. Returns the requests drawn."""
    drawn = 0
    longest = 0.0
    for run in runs:
        points = [(r.audio_seconds, r.latency) for r in run.records if r.ok and r.audio_seconds > 0]
        if points:
            audio, latency = zip(*points)
            ax.scatter(audio, latency, s=14, alpha=0.7, label=f"{run.mode}, concurrency {run.concurrency}")
            drawn += len(points)
            longest = max(longest, *audio, *latency)
    if drawn:
        ax.plot([0, longest], [0, longest], color="grey", linestyle="--", linewidth=1, label="RTF 1")
    ax.set(xlabel="audio (s)", ylabel="latency (s)", title="Latency vs audio duration")
    return drawn


def plot_latencies(runs: Sequence[BenchmarkRun], path: Path) -> dict[str, int]:
    """Left: the CDF of total latency per run. Right: a histogram of first-chunk latency when there are
    streaming results, else each request's latency against its audio duration (offline runs have no first
    chunk). Returns the requests drawn per panel title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (cdf_ax, right_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
    drawn = {"Latency CDF": 0}
    for run in runs:
        latencies = sorted(r.latency * 1000 for r in run.records if r.ok)
        if latencies:
            fractions = [(i + 1) / len(latencies) for i in range(len(latencies))]
            cdf_ax.step(
                latencies, fractions, where="post", label=f"{run.mode}, concurrency {run.concurrency}"
            )
            drawn["Latency CDF"] += len(latencies)
    cdf_ax.set(xlabel="total latency (ms)", ylabel="fraction of requests", title="Latency CDF")
    cdf_ax.grid(alpha=0.3)
    if cdf_ax.lines:
        cdf_ax.legend(fontsize="small")

    streamed = any(
        r.ok and r.first_chunk_latency is not None
        for run in runs
        if run.mode == "streaming"
        for r in run.records
    )
    panel = _first_chunk_panel if streamed else _latency_vs_audio_panel
    count = panel(right_ax, runs)
    drawn[right_ax.get_title()] = count
    right_ax.grid(alpha=0.3)
    if count:
        right_ax.legend(fontsize="small")
    else:
        right_ax.text(
            0.5, 0.5, "no successful requests", ha="center", va="center", transform=right_ax.transAxes
        )
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=100)
    plt.close(fig)
    return drawn


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
