"""Disaggregated serving on one CPU machine through run.sh: stage 7 starts the LLM behind
`python -m tritontts.llm.openai_server` and two tritonservers (one per "GPU" of `--token2wav_gpus 0,1`) whose
CosyVoice2 BLS reaches the LLM over HTTP through `llm_endpoint`; stage 8 spreads 4 streaming tasks over both;
`run.sh stop` ends all of it. `--server_extra_args` gives each tritonserver a trace file named after it.
CUDA_VISIBLE_DEVICES is set per process but means nothing here. Each server has
two BLS instances, one for each of the two tasks it gets at once.

The cached speaker speaks (`--use_spk2info_cache true`, the 3 s default voice): a reference audio per request
would double the CPU time of this test; the reference path is covered by test_cosyvoice2_triton.py.
With `--realistic_lengths true` the client forces 25 tokens per expected second of each target text, and each
token is 960 samples of 24 kHz audio.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import python_backend_crash
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from tritontts.bench.dataset import load_utterances
from tritontts.bench.durations import expected_tokens
from tritontts.bench.triton_trace import read_traces, timelines, trace_files
from tritontts.triton.disaggregated.processes import ProcessRef
from tritontts.triton.server import free_ports

ROOT = Path(__file__).resolve().parents[1]
SAMPLES_PER_TOKEN, SAMPLE_RATE, TOKEN_RATE = 960, 24000, 25
TASKS = 4
SERVERS = 2
TRACE_EVERY_REQUEST = "--trace-config rate=1 --trace-config level=TIMESTAMPS"

pytestmark = pytest.mark.slow


def ephemeral_ports_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_base(count: int, taken: set[int]) -> int:
    """A port `base` such that base+1 .. base+count are free now and not in `taken`, below the kernel's ephemeral
    range where it can: there neither another test's server (free_ports) nor an outgoing connection is given one of
    them before this test's servers bind it."""
    rng = random.Random()
    top = ephemeral_ports_start() - count - 1
    while True:
        base = rng.randrange(20000, top if top > 21000 else 60000)
        ports = range(base + 1, base + count + 1)
        if taken.intersection(ports):
            continue
        try:
            for port in ports:
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", port))
        except OSError:
            continue
        taken.update(ports)
        return base


def run_sh(*args: str, exp: Path, timeout: int) -> subprocess.CompletedProcess:
    command = [
        "bash",
        "run.sh",
        *args,
        "--model",
        "cosyvoice2",
        "--exp_dir",
        str(exp),
        "--python",
        sys.executable,
    ]
    # torch sets TORCHINDUCTOR_CACHE_DIR in this process once anything compiled: run.sh would keep it
    env = {k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def environ(pid: int) -> dict[str, str]:
    entries = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(e.decode().split("=", 1) for e in entries if b"=" in e)


def stub_pids(server_pid: int) -> list[int]:
    """The python-backend stubs a tritonserver started (its children)."""
    children = Path(f"/proc/{server_pid}/task/{server_pid}/children").read_text().split()
    return [int(c) for c in children if "stub" in Path(f"/proc/{c}/cmdline").read_text()]


def bls_parameters(repo: Path) -> dict[str, str]:
    config = text_format.Parse(
        (repo / "cosyvoice2" / "config.pbtxt").read_text(), model_config_pb2.ModelConfig()
    )
    return {key: value.string_value for key, value in config.parameters.items()}


CRASHED = "a python-backend crash of tritonserver 2.51 in"


def _crashed_servers(run_dir: Path) -> str:
    """The deployment's server logs that end in one of tritonserver 2.51's python-backend crashes (docs/tests.md)."""
    crashed = [
        log.name
        for log in sorted(run_dir.glob("*.log"))
        if python_backend_crash(log.read_text(errors="replace"))
    ]
    return f"\n{CRASHED} {crashed}" if crashed else ""


def _a_server_crashed(error: BaseException | None) -> bool:
    return error is not None and CRASHED in str(error)


@pytest.mark.flaky(reruns=1, condition=_a_server_crashed)
def test_run_sh_stages_7_8_stream_over_two_token2wav_servers(tmp_path, bench_data):
    exp = tmp_path / "exp"
    (llm_port,) = free_ports(1)
    taken = {llm_port}
    http_base, grpc_base, metrics_base = (free_base(SERVERS, taken) for _ in range(3))
    done = run_sh("0", "0", "--model_source", "synthetic-tiny", exp=exp, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    options = [
        *("--model_source", "synthetic-tiny", "--llm_device", "cpu", "--llm_cuda_graphs", "false"),
        *("--model_device", "cpu", "--token2wav_gpus", "0,1", "--instances_per_gpu", "1"),
        *("--llm_port", str(llm_port), "--disagg_http_base_port", str(http_base)),
        *("--disagg_grpc_base_port", str(grpc_base), "--disagg_metrics_base_port", str(metrics_base)),
        *("--llm_server_max_batch_size", str(TASKS), "--llm_max_seq_len", "1024", "--bls_instance_num", "2"),
        *("--num_tasks", str(TASKS), "--realistic_lengths", "true", "--use_spk2info_cache", "true"),
        *("--dataset", str(bench_data), "--server_timeout", "180"),
        *(
            "--server_extra_args",
            f"--trace-config triton,file={exp}/trace_{{server}}.json {TRACE_EVERY_REQUEST}",
        ),
    ]
    home = exp / "cosyvoice2"
    state_file = home / "disagg" / "state.json"
    try:
        done = run_sh("7", "8", "streaming", *options, exp=exp, timeout=600)
        assert done.returncode == 0, (
            done.stdout[-4000:] + done.stderr[-4000:] + _crashed_servers(home / "disagg")
        )
        state = json.loads(state_file.read_text())
        processes = [state["llm"], *state["servers"]]
        devices = [environ(p["pid"]).get("CUDA_VISIBLE_DEVICES") for p in processes]
        stubs = [pid for p in state["servers"] for pid in stub_pids(p["pid"])]
        caches = {
            environ(pid).get("TORCHINDUCTOR_CACHE_DIR") for pid in [p["pid"] for p in processes] + stubs
        }
    finally:
        stopped = run_sh("stop", exp=exp, timeout=120)
    assert stopped.returncode == 0, stopped.stderr

    assert devices == ["0", "0", "1"]
    assert stubs and caches == {str((exp / "compile_cache" / "inductor").resolve())}
    assert (state["status"], state["num_gpus"], state["gpus"]) == ("ready", 2, ["0", "1"])
    assert state["llm"]["chat_url"] == f"http://127.0.0.1:{llm_port}/v1/chat/completions"
    servers = state["servers"]
    assert [(s["gpu"], s["http_port"], s["grpc_port"], s["metrics_port"]) for s in servers] == [
        (str(gpu), http_base + 1 + gpu, grpc_base + 1 + gpu, metrics_base + 1 + gpu) for gpu in range(SERVERS)
    ]
    repo = Path(state["model_repo"])
    assert repo == (home / "model_repo_disagg_streaming").resolve()
    assert sorted(p.name for p in repo.iterdir()) == [
        "audio_tokenizer",
        "cosyvoice2",
        "speaker_embedding",
        "text_inbox",
        "token2wav",
    ]
    bls = bls_parameters(repo)
    assert (bls["llm_endpoint"], bls["tensorrt_llm_model"]) == (state["llm"]["chat_url"], "none")

    assert not state_file.exists() and not list((home / "disagg").glob("*.pid"))
    for process in processes:
        ref = ProcessRef.from_dict(process)
        assert not ref.alive() and not ref.group_members(), f"{process['pid']} outlived run.sh stop"

    log_dir = home / f"log_disagg_streaming_tasks_{TASKS}"
    summary = json.loads((log_dir / "summary.json").read_text())
    (run,) = summary["runs"]
    assert (run["concurrency"], run["succeeded"], run["failed"]) == (TASKS, TASKS, 0)
    (breakdown,) = summary["per_server"]
    *by_server, total = breakdown["servers"]
    assert [row["server"] for row in by_server] == [s["grpc_url"] for s in servers]
    assert [(row["requests"], row["failed"], row["concurrent_tasks_per_server"]) for row in by_server] == [
        (2, 0, 2),
        (2, 0, 2),
    ]
    assert all(row["first_chunk_latency"]["avg"] > 0 for row in by_server)
    assert (total["server"], total["requests"]) == ("all", TASKS)
    assert total["concurrent_tasks_per_gpu"] == pytest.approx(TASKS / 2)
    assert total["first_chunk_latency"]["avg"] > 0
    assert "concurrent_tasks_per_gpu" in (log_dir / "summary.md").read_text()
    for index, row in enumerate(by_server):  # --server_extra_args reached each server, with its own name
        traced = timelines(read_traces(trace_files(exp / f"trace_token2wav_{index}.json")), "cosyvoice2")
        assert len(traced) == row["requests"], [t.request_id for t in traced]

    rows = {utt.id: utt for utt in load_utterances(str(bench_data), "wenetspeech4tts")}
    for record in run["records"]:
        tokens = expected_tokens(rows[record["id"]].target_text, TOKEN_RATE)
        assert record["audio_seconds"] * SAMPLE_RATE == pytest.approx(tokens * SAMPLES_PER_TOKEN)


def test_the_stages_7_8_test_runs_again_only_after_a_server_crashed(tmp_path):
    from test_session_server import INFER_ASYNC_CRASH

    (tmp_path / "llm.log").write_text("INFO: Uvicorn running\n")
    (tmp_path / "token2wav_0.log").write_text("I1207 started\n")
    assert _crashed_servers(tmp_path) == "" and not _a_server_crashed(AssertionError("2 failed"))
    (tmp_path / "token2wav_1.log").write_text(INFER_ASYNC_CRASH)
    message = "request 001_zh failed: Stub process 'cosyvoice2_0_0' is not healthy." + _crashed_servers(
        tmp_path
    )
    assert message.endswith("['token2wav_1.log']") and _a_server_crashed(AssertionError(message))
    assert not _a_server_crashed(None)
