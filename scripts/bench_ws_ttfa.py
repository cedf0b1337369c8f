#!/usr/bin/env python3
"""Time to first audio over the speech WebSocket with the text written at a set rate, at several concurrencies.

Against a running speech API (`python -m tritontts.openai_api`, run.sh stage 6) in front of tritonserver. Each
level runs `--rounds` rounds of N sessions at once, every session one utterance of `--text` sent word by word at
`--tokens-per-second`, in sentence mode or with `--bistream` (CosyVoice2/3). Writes one benchmark JSON in the
results schema (docs/benchmarks.md): a row per level with the first audio p50 / p99 after the first text delta.

    python scripts/bench_ws_ttfa.py --url ws://localhost:8080/v1/audio/speech/stream --model cosyvoice2 \
        --voice default --concurrency 1,16 --rounds 2 [--bistream] [--instructions "Speak calmly."] \
        --output benchmarks/ws_ttfa_cosyvoice2_h100_full_synthetic.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import sys
from pathlib import Path

from tritontts.bench.suite_config import detect_commit, detect_device
from tritontts.bench.ws_ttfa import WsLoad, run_levels

TEXT = (
    "Hello there. This sentence is spoken while it is still being written, one word at a time, as a language "
    "model writes it. And here is one more sentence, so that the stream goes on."
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="ws://localhost:8080/v1/audio/speech/stream")
    p.add_argument("--model", required=True, help="the API's model name")
    p.add_argument("--voice", default="default")
    p.add_argument("--text", default=TEXT)
    p.add_argument("--tokens-per-second", type=float, default=20.0, help="pieces of text sent a second")
    p.add_argument("--concurrency", default="1,16", help="comma-separated sessions at once, one level each")
    p.add_argument("--rounds", type=int, default=2, help="rounds per level")
    p.add_argument("--warmup", type=int, default=1, help="single sessions before the levels, not counted")
    p.add_argument(
        "--bistream", action="store_true", help="CosyVoice2/3: every delta joins the running utterance"
    )
    p.add_argument("--instructions", default=None, help="CosyVoice2/3's instruct mode")
    p.add_argument("--no-text-normalization", dest="text_normalization", action="store_false")
    p.add_argument("--api-key", default=None)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds a session may take")
    p.add_argument("--label", default="", help="added to each row's layout, e.g. the voice")
    p.add_argument(
        "--gpu-count", type=int, default=None, help="GPUs the servers use (default: 1 on a GPU host)"
    )
    p.add_argument("--commit", default="auto")
    p.add_argument("--output", type=Path, required=True)
    args = p.parse_args(argv)
    try:
        args.levels = [int(n) for n in args.concurrency.split(",")]
    except ValueError:
        p.error(f"--concurrency must be comma-separated integers, got {args.concurrency!r}")
    if not args.levels or min(args.levels) < 1:
        p.error("--concurrency needs positive integers")
    if args.tokens_per_second <= 0 or args.rounds < 1 or args.warmup < 0:
        p.error("--tokens-per-second must be positive, --rounds at least 1, --warmup at least 0")
    return args


def session_config(args: argparse.Namespace) -> dict:
    config = {"model": args.model, "voice": args.voice, "stream_audio": True, "split_granularity": "sentence"}
    if args.bistream:
        config["bistream"] = True
    if args.instructions:
        config["instructions"] = args.instructions
    if not args.text_normalization:
        config["text_normalization"] = False
    if args.api_key:
        config["api_key"] = args.api_key
    return config


def row(args: argparse.Namespace, summary: dict, gpu_count: int) -> dict:
    first = summary["first_audio_ms"]
    mode = "websocket bistream" if args.bistream else "websocket sentence"
    layout = "speech API WebSocket" + (f"; {args.label}" if args.label else "")
    note = f"first audio after the first text delta at {args.tokens_per_second:g} pieces/s; "
    note += f"{summary['sessions']} sessions, {summary['failed']} failed"
    audio_s = summary["audio_seconds"] / summary["wall_s"] if summary["wall_s"] else None
    return {
        "model": args.model,
        "layout": layout,
        "mode": mode,
        "concurrency": summary["concurrency"],
        "first_chunk_p50_ms": first["p50"],
        "first_chunk_p99_ms": first["p99"],
        "rtf": None,
        "audio_s_per_s": round(audio_s, 2) if audio_s else None,
        "note": note,
        "gpu_count": gpu_count,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    load = WsLoad(args.url, session_config(args), args.text, args.tokens_per_second, args.timeout)
    levels = run_levels(load, args.levels, args.rounds, args.warmup)
    summaries = [level.summary() for level in levels]
    device = detect_device()
    gpu_count = args.gpu_count if args.gpu_count is not None else int(device.kind == "cuda")
    shown = [a if a != args.api_key else "KEY" for a in (argv if argv is not None else sys.argv[1:])]
    data = {
        "meta": {
            "device": device.name,
            "gpu_count": gpu_count,
            "date": datetime.date.today().isoformat(),
            "commit": detect_commit() if args.commit == "auto" else args.commit,
            "command": "python scripts/bench_ws_ttfa.py " + shlex.join(shown),
            "what": f"{args.model} over the speech WebSocket: time to first audio with the text written at "
            f"{args.tokens_per_second:g} pieces a second, {'bistream' if args.bistream else 'sentence mode'}.",
        },
        "headline": [row(args, s, gpu_count) for s in summaries],
        "levels": summaries,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    for s in summaries:
        first = s["first_audio_ms"]
        print(
            f"c={s['concurrency']}: {s['sessions']} sessions, {s['failed']} failed, first audio p50 {first['p50']} ms, p99 {first['p99']} ms"
        )
    print(f"wrote {args.output}")
    return 1 if any(s["failed"] for s in summaries) else 0


if __name__ == "__main__":
    sys.exit(main())
