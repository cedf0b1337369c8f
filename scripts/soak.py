#!/usr/bin/env python3
"""Run the reliability suite's scenarios longer and write their figures to a JSON report.

    python scripts/soak.py --seconds 1800 --output benchmarks/soak_cpu_tiny.json

The scenarios are the `reliability` tests (tests/test_reliability_*.py) on the real tritonserver with the tiny
synthetic checkpoints; this script scales them through `TRITONTTS_SOAK_*` variables (soak duration, vanishing
clients, hostile requests, overload rounds), collects what each test records, and adds the command, the machine
and pytest's outcome. A scenario that fails still writes its figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--seconds", type=float, default=1800, help="duration of the mixed-traffic soak (scenario 5)"
    )
    p.add_argument("--vanishing", type=int, default=200, help="clients that vanish (scenario 2)")
    p.add_argument(
        "--stress-seconds",
        type=float,
        default=300,
        help="duration of Spark-TTS streaming at concurrency 4 (scenario 8, the stub race's regression test)",
    )
    p.add_argument(
        "--memory-requests",
        type=int,
        default=96,
        help="requests of each kind whose tritonserver memory is read (scenario 9)",
    )
    p.add_argument(
        "--hostile-per-target", type=int, default=120, help="malformed tensor requests per model and protocol"
    )
    p.add_argument("--hostile-api", type=int, default=300, help="malformed speech-API requests")
    p.add_argument("--overload-rounds", type=int, default=5, help="bursts of 4x capacity (scenario 3)")
    p.add_argument(
        "--cancelled-streams",
        type=int,
        default=200,
        help="Spark-TTS streams cancelled after their first chunk (the BLS stubs' memory after them)",
    )
    p.add_argument(
        "--next-requests",
        type=int,
        default=20,
        help="requests that must succeed after a stub's reload (scenario 1)",
    )
    p.add_argument(
        "--tests", default="tests/test_reliability_*.py", help="which reliability test files to run"
    )
    p.add_argument("-k", default=None, help="pytest -k expression")
    p.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "soak_cpu_tiny.json")
    return p


def machine() -> dict:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if "model name" in line
        ),
        platform.processor(),
    )
    memory = next(
        line.split()[1]
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal")
    )
    return {
        # what tests/conftest.py gives the servers unless the environment sets it (run.sh's default too)
        "server_malloc_arena_max": os.environ.get("MALLOC_ARENA_MAX", "2"),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(int(memory) / 2**20, 1),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def main(argv: list[str] | None = None) -> int:
    args = get_parser().parse_args(argv)
    import glob

    files = sorted(glob.glob(str(ROOT / args.tests)))
    if not files:
        print(f"error: no test files match {args.tests}", file=sys.stderr)
        return 2
    with tempfile.NamedTemporaryFile("r", suffix=".jsonl", delete=False) as report:
        report_path = report.name
    env = os.environ | {
        "TRITONTTS_SOAK_REPORT": report_path,
        "TRITONTTS_SOAK_SECONDS": str(args.seconds),
        "TRITONTTS_SOAK_VANISHING": str(args.vanishing),
        "TRITONTTS_SOAK_STRESS_SECONDS": str(args.stress_seconds),
        "TRITONTTS_SOAK_MEMORY_REQUESTS": str(args.memory_requests),
        "TRITONTTS_SOAK_HOSTILE_PER_TARGET": str(args.hostile_per_target),
        "TRITONTTS_SOAK_HOSTILE_API": str(args.hostile_api),
        "TRITONTTS_SOAK_OVERLOAD_ROUNDS": str(args.overload_rounds),
        "TRITONTTS_SOAK_CANCELLED_STREAMS": str(args.cancelled_streams),
        "TRITONTTS_SOAK_NEXT_REQUESTS": str(args.next_requests),
    }
    command = [sys.executable, "-m", "pytest", "-q", "-m", "reliability", "-p", "no:cacheprovider", *files]
    if args.k:
        command += ["-k", args.k]
    info = machine()
    started = time.time()
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    summary = (result.stdout.strip().splitlines() or [""])[-1]
    scenarios = [json.loads(line) for line in Path(report_path).read_text().splitlines() if line.strip()]
    Path(report_path).unlink()
    out = {
        "command": "python scripts/soak.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": info,
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "wall_s": round(time.time() - started, 1),
        "settings": {k: v for k, v in vars(args).items() if k not in ("output",)},
        "pytest": {
            "returncode": result.returncode,
            "summary": summary,
            "failed": [line for line in result.stdout.splitlines() if line.startswith("FAILED ")],
            "errors": [line for line in result.stdout.splitlines() if line.startswith("E   ")][:200],
        },
        "scenarios": scenarios,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(out, indent=2, ensure_ascii=False) + "\n")
    print(f"{summary}\nreport: {args.output}")
    if result.returncode:
        print(result.stdout[-6000:], file=sys.stderr)
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
