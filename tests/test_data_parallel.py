"""Data parallel through run.sh (`--gpus`): stage 3 starts one tritonserver per GPU, each serving the whole Spark-TTS
pipeline with its LLM inside Triton, on ports disagg_*_base_port + 1 + i; stage 4 spreads its workers over them and
keeps `--num_requests` requests going by cycling the dataset's rows; `run.sh stop` ends them. On this CPU machine
CUDA_VISIBLE_DEVICES is set per server but means nothing. Also the launcher's co-located plan (`--dry-run`) and
the client's row cycling.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_disaggregated import environ, free_base

from tritontts.bench.dataset import Utterance, load_utterances
from tritontts.bench.triton_trace import read_traces, timelines, trace_files
from tritontts.triton.disaggregated.processes import ProcessRef

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "disaggregated.py"


def _client():
    spec = importlib.util.spec_from_file_location("client_grpc_data_parallel", ROOT / "client_grpc.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _utterance(name: str) -> Utterance:
    return Utterance(name, "prompt", np.zeros(16000, np.float32), 16000, f"target {name}")


def test_cycled_rows_get_a_pass_suffix_from_the_second_pass_on():
    cycled = _client().cycled
    rows = [_utterance("a"), _utterance("b")]
    assert [u.id for u in cycled(rows, 5)] == ["a", "b", "a.1", "b.1", "a.2"]
    assert cycled(rows, 5)[2].prompt_audio is rows[0].prompt_audio
    assert [u.id for u in cycled(rows, 0)] == ["a", "b"]


def test_co_located_dry_run_has_one_whole_pipeline_server_per_gpu_and_no_llm(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "start",
            "--co-located",
            "--state-file",
            str(tmp_path / "dp/state.json"),
        ]
        + ["--model-repo", str(repo), "--token2wav-gpus", "0,1,2,3", "--instances-per-gpu", "1"]
        + [
            "--http-base-port",
            "27000",
            "--grpc-base-port",
            "28000",
            "--metrics-base-port",
            "26000",
            "--dry-run",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    plan = json.loads(done.stdout)
    assert plan["layout"] == "co-located" and plan["llm"] is None and plan["num_gpus"] == 4
    servers = plan["servers"]
    assert [s["name"] for s in servers] == ["triton_0", "triton_1", "triton_2", "triton_3"]
    assert [s["gpu"] for s in servers] == ["0", "1", "2", "3"]
    assert [(s["http_port"], s["grpc_port"], s["metrics_port"]) for s in servers] == [
        (27001 + i, 28001 + i, 26001 + i) for i in range(4)
    ]
    assert all(f"--model-repository={repo}" in s["command"] for s in servers)


def test_disaggregated_start_still_needs_the_llm_dir(tmp_path):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "start", "--state-file", str(tmp_path / "s.json")]
        + ["--model-repo", str(tmp_path), "--dry-run"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1 and "--llm-model-dir is required unless --co-located" in done.stderr


def _run_sh(*args: str, exp: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    command = [
        "bash",
        "run.sh",
        *args,
        "--model",
        "spark_tts",
        "--exp_dir",
        str(exp),
        "--python",
        sys.executable,
    ]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
@pytest.mark.triton
def test_run_sh_gpus_serves_one_pipeline_per_gpu_and_spreads_the_requests(
    tmp_path, spark_tiny_dir, bench_data
):
    taken: set[int] = set()
    bases = [f"--disagg_{kind}_base_port={free_base(2, taken)}" for kind in ("http", "grpc", "metrics")]
    exp = tmp_path / "exp"
    serve = ["--model_source", str(spark_tiny_dir), "--gpus", "0,1", "--bls_instance_num", "2", *bases]
    tracing = "--trace-config rate=1 --trace-config level=TIMESTAMPS"
    serve += ["--server_extra_args", f"--trace-config triton,file={tmp_path}/trace_{{server}}.json {tracing}"]
    state = exp / "spark_tts" / "data_parallel" / "state.json"
    try:
        done = _run_sh("2", "3", "offline", *serve, exp=exp)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        servers = json.loads(state.read_text())["servers"]
        assert [environ(s["pid"])["CUDA_VISIBLE_DEVICES"] for s in servers] == ["0", "1"]
        bench = ["--gpus", "0,1", "--num_tasks", "4", "--num_requests", "6", "--max_new_tokens", "40"]
        bench += ["--dataset", str(bench_data), *bases]
        done = _run_sh("4", "4", "offline", *bench, exp=exp)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    finally:
        stopped = _run_sh("stop", "--gpus", "0,1", exp=exp, timeout=120)
    assert stopped.returncode == 0, stopped.stderr
    assert not state.exists()
    assert not any(ProcessRef.from_dict(s).alive() for s in servers)
    summary = json.loads((exp / "spark_tts" / "log_offline_tasks_4" / "summary.json").read_text())
    (run,) = summary["runs"]
    assert (run["concurrency"], run["succeeded"], run["failed"]) == (4, 6, 0)
    rows = [u.id for u in load_utterances(bench_data, "test")]
    assert [r["id"] for r in run["records"]] == [*rows, f"{rows[0]}.1", f"{rows[1]}.1"]
    (level,) = summary["per_server"]
    by_server = {row["server"]: row["requests"] for row in level["servers"]}
    assert by_server.pop("all") == 6 and len(by_server) == 2 and all(n > 0 for n in by_server.values())
    traced = [  # --server_extra_args reached both servers, each with a trace file of its own name
        len(timelines(read_traces(trace_files(tmp_path / f"trace_triton_{index}.json")), "spark_tts"))
        for index in range(2)
    ]
    assert sorted(traced) == sorted(by_server.values()), traced


def test_a_negative_request_count_is_refused_naming_the_option():
    done = subprocess.run(
        [sys.executable, str(ROOT / "client_grpc.py"), "--num-requests", "-1", "--server-port", "1"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "--num-requests must be 0 (each row once) or more, got -1" in done.stderr
