"""Benchmark JSON rows and the results script, shared by the tests of benchmarks/RESULTS.md and the figure blocks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "benchmark_results.py"

SERVING = {
    "model": "spark_tts",
    "layout": "one tritonserver",
    "mode": "streaming",
    "concurrency": 1,
    "first_chunk_p50_ms": 63.0,
    "first_chunk_p99_ms": 98.5,
    "rtf": 0.0481,
    "audio_s_per_s": 20.81,
}
METRIC = {"model": "spark_tts LLM", "metric": "decode step, batch 1", "value": 0.798, "unit": "ms"}


def run_script(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
