#!/usr/bin/env python3
"""Run tritonserver in the background and stop it again, by pid file.

    python scripts/triton_server.py prepare
    python scripts/triton_server.py start --model-repo REPO [--http-port 8000 --grpc-port 8001 ...]
        [--pid-file F --log-file L --timeout 600] [-- EXTRA TRITONSERVER ARGS]
    python scripts/triton_server.py status --pid-file F
    python scripts/triton_server.py stop --pid-file F
    python scripts/triton_server.py reload --model-repo REPO --model token2wav --set first_chunks_first=queue

`start` returns once the server is ready (exit 0) or has failed (exit 1, the log's errors printed). `reload` sets
string parameters in a model's config.pbtxt and loads that model again while the others keep serving (the server
started with `-- --model-control-mode=explicit --load-model=*`, run.sh's --server_extra_args).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from tritontts.triton.bundle import TritonNotFoundError, find_tritonserver
from tritontts.triton.reload import ReloadError, parse_settings, reload_with_parameters
from tritontts.triton.server import (
    LOOPBACK,
    PYTHON_SHM_BYTES,
    ServerConfig,
    ServerError,
    TritonServer,
    is_ready,
    is_tritonserver,
    read_pid_file,
    stop_pid_file,
)
from tritontts.triton.watchdog import ACTIONS, start_beside


def prepare(args: argparse.Namespace) -> int:
    install = find_tritonserver()
    print(f"tritonserver: {install.binary} (from {install.source})")
    if install.backend_dir:
        print(f"backends: {install.backend_dir}")
    if install.path_prepend:
        print(f"PATH prepended: {':'.join(install.path_prepend)}")
    if install.ld_library_path_prepend:
        print(f"LD_LIBRARY_PATH prepended: {':'.join(install.ld_library_path_prepend)}")
    return 0


def start(args: argparse.Namespace) -> int:
    running = read_pid_file(args.pid_file)
    if running is not None and is_tritonserver(running):
        print(
            f"tritonserver already running (pid {running}, {args.pid_file}); stop it first", file=sys.stderr
        )
        return 1
    config = ServerConfig(
        model_repo=Path(args.model_repo),
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        address=args.address,
        log_file=Path(args.log_file),
        pid_file=Path(args.pid_file),
        log_verbose=args.log_verbose,
        model_control_mode=args.model_control_mode,
        python_shm_bytes=args.python_shm_bytes,
        extra_args=(*shlex.split(args.server_extra_args), *args.extra),
    )
    server = TritonServer(config)
    pid = server.start()
    print(
        f"tritonserver pid {pid} starting: {' '.join(server.command())}\nlog: {config.log_file}", flush=True
    )
    try:
        seconds = server.wait_ready(timeout=args.timeout)
    except ServerError as err:
        server.stop(grace_s=10)
        print(err, file=sys.stderr)
        return 1
    host = server.http_url.rsplit(":", 1)[0]
    print(
        f"tritonserver ready after {seconds:.1f} s (pid {pid}): http {host}:{config.http_port}, "
        f"grpc {host}:{config.grpc_port}, metrics {host}:{config.metrics_port}"
    )
    if args.watchdog != "off":
        print(
            f"watchdog pid {start_watchdog(server, args.watchdog)} ({args.watchdog}): {watchdog_log(config)}"
        )
    return 0


def watchdog_log(config: ServerConfig) -> Path:
    return Path(f"{config.log_file}.watchdog")


def start_watchdog(server: TritonServer, action: str) -> int:
    """tritontts.triton.watchdog beside the server (docs/reliability.md); it ends when the server does."""
    return start_beside(server.pid, server.http_url, action, watchdog_log(server.config))


def status(args: argparse.Namespace) -> int:
    pid = read_pid_file(args.pid_file)
    if pid is None or not is_tritonserver(pid):
        print(f"tritonserver not running ({args.pid_file})")
        return 3
    ready = is_ready(f"{args.address}:{args.http_port}")
    print(
        f"tritonserver running (pid {pid}), {'ready' if ready else 'not ready'} on http {args.address}:{args.http_port}"
    )
    return 0


def stop(args: argparse.Namespace) -> int:
    pid = stop_pid_file(args.pid_file, grace_s=args.grace)
    print(f"tritonserver pid {pid} stopped" if pid else f"no running tritonserver in {args.pid_file}")
    return 0


def reload(args: argparse.Namespace) -> int:
    try:
        settings = parse_settings(args.set)
        served = reload_with_parameters(
            Path(args.model_repo), args.model, settings, f"{args.address}:{args.http_port}", args.timeout
        )
    except (ValueError, ReloadError) as err:
        print(f"triton_server.py reload: {err}", file=sys.stderr)
        return 1
    print(
        f"'{args.model}' loaded again; its parameters now: "
        + ", ".join(f"{k}={v}" for k, v in served.items())
    )
    return 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    extra: list[str] = []
    if "--" in argv:
        extra = argv[argv.index("--") + 1 :]
        argv = argv[: argv.index("--")]
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--pid-file", default="tritonserver.pid")
    common.add_argument("--log-file", default="tritonserver.log")
    common.add_argument("--address", default=LOOPBACK, help="address the endpoints listen on")
    common.add_argument("--http-port", type=int, default=8000)
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser(
        "prepare", parents=[common], help="find tritonserver, install the python backend stub"
    )
    start_parser = commands.add_parser(
        "start", parents=[common], help="start in the background, wait until ready"
    )
    start_parser.add_argument("--model-repo", required=True)
    start_parser.add_argument("--grpc-port", type=int, default=8001)
    start_parser.add_argument("--metrics-port", type=int, default=8002)
    start_parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for readiness")
    start_parser.add_argument("--log-verbose", type=int, default=0)
    start_parser.add_argument("--model-control-mode", default=None, choices=["none", "poll", "explicit"])
    start_parser.add_argument(
        "--server-extra-args",
        default="",
        help="more tritonserver arguments, shell-quoted (those after -- follow them)",
    )
    start_parser.add_argument(
        "--watchdog",
        default="auto",
        choices=[*ACTIONS, "off"],
        help="when a python-backend stub dies (tritonserver 2.51 never restarts it): reload its model "
        "(explicit model control), else stop the server so its readiness turns false (auto); off: no watchdog",
    )
    start_parser.add_argument(
        "--python-shm-bytes",
        type=int,
        default=PYTHON_SHM_BYTES,
        help="shared memory each python-backend model instance starts with (a pool that grows under load crashed BLS)",
    )
    commands.add_parser("status", parents=[common], help="whether the pid file's server runs and is ready")
    stop_parser = commands.add_parser(
        "stop", parents=[common], help="SIGTERM, then SIGKILL after --grace seconds"
    )
    stop_parser.add_argument(
        "--grace",
        type=float,
        default=None,
        help="seconds before SIGKILL (default: the server's --exit-timeout-secs and 10, at least 40)",
    )
    reload_parser = commands.add_parser(
        "reload",
        parents=[common],
        help="set string parameters in a model's config.pbtxt and load it again (explicit model control)",
    )
    reload_parser.add_argument("--model-repo", required=True)
    reload_parser.add_argument("--model", required=True)
    reload_parser.add_argument(
        "--set",
        action="append",
        required=True,
        metavar="KEY=VALUE",
        help="a parameter the config has (repeatable)",
    )
    reload_parser.add_argument("--timeout", type=float, default=600.0, help="seconds the load may take")
    args = parser.parse_args(argv)
    args.extra = extra
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        commands = {"prepare": prepare, "start": start, "status": status, "stop": stop, "reload": reload}
        return commands[args.command](args)
    except (TritonNotFoundError, ServerError) as err:
        print(f"triton_server.py {args.command}: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
