#!/usr/bin/env python3
"""One line per client request from tritonserver's trace files, slowest first response first.

    bash run.sh 3 3 streaming --server_extra_args "--trace-config triton,file=$PWD/exp/trace_{server}.json \
        --trace-config rate=1 --trace-config level=TIMESTAMPS --trace-config triton,log-frequency=50"
    bash run.sh 4 4 streaming ...; bash run.sh stop
    python scripts/trace_summary.py exp/trace_triton.json --model cosyvoice2 --top 5

Each line: the request's wait in the model's queue, its first and last response handed to gRPC (ms from its
REQUEST_START), and for every model its BLS asked: the requests, when the first started and the last ended, and
their queueing in all. `--json` writes every timeline. See docs/benchmarks.md (one request's timeline).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from tritontts.bench.triton_trace import Timeline, read_traces, timelines, trace_files


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def line(t: Timeline) -> str:
    children = "; ".join(
        f"{c.model} x{c.requests} {_fmt(c.start_ms)}-{_fmt(c.end_ms)} (queue {c.queue_ms:.1f})"
        for c in t.children
    )
    return (
        f"{t.request_id or t.id}: queue {_fmt(t.queue_ms)}, first response {_fmt(t.first_response_ms)}, "
        f"last {_fmt(t.last_response_ms)} ms" + (f" | {children}" if children else "")
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "trace", type=Path, help="the trace file given to tritonserver (its numbered parts are read too)"
    )
    parser.add_argument("--model", required=True, help="the model clients called (the BLS)")
    parser.add_argument("--top", type=int, default=10, help="lines to print (0: all)")
    parser.add_argument("--json", type=Path, default=None, help="write every timeline here")
    args = parser.parse_args(argv)
    files = trace_files(args.trace)
    if not files:
        print(f"trace_summary.py: no trace file at {args.trace} (nor {args.trace}.0, ...)", file=sys.stderr)
        return 1
    found = timelines(read_traces(files), args.model)
    if not found:
        print(
            f"trace_summary.py: no client request of model '{args.model}' in {len(files)} file(s)",
            file=sys.stderr,
        )
        return 1
    print(f"{len(found)} requests of {args.model} in {len(files)} file(s), slowest first response first:")
    for t in found[: args.top or None]:
        print(line(t))
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(t) for t in found], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
