"""Disaggregated serving on one CPU machine: the LLM behind `python -m tritontts.llm.openai_server`, two
tritonservers holding the CosyVoice2 BLS (reaching the LLM over HTTP through `llm_endpoint`) with its
audio_tokenizer, speaker_embedding and token2wav, and client_grpc.py spreading 4 streaming tasks over both.

The cached speaker speaks (`--use-spk2info-cache true`, the 3 s default voice): a reference audio per request
would double the CPU time of this test; the reference path is covered by test_cosyvoice2_triton.py.
With `--realistic-lengths` the client forces 25 tokens per expected second of each target text, and each token
is 960 samples of 24 kHz audio.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
from cosyvoice2_models import COMMON, TEMPLATES, install_template
from http_service import http_service

from tritontts.bench.dataset import load_utterances
from tritontts.bench.durations import expected_tokens
from tritontts.synthetic.cosyvoice2 import write_cosyvoice2_checkpoint
from tritontts.triton.server import ServerConfig, TritonServer, free_ports

ROOT = Path(__file__).resolve().parents[1]
SAMPLES_PER_TOKEN, SAMPLE_RATE, TOKEN_RATE = 960, 24000, 25
TASKS = 4
MAX_NEW_TOKENS = 300
LEAVES = ("audio_tokenizer", "speaker_embedding", "token2wav")

pytestmark = pytest.mark.slow


def build_token2wav_repo(repo: Path, model_dir: Path, llm_dir: Path, llm_endpoint: str) -> None:
    """The BLS and its leaf models, no tensorrt_llm: `llm_endpoint` is added to the filled BLS config."""
    front = f"model_dir:{model_dir},{COMMON},instance_num:1,device:cpu,max_reference_seconds:30"
    for leaf in ("audio_tokenizer", "speaker_embedding"):
        install_template(TEMPLATES, leaf, repo, leaf, front)
    install_template(
        TEMPLATES, "token2wav", repo, "token2wav", f"model_dir:{model_dir},{COMMON},device:cpu,dtype:float32"
    )
    leaves = ",".join(f"{leaf}_model:{leaf}" for leaf in LEAVES)
    bls = install_template(
        TEMPLATES,
        "cosyvoice2",
        repo,
        "cosyvoice2",
        f"model_dir:{model_dir},llm_tokenizer_dir:{llm_dir},{COMMON},decoupled_mode:true,bls_instance_num:1,"
        f"token_hop_len:15,pre_lookahead_len:3,dynamic_chunk_strategy:exponential,"
        f"max_new_tokens:{MAX_NEW_TOKENS},max_text_length:300,max_reference_seconds:30,{leaves},"
        "tensorrt_llm_model:none",
    )
    config = bls / "config.pbtxt"
    parameter = f'  {{ key: "llm_endpoint", value: {{ string_value: "{llm_endpoint}" }} }},\n'
    config.write_text(config.read_text().replace("parameters [\n", "parameters [\n" + parameter, 1))


@contextmanager
def llm_server(llm_dir: Path, log_file: Path) -> Iterator[str]:
    """The chat-completions URL once `/health` answers; the process ends on exit."""
    args = [
        "--model-dir",
        str(llm_dir),
        "--device",
        "cpu",
        "--max-batch-size",
        str(TASKS),
        "--max-seq-len",
        "1024",
        "--no-cuda-graphs",
        "--log-level",
        "warning",
    ]
    with http_service("tritontts.llm.openai_server", args, log_file, timeout_s=90) as url:
        yield f"{url}/v1/chat/completions"


def token2wav_server(root: Path, name: str, model_dir: Path, llm_dir: Path, endpoint: str) -> TritonServer:
    repo = root / name / "model_repo"
    build_token2wav_repo(repo, model_dir, llm_dir, endpoint)
    http, grpc, metrics = free_ports(3)
    config = ServerConfig(
        repo, http, grpc, metrics, log_file=root / name / "tritonserver.log", exit_timeout_s=5
    )
    return TritonServer(config)


def test_streaming_tasks_spread_over_two_token2wav_servers(tmp_path, bench_data):
    paths = write_cosyvoice2_checkpoint(tmp_path / "cosyvoice2_tiny", "tiny", 0)
    model_dir, llm_dir = paths.model_dir.resolve(), paths.llm_dir.resolve()
    with ExitStack() as stack:
        endpoint = stack.enter_context(llm_server(llm_dir, tmp_path / "llm.log"))
        servers = [token2wav_server(tmp_path, f"t2w{i}", model_dir, llm_dir, endpoint) for i in range(2)]
        for server in servers:
            stack.callback(server.stop, 15)
            server.start()
        for server in servers:
            server.wait_ready(timeout=120)
        log_dir = tmp_path / "bench"
        command = [
            sys.executable,
            str(ROOT / "client_grpc.py"),
            "--server-addrs",
            ",".join(server.grpc_url for server in servers),
            "--num-gpus",
            "3",
            "--model-name",
            "cosyvoice2",
            "--mode",
            "streaming",
            "--num-tasks",
            str(TASKS),
            "--realistic-lengths",
            "--use-spk2info-cache",
            "true",
            "--huggingface-dataset",
            str(bench_data),
            "--log-dir",
            str(log_dir),
        ]
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        logs = "".join(server.log_tail() for server in servers)
        assert done.returncode == 0, done.stdout + done.stderr + logs

    summary = json.loads((log_dir / "summary.json").read_text())
    (run,) = summary["runs"]
    assert (run["concurrency"], run["succeeded"], run["failed"]) == (TASKS, 4, 0)
    (breakdown,) = summary["per_server"]
    *by_server, total = breakdown["servers"]
    assert [row["server"] for row in by_server] == [server.grpc_url for server in servers]
    assert [(row["requests"], row["failed"], row["concurrent_tasks_per_server"]) for row in by_server] == [
        (2, 0, 2),
        (2, 0, 2),
    ]
    assert all(row["first_chunk_latency"]["avg"] > 0 for row in by_server)
    assert (total["requests"], total["concurrent_tasks_per_gpu"]) == (4, pytest.approx(TASKS / 3))
    assert "concurrent_tasks_per_server" in (log_dir / "summary.md").read_text()

    rows = {utt.id: utt for utt in load_utterances(str(bench_data), "wenetspeech4tts")}
    for record in run["records"]:
        tokens = expected_tokens(rows[record["id"]].target_text, TOKEN_RATE)
        assert record["audio_seconds"] * SAMPLE_RATE == pytest.approx(tokens * SAMPLES_PER_TOKEN)
