"""Per-request timelines from tritonserver's own trace files (`--trace-config level=TIMESTAMPS`).

tritonserver writes a trace as a JSON list of entries that share a trace `id`: one names the model (with
`request_id` and, for a request a BLS made, `parent_id`), the others carry timestamps (`{"name", "ns"}`), a
trace's entries spread over the list and, with `triton,log-frequency`, over numbered files. For a decoupled model
every response adds `INFER_RESPONSE_COMPLETE` and `GRPC_SEND_START`/`GRPC_SEND_END`.

A request's timeline is measured from its `REQUEST_START`: its wait in the model's queue (until `COMPUTE_START`),
its first response handed to gRPC, its last, and, for each model its BLS asked, when the first of those requests
started and when the last ended, and how long they queued in all. Tracing costs each request a few file writes;
Triton's trace summary script (`qa/common/trace_summary.py`) is not shipped in a wheel and reports means per model,
not one request's timeline, so this module reads the files itself.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

NS_PER_MS = 1e6


@dataclass
class Trace:
    id: int
    model: str = ""
    request_id: str = ""
    parent_id: int | None = None
    stamps: dict[str, list[int]] = field(default_factory=dict)

    def first(self, name: str) -> int | None:
        values = self.stamps.get(name)
        return min(values) if values else None

    def last(self, name: str) -> int | None:
        values = self.stamps.get(name)
        return max(values) if values else None


def trace_files(path: Path) -> list[Path]:
    """`path` and the numbered files tritonserver writes beside it (`path.0`, `path.1`, ...), those that exist."""
    numbered = sorted(path.parent.glob(path.name + ".*"), key=lambda p: p.suffix)
    return [p for p in [path, *numbered] if p.is_file() and (p == path or p.suffix[1:].isdigit())]


def read_traces(paths: Iterable[Path]) -> dict[int, Trace]:
    """Every trace of the files, its entries merged by id."""
    traces: dict[int, Trace] = {}
    for path in paths:
        text = Path(path).read_text().strip()
        if not text:
            continue
        for entry in json.loads(text):
            trace = traces.setdefault(int(entry["id"]), Trace(id=int(entry["id"])))
            if "model_name" in entry:
                trace.model = entry["model_name"]
                trace.request_id = str(entry.get("request_id", ""))
                parent = entry.get("parent_id")
                trace.parent_id = int(parent) if parent not in (None, "", 0) else None
            for stamp in entry.get("timestamps", ()):
                trace.stamps.setdefault(stamp["name"], []).append(int(stamp["ns"]))
    return traces


@dataclass
class ChildSpan:
    model: str
    requests: int
    start_ms: float
    end_ms: float | None
    queue_ms: float


@dataclass
class Timeline:
    id: int
    model: str
    request_id: str
    queue_ms: float | None
    first_response_ms: float | None
    last_response_ms: float | None
    compute_end_ms: float | None
    children: list[ChildSpan]


def _ms(stamp: int | None, origin: int) -> float | None:
    return None if stamp is None else (stamp - origin) / NS_PER_MS


def _response_stamps(trace: Trace) -> list[int]:
    return trace.stamps.get("GRPC_SEND_START") or trace.stamps.get("INFER_RESPONSE_COMPLETE") or []


def timeline(trace: Trace, children_of_trace: Iterable[Trace]) -> Timeline:
    """`trace`'s timeline, with the requests its BLS made (`children_of_trace`) grouped by model."""
    origin = trace.first("REQUEST_START")
    if origin is None:
        raise ValueError(f"trace {trace.id} ({trace.model}) has no REQUEST_START")
    queued, computing = trace.first("QUEUE_START"), trace.first("COMPUTE_START")
    responses = _response_stamps(trace)
    by_model: dict[str, list[Trace]] = {}
    for child in children_of_trace:
        by_model.setdefault(child.model, []).append(child)
    children = []
    for model, group in sorted(by_model.items()):
        starts = [c.first("REQUEST_START") for c in group if c.first("REQUEST_START") is not None]
        ends = [c.last("REQUEST_END") for c in group if c.last("REQUEST_END") is not None]
        queue_ns = sum(
            c.first("COMPUTE_START") - c.first("QUEUE_START")
            for c in group
            if c.first("COMPUTE_START") is not None and c.first("QUEUE_START") is not None
        )
        children.append(
            ChildSpan(
                model=model,
                requests=len(group),
                start_ms=_ms(min(starts), origin) if starts else float("nan"),
                end_ms=_ms(max(ends), origin) if ends else None,
                queue_ms=queue_ns / NS_PER_MS,
            )
        )
    return Timeline(
        id=trace.id,
        model=trace.model,
        request_id=trace.request_id,
        queue_ms=None if queued is None or computing is None else (computing - queued) / NS_PER_MS,
        first_response_ms=_ms(min(responses), origin) if responses else None,
        last_response_ms=_ms(max(responses), origin) if responses else None,
        compute_end_ms=_ms(trace.last("COMPUTE_END"), origin),
        children=sorted(children, key=lambda c: c.start_ms),
    )


def timelines(traces: dict[int, Trace], model: str) -> list[Timeline]:
    """The timelines of `model`'s requests that came from clients (not from a BLS), slowest first response first."""
    children: dict[int, list[Trace]] = {}
    for trace in traces.values():
        if trace.parent_id is not None:
            children.setdefault(trace.parent_id, []).append(trace)
    found = [
        timeline(t, children.get(t.id, ()))
        for t in traces.values()
        if t.model == model and t.parent_id is None and t.first("REQUEST_START") is not None
    ]
    return sorted(found, key=lambda t: -(t.first_response_ms if t.first_response_ms is not None else -1.0))
