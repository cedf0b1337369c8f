"""The GPU soak's figures (scripts/soak_traffic.py): per-request records and memory samples folded into fixed
time windows, the run's totals, and its verdicts against issue 38's targets. Pure functions and one aggregator, no
I/O.

A request belongs to the window of its start; a memory sample to the window of its time. Each window keeps its
streaming first-chunk times (one float each: a few thousand per minute at c=16) and the largest value of each
process's memory; raw records are kept only as the last `raw_rows` and the first `error_rows` errors, so memory
stays bounded however long the run.

Flat, as judged here: the last window's value is at most (1 + tolerance) times the first window's (growth only; a
value that falls is flat). The first and last windows compared are the first and last with any such value.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass

from tritontts.bench.stats import percentile

KINDS = ("stream_saved", "stream_new", "offline", "cancel")
"""streaming with a saved voice, streaming with a new voice (reference in the request), a whole file, and a
stream the client closes after its first chunk"""
STREAMING = ("stream_saved", "stream_new", "cancel")
MIB = 2**20


@dataclass(frozen=True)
class Record:
    start_s: float  # since the run's start
    target: str
    kind: str
    status: int  # HTTP status; 0 when no response came
    outcome: str  # ok | cancelled | error
    first_chunk_ms: float | None = None
    total_ms: float | None = None
    audio_s: float = 0.0
    error: str = ""


def p(values: list[float], q: float) -> float | None:
    return round(percentile(values, q), 1) if values else None


def growth(first: float | None, last: float | None) -> float | None:
    """(last - first) / first, None when either is missing or first is 0."""
    if first is None or last is None or first <= 0:
        return None
    return round((last - first) / first, 4)


def flat(first: float | None, last: float | None, tolerance: float) -> bool | None:
    """last <= first * (1 + tolerance); None when not measured."""
    change = growth(first, last)
    return None if change is None else change <= tolerance


class _Window:
    def __init__(self) -> None:
        self.requests = {k: 0 for k in KINDS}
        self.errors = {k: 0 for k in KINDS}
        self.cancelled = 0
        self.audio_s = 0.0
        self.first_chunk: dict[str, list[float]] = {}  # by target
        self.offline_ms: list[float] = []
        self.rss: dict[str, int] = {}
        self.gpu: dict[str, float] = {}
        self.gpu_total: float | None = None
        self.samples = 0

    def summary(self, index: int, seconds: float) -> dict:
        every = [v for values in self.first_chunk.values() for v in values]
        return {
            "window": index,
            "start_s": index * seconds,
            "requests": dict(self.requests),
            "errors": dict(self.errors),
            "cancelled": self.cancelled,
            "audio_s": round(self.audio_s, 1),
            "first_chunk_ms": {"count": len(every), "p50": p(every, 50), "p99": p(every, 99)},
            "first_chunk_ms_by_target": {
                t: {"count": len(v), "p50": p(v, 50), "p99": p(v, 99)}
                for t, v in sorted(self.first_chunk.items())
            },
            "offline_total_ms": {
                "count": len(self.offline_ms),
                "p50": p(self.offline_ms, 50),
                "p99": p(self.offline_ms, 99),
            },
            "memory_samples": self.samples,
            "rss_mib": {k: round(v / MIB, 1) for k, v in sorted(self.rss.items())},
            "rss_total_mib": round(sum(self.rss.values()) / MIB, 1) if self.rss else None,
            "gpu_mib": {k: round(v, 1) for k, v in sorted(self.gpu.items())},
            "gpu_total_mib": self.gpu_total,
        }


class Windows:
    """Records and memory samples by window of `seconds`."""

    def __init__(
        self, seconds: float, end_s: float | None = None, raw_rows: int = 2000, error_rows: int = 200
    ) -> None:
        """`end_s`: the run's length; a sample after it (while the last requests finish) goes to the last
        window instead of a window of its own."""
        self.seconds = seconds
        self.last = None if end_s is None else max(0, math.ceil(end_s / seconds) - 1)
        self.windows: dict[int, _Window] = {}
        self.raw: deque[Record] = deque(maxlen=raw_rows)
        self.first_errors: list[Record] = []
        self.error_rows = error_rows
        self.totals = {"requests": 0, "errors": 0, "cancelled": 0}

    def _at(self, t: float) -> _Window:
        index = max(0, int(t // self.seconds))
        return self.windows.setdefault(index if self.last is None else min(index, self.last), _Window())

    def add(self, record: Record) -> None:
        window = self._at(record.start_s)
        window.requests[record.kind] = window.requests.get(record.kind, 0) + 1
        window.audio_s += record.audio_s
        self.totals["requests"] += 1
        if record.outcome == "error":
            window.errors[record.kind] = window.errors.get(record.kind, 0) + 1
            self.totals["errors"] += 1
            if len(self.first_errors) < self.error_rows:
                self.first_errors.append(record)
        elif record.outcome == "cancelled":
            window.cancelled += 1
            self.totals["cancelled"] += 1
        if record.outcome != "error" and record.kind in STREAMING and record.first_chunk_ms is not None:
            window.first_chunk.setdefault(record.target, []).append(record.first_chunk_ms)
        if record.outcome == "ok" and record.kind == "offline" and record.total_ms is not None:
            window.offline_ms.append(record.total_ms)
        self.raw.append(record)

    def add_sample(
        self, t: float, rss: dict[str, int], gpu: dict[str, float], gpu_total: float | None
    ) -> None:
        """One monitor sample at `t` s since the start: resident bytes and GPU MiB by process label."""
        window = self._at(t)
        window.samples += 1
        for label, value in rss.items():
            window.rss[label] = max(value, window.rss.get(label, 0))
        for label, value in gpu.items():
            window.gpu[label] = max(value, window.gpu.get(label, 0.0))
        if gpu_total is not None:
            window.gpu_total = max(gpu_total, window.gpu_total or 0.0)

    def series(self) -> list[dict]:
        return [self.windows[i].summary(i, self.seconds) for i in sorted(self.windows)]

    def last_p99(self) -> float | None:
        for window in reversed(self.series()):
            if window["first_chunk_ms"]["p99"] is not None:
                return window["first_chunk_ms"]["p99"]
        return None

    def rows(self) -> dict:
        return {
            "last": [asdict(r) for r in self.raw],
            "first_errors": [asdict(r) for r in self.first_errors],
        }


def _found(series: list[dict], value) -> list[tuple[int, float]]:
    """(window index, `value(window)`) of the windows where it is not None."""
    return [(w["window"], v) for w in series if (v := value(w)) is not None]


def _ends(series: list[dict], value) -> tuple[float | None, float | None, int | None, int | None]:
    """The first and last non-None `value(window)` of the series, with their window indexes."""
    found = _found(series, value)
    if not found:
        return None, None, None, None
    return found[0][1], found[-1][1], found[0][0], found[-1][0]


def _where_last_third_starts(series: list[dict], value) -> float | None:
    """`value(window)` at the first window with a value in the last third of the windows that have one (None
    with fewer than three)."""
    found = _found(series, value)
    if len(found) < 3:
        return None
    start = found[0][0] + (2 * (found[-1][0] - found[0][0])) // 3
    return next(v for i, v in found if i >= start)


def totals_and_verdicts(
    series: list[dict],
    errors: int,
    stub_deaths: int,
    log_faults: int,
    memory_tolerance: float = 0.05,
    p99_tolerance: float = 0.25,
) -> tuple[dict, dict]:
    """The run's totals (growth of every process's memory and of the first-chunk p99, first window to last) and
    its verdicts: 0 errors, 0 stub deaths, GPU memory flat (in total and in each process), host memory flat in each
    process, first-chunk p99 flat (True, False, or None when not measured), the processes whose memory grew
    past the tolerance, and those of them still growing over the run's last third (a leak, where the others
    reached a high-water mark; a leak that filled the GPU levels off too, and its requests then fail). No fault
    at unload is judged after the servers stop (scripts/soak_traffic.py --after-stop)."""
    labels = sorted({label for w in series for label in w["rss_mib"]})
    gpu_labels = sorted({label for w in series for label in w["gpu_mib"]})

    def change(value) -> dict:
        first, last, i, j = _ends(series, value)
        return {
            "first": first,
            "last": last,
            "first_window": i,
            "last_window": j,
            "growth": growth(first, last),
        }

    rss = {label: change(lambda w, k=label: w["rss_mib"].get(k)) for label in labels}
    gpu = {label: change(lambda w, k=label: w["gpu_mib"].get(k)) for label in gpu_labels}
    gpu_total = change(lambda w: w["gpu_total_mib"])
    p99 = change(lambda w: w["first_chunk_ms"]["p99"])
    totals = {
        "errors": errors,
        "stub_deaths": stub_deaths,
        "log_faults": log_faults,
        "rss_total_mib": change(lambda w: w["rss_total_mib"]),
        "rss_mib": rss,
        "gpu_total_mib": gpu_total,
        "gpu_mib": gpu,
        "first_chunk_p99_ms": p99,
    }
    rss_flat = [flat(c["first"], c["last"], memory_tolerance) for c in rss.values()]
    gpu_flat = [flat(c["first"], c["last"], memory_tolerance) for c in gpu.values()]
    grown, still_growing = [], []
    for kind, key, changes in (("GPU", "gpu_mib", gpu), ("host", "rss_mib", rss)):
        for label, c in changes.items():
            if flat(c["first"], c["last"], memory_tolerance) is not False:
                continue
            grown.append(f"{kind} {label}: {100 * c['growth']:+.1f}%")
            third = _where_last_third_starts(series, lambda w, m=key, k=label: w[m].get(k))
            if flat(third, c["last"], memory_tolerance) is False:
                still_growing.append(
                    f"{kind} {label}: {100 * growth(third, c['last']):+.1f}% over the last third"
                )
    verdicts = {
        "rule": f"flat: last window <= first window x (1 + tolerance); memory tolerance {memory_tolerance}, "
        f"first-chunk p99 tolerance {p99_tolerance}; None: not measured; still growing: not flat, and the last "
        "window above (1 + tolerance) x the window where the last third starts",
        "memory_tolerance": memory_tolerance,
        "p99_tolerance": p99_tolerance,
        "zero_errors": errors == 0,
        "zero_stub_deaths": stub_deaths == 0 and log_faults == 0,
        "gpu_memory_flat": flat(gpu_total["first"], gpu_total["last"], memory_tolerance),
        "first_chunk_p99_flat": flat(p99["first"], p99["last"], p99_tolerance),
        "gpu_memory_flat_each_process": None if not gpu_flat or None in gpu_flat else all(gpu_flat),
        "host_rss_flat": None if not rss_flat or None in rss_flat else all(rss_flat),
        "memory_not_flat": grown,
        "memory_still_growing": still_growing,
        "no_fault_at_unload": None,
    }
    return totals, verdicts
