"""Latency statistics of a benchmark run: pure functions over per-request records, no I/O.

Percentiles use linear interpolation between the two nearest ranks (numpy's default, "linear"): for sorted
values x[0..n-1] and percentile q, the rank is r = q / 100 * (n - 1) and the result is
x[floor(r)] + (r - floor(r)) * (x[ceil(r)] - x[floor(r)]).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

PERCENTILES = (50, 90, 95, 99)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0 <= q <= 100) of `values` by linear interpolation between closest ranks."""
    if not values:
        raise ValueError("percentile of an empty list")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be in [0, 100], got {q}")
    ordered = sorted(float(v) for v in values)
    rank = q / 100 * (len(ordered) - 1)
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (rank - low) * (ordered[high] - ordered[low])


@dataclass(frozen=True)
class LatencyStats:
    """Seconds."""

    count: int
    avg: float
    p50: float
    p90: float
    p95: float
    p99: float
    min: float
    max: float

    @classmethod
    def of(cls, values: Sequence[float]) -> LatencyStats | None:
        if not values:
            return None
        p50, p90, p95, p99 = (percentile(values, q) for q in PERCENTILES)
        return cls(len(values), sum(values) / len(values), p50, p90, p95, p99, min(values), max(values))


@dataclass(frozen=True)
class RequestRecord:
    """One request: its latencies in seconds, the seconds of audio it returned, or the error it failed with."""

    id: str
    latency: float
    audio_seconds: float = 0.0
    first_chunk_latency: float | None = None
    chunks: int = 0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def rtf(self) -> float | None:
        return self.latency / self.audio_seconds if self.ok and self.audio_seconds > 0 else None


@dataclass
class BenchmarkRun:
    """All requests of one run at one concurrency, and the wall time the whole run took."""

    mode: str
    concurrency: int
    wall_seconds: float
    records: list[RequestRecord] = field(default_factory=list)


@dataclass(frozen=True)
class RunSummary:
    mode: str
    concurrency: int
    requests: int
    succeeded: int
    failed: int
    errors: list[dict[str, str]]
    wall_seconds: float
    audio_seconds: float
    rtf: float | None
    throughput: float | None
    latency: LatencyStats | None
    first_chunk_latency: LatencyStats | None

    def to_dict(self) -> dict:
        return asdict(self)


def summarize(run: BenchmarkRun) -> RunSummary:
    """Overall RTF is the run's wall time over the total seconds of audio; throughput is the inverse
    (audio seconds produced per wall-clock second). Failed requests count in `failed` and `errors` only."""
    ok = [r for r in run.records if r.ok]
    audio = sum(r.audio_seconds for r in ok)
    first_chunks = [r.first_chunk_latency for r in ok if r.first_chunk_latency is not None]
    return RunSummary(
        mode=run.mode,
        concurrency=run.concurrency,
        requests=len(run.records),
        succeeded=len(ok),
        failed=len(run.records) - len(ok),
        errors=[{"id": r.id, "error": str(r.error)} for r in run.records if not r.ok],
        wall_seconds=run.wall_seconds,
        audio_seconds=audio,
        rtf=run.wall_seconds / audio if audio > 0 else None,
        throughput=audio / run.wall_seconds if audio > 0 and run.wall_seconds > 0 else None,
        latency=LatencyStats.of([r.latency for r in ok]),
        first_chunk_latency=LatencyStats.of(first_chunks),
    )
