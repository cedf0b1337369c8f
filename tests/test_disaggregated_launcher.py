"""scripts/disaggregated.py's plan: GPUs, ports, environments and command lines of the LLM server (ours and
trtllm-serve) and the token2wav tritonservers; its refusals; and one start that fails and cleans up."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from waiting import wait_until

from tritontts.triton.bundle import TritonInstall
from tritontts.triton.disaggregated.cli import get_parser, main, topology_from_args
from tritontts.triton.disaggregated.launcher import LaunchError, read_state, start, status, stop_all
from tritontts.triton.disaggregated.plan import LLMServerPlan, PlanError, PortBases, Topology, parse_gpus
from tritontts.triton.disaggregated.processes import ProcessRef, spawn, start_ticks
from tritontts.triton.server import free_ports
from tritontts.triton.stubs import is_alive

ROOT = Path(__file__).resolve().parents[1]
UPSTREAM_MPIRUN = ("mpirun", "-np", "1", "--allow-run-as-root", "--oversubscribe")
INSTALL = TritonInstall(binary=Path("/opt/tritonserver/bin/tritonserver"), source="PATH")


def torch_llm(**overrides) -> LLMServerPlan:
    fields = {"backend": "torch", "model_dir": Path("/ckpt/cosyvoice2_llm"), "gpus": ("0",), "port": 8010}
    return LLMServerPlan(**(fields | overrides))


def trtllm(**overrides) -> LLMServerPlan:
    return torch_llm(backend="trtllm", engine_dir=Path("/exp/trt_engines_bfloat16"), **overrides)


def topology(gpus=("1", "2"), instances=2, llm=None, bases=None) -> Topology:
    return Topology(llm or torch_llm(), Path("/repo"), gpus, instances, bases or PortBases())


def test_servers_are_numbered_instance_major_on_upstream_ports():
    servers = topology().servers()
    assert [(s.name, s.gpu, s.instance, s.http_port, s.grpc_port, s.metrics_port) for s in servers] == [
        ("token2wav_0", "1", 0, 17001, 18001, 16001),
        ("token2wav_1", "2", 0, 17002, 18002, 16002),
        ("token2wav_2", "1", 1, 17003, 18003, 16003),
        ("token2wav_3", "2", 1, 17004, 18004, 16004),
    ]
    assert [s.grpc_url for s in servers[:2]] == ["127.0.0.1:18001", "127.0.0.1:18002"]


@pytest.mark.parametrize(
    "llm_gpus, token2wav_gpus, expected",
    [
        (("0",), ("1", "2", "3"), ["0", "1", "2", "3"]),
        (("0",), ("0", "1"), ["0", "1"]),
        (("0", "1"), ("2",), ["0", "1", "2"]),
    ],
)
def test_gpus_of_the_deployment_are_counted_once(llm_gpus, token2wav_gpus, expected):
    assert topology(token2wav_gpus, llm=torch_llm(gpus=llm_gpus)).gpus == expected


def test_each_process_sees_only_its_gpus():
    base = {"PATH": "/usr/bin", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    assert torch_llm(gpus=("0", "1")).environment(base) == {"PATH": "/usr/bin", "CUDA_VISIBLE_DEVICES": "0,1"}
    server = topology().servers()[3]
    assert server.environment(INSTALL, base) == {"PATH": "/usr/bin", "CUDA_VISIBLE_DEVICES": "2"}


def test_token2wav_server_command_has_its_own_ports():
    server = topology().servers()[1]
    command = server.command(Path("/repo"), Path("/run"), INSTALL)
    assert command[0] == "/opt/tritonserver/bin/tritonserver"
    for flag in (
        "--model-repository=/repo",
        "--http-port=17002",
        "--grpc-port=18002",
        "--metrics-port=16002",
    ):
        assert flag in command


def test_torch_llm_command_is_our_openai_server():
    plan = torch_llm(address="0.0.0.0", max_batch_size=4, device="cpu", cuda_graphs=False, python="python3")
    assert plan.command() == [
        *("python3", "-m", "tritontts.llm.openai_server", "--model-dir", "/ckpt/cosyvoice2_llm"),
        *("--host", "0.0.0.0", "--port", "8010", "--max-batch-size", "4", "--max-seq-len", "2560"),
        *("--dtype", "auto", "--device", "cpu", "--no-cuda-graphs"),
    ]
    assert plan.chat_url == "http://127.0.0.1:8010/v1/chat/completions"


def test_trtllm_command_is_upstreams_trtllm_serve():
    plan = trtllm(command_prefix=UPSTREAM_MPIRUN, extra_args=("--backend", "tensorrt"))
    assert plan.command() == [
        *UPSTREAM_MPIRUN,
        *("trtllm-serve", "serve", "/exp/trt_engines_bfloat16", "--tokenizer", "/ckpt/cosyvoice2_llm"),
        *("--max_batch_size", "64", "--kv_cache_free_gpu_memory_fraction", "0.4"),
        *("--host", "127.0.0.1", "--port", "8010", "--backend", "tensorrt"),
    ]


def test_trtllm_without_trtllm_serve_says_where_it_runs(tmp_path):
    with pytest.raises(PlanError, match="trtllm-serve is not on PATH.*use llm backend torch"):
        trtllm().check_runnable({"PATH": str(tmp_path)})
    fake = tmp_path / "trtllm-serve"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    with pytest.raises(PlanError, match="mpirun .*is not on PATH"):
        trtllm(command_prefix=UPSTREAM_MPIRUN).check_runnable({"PATH": str(tmp_path)})
    with pytest.raises(PlanError, match="no TensorRT-LLM engine in .*stage 1"):
        trtllm().check_runnable({"PATH": str(tmp_path)})


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: parse_gpus("0,,1", "--token2wav-gpus"), "--token2wav-gpus must be comma-separated"),
        (lambda: parse_gpus("1,1", "--token2wav-gpus"), "names a GPU twice"),
        (lambda: topology(instances=0), "instances per GPU must be at least 1"),
        (lambda: topology(llm=torch_llm(port=18002)), "port 18002 would serve twice"),
        (lambda: topology(bases=PortBases(17000, 17002, 16000)), "port 17003 would serve twice"),
        (lambda: topology(bases=PortBases(65534, 18000, 16000)), "port 65536 is out of range"),
        (lambda: torch_llm(backend="trtllm"), "needs the engine directory"),
        (lambda: torch_llm(device="tpu"), "llm device must be one of"),
    ],
)
def test_bad_plans_are_refused_naming_the_problem(build, message):
    with pytest.raises(PlanError, match=message):
        build()


def test_cli_builds_the_topology_and_dry_run_prints_it(tmp_path, capsys):
    argv = ["start", "--state-file", str(tmp_path / "state.json"), "--model-repo", str(tmp_path)]
    argv += [
        "--llm-model-dir",
        "/ckpt/llm",
        "--llm-gpus",
        "0",
        "--token2wav-gpus",
        "1,2",
        "--instances-per-gpu",
        "1",
    ]
    argv += [
        "--llm-backend",
        "trtllm",
        "--llm-engine-dir",
        "/exp/engines",
        "--llm-extra-args",
        "--backend tensorrt",
    ]
    argv += ["--llm-command-prefix", " ".join(UPSTREAM_MPIRUN), "--grpc-base-port", "19000"]
    argv += ["--server-extra-args", "--trace-config 'triton,file=/t/trace {server}.json' --log-info true"]
    plan = topology_from_args(get_parser().parse_args(argv))
    assert plan.llm.command()[:7] == [*UPSTREAM_MPIRUN, "trtllm-serve", "serve"]
    assert plan.llm.command()[-2:] == ["--backend", "tensorrt"]
    for server in plan.servers():
        command = server.command(tmp_path, tmp_path, INSTALL)
        assert command[-4:] == [
            "--trace-config",
            f"triton,file=/t/trace {server.name}.json",
            "--log-info",
            "true",
        ]
    assert main([*argv, "--dry-run"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["num_gpus"] == 3 and printed["llm"]["gpus"] == ["0"]
    assert [s["grpc_url"] for s in printed["servers"]] == ["127.0.0.1:19001", "127.0.0.1:19002"]
    assert not (tmp_path / "state.json").exists()


def test_status_and_stop_without_a_state_file(tmp_path, capsys):
    state_file = str(tmp_path / "state.json")
    assert main(["status", "--state-file", state_file]) == 3
    assert main(["status", "--state-file", state_file, "--print", "server_addrs"]) == 3
    assert main(["stop", "--state-file", state_file]) == 0
    assert "does not exist" in capsys.readouterr().out


def write_state_of(state_file: Path, pid: int, ticks: int) -> None:
    entry = {"pid": pid, "start_ticks": ticks, "pid_file": str(state_file.parent / "x.pid")}
    llm = entry | {"url": "http://127.0.0.1:1", "backend": "torch", "gpus": ["0"]}
    state_file.write_text(json.dumps({"version": 1, "llm": llm, "servers": []}))


def test_start_refuses_while_the_state_files_processes_run(tmp_path):
    state_file = tmp_path / "state.json"
    write_state_of(state_file, os.getpid(), start_ticks(os.getpid()))
    assert status(state_file)[0] == 1  # alive (this very test) but no /health
    with pytest.raises(LaunchError, match="already running from .*stop them first"):
        start(topology(), state_file, install=INSTALL, say=lambda _: None)
    assert read_state(state_file)["llm"]["pid"] == os.getpid()


def test_a_recycled_pid_is_not_ours():
    ticks = start_ticks(os.getpid())
    assert ProcessRef(os.getpid(), ticks).alive()
    assert not ProcessRef(os.getpid(), ticks + 1).alive()


@pytest.mark.slow
def test_a_failed_start_stops_what_it_started(tmp_path):
    """The LLM server exits (its checkpoint is not one), so the tritonserver already started is stopped too."""
    llm_dir = tmp_path / "llm"
    llm_dir.mkdir()
    (llm_dir / "config.json").write_text("{}")
    (tmp_path / "repo").mkdir()
    llm_port, http, grpc, metrics = free_ports(4)
    state_file = tmp_path / "run" / "state.json"
    argv = [
        sys.executable,
        str(ROOT / "scripts" / "disaggregated.py"),
        "start",
        "--state-file",
        str(state_file),
    ]
    argv += ["--model-repo", str(tmp_path / "repo"), "--llm-model-dir", str(llm_dir), "--llm-device", "cpu"]
    argv += [
        "--llm-port",
        str(llm_port),
        "--token2wav-gpus",
        "0",
        "--instances-per-gpu",
        "1",
        "--timeout",
        "120",
    ]
    argv += [
        "--http-base-port",
        str(http - 1),
        "--grpc-base-port",
        str(grpc - 1),
        "--metrics-base-port",
        str(metrics - 1),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180)
    assert done.returncode == 1
    assert "llm exited with code" in done.stderr
    assert not state_file.exists() and not list(state_file.parent.glob("*.pid"))
    for log in ("llm.log", "token2wav_0.log"):
        assert (state_file.parent / log).is_file()
    for port in (llm_port, http, grpc, metrics):
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(("127.0.0.1", port))  # nobody listens there any more


def test_stop_ends_whole_sessions_and_skips_servers_never_started(tmp_path):
    """A server's leftover children (python-backend stubs) go too, though only its main process gets SIGTERM."""
    state_file = tmp_path / "state.json"
    family = ["sh", "-c", "sleep 60 & exec sleep 61"]
    llm, server = (
        spawn(family, os.environ, tmp_path / f"{n}.log", tmp_path / f"{n}.pid") for n in ("l", "s")
    )
    write_state_of(state_file, llm.ref.pid, llm.ref.start_ticks)
    state = json.loads(state_file.read_text())
    common = {"http_url": "127.0.0.1:1", "gpu": "1", "grpc_url": "", "http_port": 1, "metrics_port": 2}
    state["servers"] = [
        common | {"name": "token2wav_0", "pid_file": str(tmp_path / "s.pid")} | server.ref.to_dict(),
        common | {"name": "token2wav_1", "pid_file": str(tmp_path / "never.pid")},
    ]
    state_file.write_text(json.dumps(state))
    try:
        assert stop_all(state_file, grace_s=5, say=lambda _: None) == 2
    finally:
        for spawned in (llm, server):
            spawned.process.wait(timeout=15)
    for spawned in (llm, server):
        assert not spawned.ref.alive() and not spawned.ref.group_members()
    assert not state_file.exists() and not (tmp_path / "s.pid").exists()


ABORT_ONCE_CONFIG = """name: "abort_once"
backend: "python"
max_batch_size: 0
input [ { name: "X", data_type: TYPE_FP32, dims: [ 1 ] } ]
output [ { name: "Y", data_type: TYPE_FP32, dims: [ 1 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
parameters [ { key: "marker", value: { string_value: "MARKER" } } ]
"""
ABORT_ONCE_MODEL = """import json
import os
import signal
import time
from pathlib import Path


class TritonPythonModel:
    def initialize(self, args):
        marker = Path(json.loads(args["model_config"])["parameters"]["marker"]["string_value"])
        if not marker.exists():  # the first load aborts its tritonserver, as 2.51's stub sometimes does
            marker.write_text("aborted once")
            time.sleep(3)  # long enough for the server's watchdog (it polls every second) to see this stub
            os.kill(os.getsid(0), signal.SIGABRT)
            time.sleep(30)

    def execute(self, requests):
        return []
"""


def test_a_tritonserver_aborted_while_loading_is_started_once_more(tmp_path):
    repo = tmp_path / "repo"
    (repo / "abort_once" / "1").mkdir(parents=True)
    marker = tmp_path / "aborted"
    (repo / "abort_once" / "config.pbtxt").write_text(ABORT_ONCE_CONFIG.replace("MARKER", str(marker)))
    (repo / "abort_once" / "1" / "model.py").write_text(ABORT_ONCE_MODEL)
    http, grpc, metrics = free_ports(3)
    bases = PortBases(http - 1, grpc - 1, metrics - 1)
    state_file = tmp_path / "run" / "state.json"
    said: list[str] = []
    try:
        state = start(Topology(None, repo, ("0",), 1, bases), state_file, timeout_s=300, say=said.append)
        assert marker.read_text() == "aborted once" and state["status"] == "ready"
        (relaunched,) = [line for line in said if "while loading" in line]
        assert relaunched.startswith("triton_0 was killed by signal 6 while loading; starting it again")
        first_log = (state_file.parent / "triton_0.log.failed").read_text()
        assert "loading: abort_once:1" in first_log
        assert status(state_file)[0] == 0  # the pid in the state file is the second server's, ready
        first_watchdog = state_file.parent / "triton_0.log.failed.watchdog"
        wait_until(
            lambda: first_watchdog.read_text() if first_watchdog.exists() else "",
            lambda text: "the shared memory of a dead stub" in text,
            "the aborted server's watchdog to remove its stub's pool",
            timeout=60.0,
            interval=0.2,
        )
        assert "watching" in (state_file.parent / "triton_0.log.watchdog").read_text()
        watchdog_pid = state["servers"][0]["watchdog_pid"]
    finally:
        stop_all(state_file, grace_s=20, say=said.append)
    wait_until(
        lambda: is_alive(watchdog_pid),
        lambda alive: not alive,
        "the watchdog to end with its server",
        timeout=60.0,
    )
