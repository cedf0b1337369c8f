"""Command line of scripts/disaggregated.py: start | status | stop a multi-server deployment.

    scripts/disaggregated.py start --state-file exp/cosyvoice2/disagg/state.json --model-repo REPO \\
        --llm-model-dir CKPT/cosyvoice2_llm --llm-gpus 0 --token2wav-gpus 1,2 --instances-per-gpu 2 [--dry-run]
    scripts/disaggregated.py start --co-located --state-file exp/spark_tts/data_parallel/state.json \\
        --model-repo REPO --token2wav-gpus 0,1,2,3 --instances-per-gpu 1    # data parallel: whole pipelines
    scripts/disaggregated.py status --state-file F [--print server_addrs|num_gpus|model_repo|llm_url]
    scripts/disaggregated.py stop --state-file F

`start` returns once every server is ready (exit 0), or stops what it started (exit 1). It refuses while the
state file's processes still run: stop them first. `status` exits 0 when all run and are ready, 1 when some
are down or not ready, 3 when none runs; with `--print` it prints one value of a ready deployment.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from tritontts.bench.triton_io import true_or_false
from tritontts.triton.bundle import TritonNotFoundError, find_tritonserver
from tritontts.triton.disaggregated.launcher import LaunchError, read_state, start, status, stop_all
from tritontts.triton.disaggregated.plan import (
    LLM_BACKENDS,
    LLM_DEVICES,
    LLM_DTYPES,
    LLMServerPlan,
    PlanError,
    PortBases,
    Topology,
    describe,
    parse_gpus,
    server_addrs,
    split_args,
)
from tritontts.triton.server import LOOPBACK
from tritontts.triton.watchdog import ACTIONS as WATCHDOG_ACTIONS

PRINTABLE = ("server_addrs", "num_gpus", "model_repo", "llm_url")


def get_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="scripts/disaggregated.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    state = argparse.ArgumentParser(add_help=False)
    state.add_argument("--state-file", type=Path, required=True, help="JSON; logs and pid files go beside it")

    s = commands.add_parser("start", parents=[state], help="start everything, wait until ready")
    s.add_argument("--model-repo", type=Path, required=True, help="the token2wav servers' repository")
    s.add_argument("--address", default=LOOPBACK, help="address every server listens on")
    s.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for readiness")
    s.add_argument("--dry-run", action="store_true", help="print the plan (JSON) and start nothing")
    s.add_argument(
        "--co-located",
        action="store_true",
        help="no LLM server: every tritonserver serves --model-repo whole, its LLM inside Triton (data parallel "
        "over --token2wav-gpus); the LLM options are ignored",
    )
    llm = s.add_argument_group("LLM server")
    llm.add_argument("--llm-backend", choices=LLM_BACKENDS, default="torch")
    llm.add_argument(
        "--llm-model-dir",
        type=Path,
        default=None,
        help="Hugging Face LLM dir (the tokenizer); not co-located",
    )
    llm.add_argument("--llm-engine-dir", type=Path, default=None, help="trtllm: trtllm-build's engines")
    llm.add_argument("--llm-gpus", default="0", help="its CUDA_VISIBLE_DEVICES")
    llm.add_argument("--llm-port", type=int, default=8010)
    llm.add_argument("--llm-max-batch-size", type=int, default=64)
    llm.add_argument("--llm-max-seq-len", type=int, default=2560, help="torch")
    llm.add_argument("--llm-device", choices=LLM_DEVICES, default="auto", help="torch")
    llm.add_argument("--llm-dtype", choices=LLM_DTYPES, default="auto", help="torch")
    llm.add_argument("--llm-cuda-graphs", type=true_or_false, default=True, help="torch: true | false")
    llm.add_argument("--llm-compile", type=true_or_false, default=False, help="torch: true | false")
    llm.add_argument(
        "--llm-kv-cache-free-gpu-memory-fraction", type=float, default=0.4, help="trtllm (upstream: 0.4)"
    )
    llm.add_argument(
        "--llm-command-prefix",
        default="",
        help="trtllm: what runs trtllm-serve, shell-quoted (upstream: 'mpirun -np 1 --allow-run-as-root "
        "--oversubscribe')",
    )
    llm.add_argument("--llm-extra-args", default="", help="more arguments for the LLM server, shell-quoted")
    t2w = s.add_argument_group("tritonservers (token2wav, or whole pipelines when co-located)")
    t2w.add_argument("--token2wav-gpus", default="1", help="comma-separated GPUs, each its own servers")
    t2w.add_argument("--instances-per-gpu", type=int, default=2, help="tritonservers per GPU")
    t2w.add_argument("--http-base-port", type=int, default=PortBases.http, help="server i: base + 1 + i")
    t2w.add_argument("--grpc-base-port", type=int, default=PortBases.grpc)
    t2w.add_argument("--metrics-base-port", type=int, default=PortBases.metrics)
    t2w.add_argument(
        "--server-extra-args",
        default="",
        help="more arguments for every tritonserver, shell-quoted; {server} becomes each server's name",
    )

    s.add_argument(
        "--watchdog",
        choices=[*WATCHDOG_ACTIONS, "off"],
        default="auto",
        help="each tritonserver's watchdog, for a python-backend stub that dies (tritonserver 2.51 never restarts "
        "it): reload its model (explicit model control), else stop that server (auto); off: none",
    )

    st = commands.add_parser("status", parents=[state], help="whether each process runs and is ready")
    st.add_argument("--print", dest="value", choices=PRINTABLE, default=None, help="print one value only")
    sp = commands.add_parser("stop", parents=[state], help="SIGTERM each, SIGKILL after --grace seconds")
    sp.add_argument("--grace", type=float, default=40.0)
    return parser


def topology_from_args(args: argparse.Namespace) -> Topology:
    return Topology(
        llm=None if args.co_located else llm_from_args(args),
        model_repo=args.model_repo.resolve(),
        token2wav_gpus=parse_gpus(args.token2wav_gpus, "--token2wav-gpus"),
        instances_per_gpu=args.instances_per_gpu,
        bases=PortBases(args.http_base_port, args.grpc_base_port, args.metrics_base_port),
        address=args.address,
        server_extra_args=split_args(args.server_extra_args),
    )


def llm_from_args(args: argparse.Namespace) -> LLMServerPlan:
    if args.llm_model_dir is None:
        raise PlanError("--llm-model-dir is required unless --co-located")
    return LLMServerPlan(
        backend=args.llm_backend,
        model_dir=args.llm_model_dir.resolve(),
        gpus=parse_gpus(args.llm_gpus, "--llm-gpus"),
        port=args.llm_port,
        address=args.address,
        engine_dir=None if args.llm_engine_dir is None else args.llm_engine_dir.resolve(),
        max_batch_size=args.llm_max_batch_size,
        max_seq_len=args.llm_max_seq_len,
        device=args.llm_device,
        dtype=args.llm_dtype,
        cuda_graphs=args.llm_cuda_graphs,
        compile=args.llm_compile,
        kv_cache_free_gpu_memory_fraction=args.llm_kv_cache_free_gpu_memory_fraction,
        command_prefix=split_args(args.llm_command_prefix),
        extra_args=split_args(args.llm_extra_args),
    )


def print_value(state: dict, name: str) -> str:
    values = {
        "server_addrs": lambda: server_addrs(state["servers"]),
        "num_gpus": lambda: str(state["num_gpus"]),
        "model_repo": lambda: state["model_repo"],
        "llm_url": lambda: "" if state["llm"] is None else state["llm"]["chat_url"],
    }
    return values[name]()


def run_start(args: argparse.Namespace) -> int:
    topology = topology_from_args(args)
    if args.dry_run:
        try:
            install = find_tritonserver()
        except TritonNotFoundError:
            install = None
        print(json.dumps(describe(topology, args.state_file.parent, install), indent=2))
        return 0
    state = start(
        topology,
        args.state_file,
        args.timeout,
        say=lambda line: print(line, flush=True),
        watchdog=args.watchdog,
    )
    llm = "" if state["llm"] is None else f"LLM {state['llm']['chat_url']}, "
    print(f"{topology.layout} servers ready: {llm}tritonserver grpc {server_addrs(state['servers'])}")
    return 0


def run_status(args: argparse.Namespace) -> int:
    code, lines = status(args.state_file)
    if args.value is None:
        print("\n".join(lines))
        return code
    if code != 0:
        print("\n".join(lines), file=sys.stderr)
        return code
    print(print_value(read_state(args.state_file), args.value))
    return 0


def run_stop(args: argparse.Namespace) -> int:
    stop_all(args.state_file, args.grace)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = get_parser().parse_args(argv)
    try:
        return {"start": run_start, "status": run_status, "stop": run_stop}[args.command](args)
    except (PlanError, LaunchError, TritonNotFoundError) as err:
        print(f"disaggregated.py {args.command}: {err}", file=sys.stderr)
        return 1
