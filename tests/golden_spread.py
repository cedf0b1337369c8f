"""Run the `golden` tests under every CPU kernel path and thread count, and show how far each comparison moves.

    python tests/golden_spread.py [--json FILE] [pytest args...]

Each setting runs `pytest -m golden` in a fresh process (the kernel path is chosen when torch loads) with
`TRITONTTS_SPREAD_FILE` set, so every `tolerance.within` call records its measured error. The table gives,
per comparison, the smallest and largest error over the settings, the bound, and the margin (bound over the
largest error). A setting a CPU lacks falls back to what it has: the `capability` column says what ran.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

KERNEL_PATHS = {
    "native": {},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "default": {
        "ATEN_CPU_CAPABILITY": "default",
        "ONEDNN_MAX_CPU_ISA": "SSE41",
        "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
    },
}
THREADS = (1, 2)


def run_setting(path_name: str, threads: int, pytest_args: list[str], out: Path) -> list[dict]:
    env = {**os.environ, **KERNEL_PATHS[path_name]}
    env.update(
        OMP_NUM_THREADS=str(threads), TRITONTTS_TEST_THREADS=str(threads), TRITONTTS_SPREAD_FILE=str(out)
    )
    command = [sys.executable, "-m", "pytest", "-q", "-m", "golden", "-p", "no:cacheprovider", *pytest_args]
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    last = result.stdout.strip().splitlines()[-1:] or ["(no output)"]
    print(f"{path_name:8s} threads={threads}: {last[0]}", flush=True)
    rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    return [{**row, "setting": f"{path_name}/{threads}"} for row in rows]


def summarize(rows: list[dict]) -> list[dict]:
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for row in rows:
        groups[row["test"], row["what"]].append(row)
    summary = []
    for (test, what), group in sorted(groups.items()):
        errors = [r["error"] for r in group]
        worst = max(errors)
        summary.append(
            {
                "test": test,
                "what": what,
                "min": min(errors),
                "max": worst,
                "bound": group[0]["bound"],
                "margin": group[0]["bound"] / worst if worst > 0 else float("inf"),
                "settings": len(group),
                "capabilities": sorted({r["capability"] for r in group}),
            }
        )
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write every record and the summary here")
    args, pytest_args = parser.parse_known_args()
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for path_name in KERNEL_PATHS:
            for threads in THREADS:
                rows += run_setting(
                    path_name, threads, pytest_args, Path(tmp) / f"{path_name}_{threads}.jsonl"
                )
    summary = summarize(rows)
    tightest: dict[str, dict] = {}
    for s in summary:
        if s["test"] not in tightest or s["margin"] < tightest[s["test"]]["margin"]:
            tightest[s["test"]] = s
    print("\nEach test's comparison with the smallest margin (--json has them all):")
    print("| test | comparison | min error | max error | bound | margin |\n|---|---|---|---|---|---|")
    for s in tightest.values():
        name = s["test"].split("::")[-1]
        print(
            f"| {name} | {s['what']} | {s['min']:.3g} | {s['max']:.3g} | {s['bound']:.3g} | {s['margin']:.1f}x |"
        )
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "records": rows}, indent=1))
    low = [s for s in summary if s["margin"] < 2]
    if low:
        print(f"\n{len(low)} comparison(s) with a margin under 2x", file=sys.stderr)


if __name__ == "__main__":
    main()
