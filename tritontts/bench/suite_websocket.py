"""The suite's `<family>:websocket` parts: the speech API (run.sh stage 6, the family served under its own name)
in front of the family's streaming server, and scripts/bench_ws_ttfa.py timing the first audio after the first
text delta, text written at 20 words a second (its default text), at the suite's concurrencies.

Every family runs sentence mode with the default voice (run.sh's reference audio); the CosyVoice families also run
bistream, with that voice and with instruct2 (the same voice with `instructions`: no prompt speech in the LLM).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from tritontts.triton.server import answers_ok

INSTRUCTIONS = "Speak in a calm voice."
ZERO_SHOT = "zero-shot voice, run.sh's reference audio"
HEALTH_WAIT_S = 120.0
ROUNDS = 2
"""bench_ws_ttfa.py's rounds per concurrency."""


def bench_runs(family: str) -> list[tuple[str, list[str]]]:
    """(label, bench_ws_ttfa.py options) of each run of a family's part."""
    runs = [("sentence_default", ["--voice", "default", "--label", ZERO_SHOT])]
    if family != "spark_tts":
        runs.append(
            (
                "bistream_instruct",
                ["--bistream", "--voice", "default", "--instructions", INSTRUCTIONS, "--label", "instruct2"],
            )
        )
        runs.append(("bistream_default", ["--bistream", "--voice", "default", "--label", ZERO_SHOT]))
    return runs


RUN_WORDS = {
    "sentence_default": "sentence mode",
    "bistream_instruct": "bistream with instruct2",
    "bistream_default": "bistream with the default voice",
}


def runs_described(family: str) -> str:
    """The runs of `bench_runs(family)` in words, for the part's `what`."""
    words = [RUN_WORDS[label] for label, _ in bench_runs(family)]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def bench_argv(
    python: str, family: str, api_port: int, sweep: str, output: Path, options: list[str]
) -> list[str]:
    return [
        python,
        "scripts/bench_ws_ttfa.py",
        "--url",
        f"ws://127.0.0.1:{api_port}/v1/audio/speech/stream",
        "--model",
        family,
        "--concurrency",
        sweep,
        "--rounds",
        str(ROUNDS),
        "--no-text-normalization",
        "--output",
        str(output),
        *options,
    ]


def wait_healthy(api_port: int, deadline: float, alive) -> str | None:
    """None once GET /health answers 200; else why not (the API exited, or `deadline` passed)."""
    url = f"http://127.0.0.1:{api_port}/health"
    while time.monotonic() < deadline:
        if not alive():
            return "the speech API exited before it was healthy"
        if answers_ok(url):
            return None
        time.sleep(0.5)
    return "the speech API was not healthy in time"


def websocket_rows(outputs: dict[str, Path]) -> tuple[dict, list[dict]]:
    """(raw: each run's levels, headline: each run's rows) from bench_ws_ttfa's files."""
    raw, headline = {}, []
    for label, path in outputs.items():
        data = json.loads(path.read_text(encoding="utf-8"))
        raw[label] = data["levels"]
        headline += data["headline"]
    return raw, headline
