#!/usr/bin/env python3
"""The benchmark suite of run.sh stage 11: every headline figure of one GPU host, part by part, resumable.

    python scripts/gpu_suite.py run    [--parts all] [--detach] [--force] [options]
    python scripts/gpu_suite.py status [--parts all] [--wait SECONDS] [options]

Parts: engine (scripts/bench_llm.py with the reference decoder and transformers), flow_graphs, dit_flow_graphs,
vocoder_graphs (group token2wav_graphs), and <family>:<mode> for spark_tts, cosyvoice2, cosyvoice2_dit,
cosyvoice3 in streaming and offline (group serving; a family or a mode names its parts): run.sh stages 0-3
serve it once, stage 4 sweeps every concurrency through it, run.sh stop ends it. <family>:websocket (group
websocket): the streaming server with the speech API (stage 6) before it, timed by scripts/bench_ws_ttfa.py.
Each part writes a benchmark JSON in the schema of tritontts/bench/results.py into --out-dir (RESULTS.md there regenerated) and a done marker
under <exp-dir>/suite/; a rerun skips the parts done with the same settings (--force redoes them), a failed part
does not stop the others, and `status` prints what is done, running and failed, with the failed logs' tails.
`run --detach` starts the run in a new session (log <exp-dir>/suite/suite.log) and returns.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from tritontts.bench import suite, suite_control


def parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--exp-dir", type=Path, default=Path("exp"), help="state under EXP_DIR/suite/")
    common.add_argument("--out-dir", type=Path, default=suite.REPO / "benchmarks", help="the schema JSON")
    common.add_argument("--parts", default="all", help="comma-separated parts or groups (default: all)")
    common.add_argument("--model-source", default="huggingface", help="run.sh --model_source of the families")
    common.add_argument("--llm-backend", default="torch", choices=("torch", "trtllm"))
    common.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    common.add_argument("--python", default=sys.executable, help="the interpreter of the scripts and run.sh")
    common.add_argument("--dataset", default="", help="run.sh --dataset (default: run.sh's own)")
    common.add_argument("--split-name", default="test")
    common.add_argument("--sweep", default="1,4,16", help="the concurrencies of every serving part")
    common.add_argument("--warmup", type=int, default=2, help="warm-up rows of every serving part")
    common.add_argument(
        "--serve-args",
        default="auto",
        help=f"run.sh options of every served family; auto: '{suite.GPU_SERVE_ARGS}' on a GPU host, none on the CPU",
    )
    common.add_argument("--part-timeout", type=float, default=900.0, help="seconds one part may take")
    common.add_argument("--reps", type=int, default=10, help="--reps of the graph scripts")
    common.add_argument("--http-port", type=int, default=8000)
    common.add_argument("--grpc-port", type=int, default=8001)
    common.add_argument("--metrics-port", type=int, default=8002)
    common.add_argument("--api-port", type=int, default=8080, help="the websocket parts' speech API")
    common.add_argument(
        "--commit", default="auto", help="meta.commit; auto: git's HEAD (+ uncommitted changes)"
    )
    top = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = top.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", parents=[common], help="run the parts not done yet")
    run.add_argument("--force", action="store_true", help="run the parts done already again")
    run.add_argument("--detach", action="store_true", help="run in the background (new session) and return")
    status = commands.add_parser("status", parents=[common], help="print every part's state")
    status.add_argument("--wait", type=float, default=0.0, help="first wait this long for a running suite")
    status.add_argument("--tail", type=int, default=30, help="lines of each failed part's log")
    return top


def config(args: argparse.Namespace) -> suite.SuiteConfig:
    return suite.SuiteConfig(
        exp_dir=args.exp_dir.resolve(),
        out_dir=args.out_dir.resolve(),
        parts=suite.select_parts(args.parts),
        force=getattr(args, "force", False),
        model_source=args.model_source,
        llm_backend=args.llm_backend,
        device=args.device,
        python=os.path.abspath(args.python) if os.sep in args.python else args.python,
        dataset=args.dataset,
        split_name=args.split_name,
        sweep=args.sweep,
        warmup=args.warmup,
        serve_args=args.serve_args,
        part_timeout_s=args.part_timeout,
        ports=(args.http_port, args.grpc_port, args.metrics_port),
        api_port=args.api_port,
        commit=args.commit,
        reps=args.reps,
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    try:
        cfg = config(args)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:
        if args.command == "status":
            return suite_control.status(cfg, args.wait, args.tail)
        if args.detach:
            child = [sys.executable, str(Path(__file__).resolve()), *(a for a in argv if a != "--detach")]
            return suite_control.detach(cfg, child)
        return suite_control.run(cfg, [sys.executable, __file__, *argv])
    except RuntimeError as error:  # --device cuda without a GPU
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
