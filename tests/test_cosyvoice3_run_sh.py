"""run.sh --model cosyvoice3 on CPU: stages 0-5 from the tiny synthetic checkpoint to WAV files and a benchmark
summary (the LLM inside Triton), the repository stage 2 fills, and stage 7's repository for upstream's topology
(the BLS asking an OpenAI-compatible LLM server) without starting it; stage 9 is in
test_cosyvoice3_offline_inference.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import soundfile
from test_run_sh import ROOT, _parameters, _parse_repo, run_sh

from tritontts.triton.server import free_ports

pytestmark = pytest.mark.slow
MODELS = {"cosyvoice3", "audio_tokenizer", "speaker_embedding", "token2wav", "vocoder"}


@pytest.mark.parametrize("mode, stages", [("offline", ("0", "5")), ("streaming", ("2", "5"))])
def test_stages_leave_wavs_and_a_summary(tmp_path_factory, bench_data, mode, stages):
    exp = tmp_path_factory.getbasetemp() / "exp_cosyvoice3"
    ports = free_ports(3)
    options = ["--model", "cosyvoice3", "--model_source", "synthetic-tiny", "--max_new_tokens", "300",
               "--realistic_lengths", "true", "--num_tasks", "2", "--dataset", str(bench_data),
               "--reference_audio", str(ROOT.parent / "shared/data/prompt_zh.wav")]  # fmt: skip
    try:
        done = run_sh(*stages, mode, *options, exp=exp, ports=ports, timeout=900)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    finally:
        run_sh("stop", "--model", "cosyvoice3", exp=exp, ports=ports)
    home = exp / "cosyvoice3"
    (run,) = json.loads((home / f"log_{mode}_tasks_2" / "summary.json").read_text())["runs"]
    assert (run["mode"], run["succeeded"], run["failed"]) == (mode, 4, 0)
    for wav in (home / f"log_{mode}_tasks_2").rglob("*.wav"):
        info = soundfile.info(wav)
        assert info.samplerate == 24000 and info.frames % 960 == 0 and info.frames > 0
    (single,) = (home / f"single_{mode}").glob("*.wav")
    assert soundfile.info(single).frames % 960 == 0


def test_stages_2_and_7_fill_repositories_for_both_llm_placements(tmp_path):
    exp = tmp_path / "exp"
    base = [
        "--model",
        "cosyvoice3",
        "--model_source",
        "synthetic-tiny",
        "--exp_dir",
        str(exp),
        "--python",
        sys.executable,
    ]
    import subprocess

    def run(*args: str) -> None:
        done = subprocess.run(
            ["bash", "run.sh", *args, *base], cwd=ROOT, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    base += ["--token2wav_instance_num", "2"]
    run("0", "2", "streaming")
    run("7", "7", "streaming", "--disagg_start", "false", "--llm_port", "8123")
    checkpoint = (exp / "cosyvoice3" / "checkpoint").resolve()
    inside = _parse_repo(exp / "cosyvoice3" / "model_repo_torch_streaming")
    assert set(inside) == MODELS | {"tensorrt_llm", "text_inbox"}  # text_inbox: bistream's text deltas
    behind = _parse_repo(exp / "cosyvoice3" / "model_repo_disagg_streaming")
    assert set(behind) == MODELS | {"text_inbox"}
    for parsed, llm_model, endpoint in (
        (inside, "tensorrt_llm", ""),
        (behind, "none", "http://127.0.0.1:8123/v1/chat/completions"),
    ):
        bls = _parameters(parsed["cosyvoice3"])
        assert bls["model_dir"] == str(checkpoint / "Fun-CosyVoice3-0.5B-2512")
        assert bls["llm_tokenizer_dir"] == str(checkpoint / "hf_cosyvoice3_llm")
        assert (bls["tensorrt_llm_model"], bls["llm_api_base"], bls["max_new_tokens"]) == (
            llm_model,
            endpoint,
            "750",
        )
        assert parsed["cosyvoice3"].model_transaction_policy.decoupled
        assert parsed["token2wav"].instance_group[0].count == 2  # stateless: streaming takes several
        assert _parameters(parsed["vocoder"])["cuda_graphs"] == "auto"  # as the flow's token2wav_cuda_graphs
        assert (
            _parameters(parsed["token2wav"])["flow_compile"] == "auto"
        )  # cosyvoice3 compiles its DiT where it has graphs
        assert _parameters(parsed["token2wav"])["stream_calls"] == "true"  # chunks and the final call
        assert _parameters(parsed["token2wav"])["cuda_graph_batch_sizes"] == "1,2,4,8"  # auto
        assert _parameters(parsed["audio_tokenizer"])["tokenizer_file"] == "speech_tokenizer_v3.onnx"
        for name in MODELS - {"cosyvoice3"}:
            assert _parameters(parsed[name])["model_dir"] == bls["model_dir"]
    for name in ("audio_tokenizer", "speaker_embedding"):
        model_py = exp / "cosyvoice3" / "model_repo_torch_streaming" / name / "1" / "model.py"
        assert model_py.is_file() and not model_py.is_symlink()


def test_stage_10_has_no_cosyvoice3_pipeline_and_says_so(tmp_path):
    done = run_sh("10", "10", "--model", "cosyvoice3", exp=tmp_path, ports=free_ports(3))
    assert done.returncode == 2 and "stage 10" in done.stderr


def test_stages_7_8_serve_upstreams_topology(tmp_path, bench_data):
    """The LLM behind our OpenAI-compatible server and one tritonserver whose BLS streams from it (upstream's
    run_cosyvoice3.sh stages 3-4 on one device), benchmarked by stage 8."""
    exp = tmp_path / "exp"
    llm_port, http, grpc, metrics = free_ports(4)
    options = ["--model", "cosyvoice3", "--model_source", "synthetic-tiny", "--llm_device", "cpu",
               "--llm_cuda_graphs", "false", "--model_device", "cpu", "--llm_gpus", "0", "--token2wav_gpus", "0",
               "--instances_per_gpu", "1", "--llm_port", str(llm_port), "--disagg_http_base_port", str(http - 1),
               "--disagg_grpc_base_port", str(grpc - 1), "--disagg_metrics_base_port", str(metrics - 1),
               "--llm_server_max_batch_size", "2", "--llm_max_seq_len", "1024", "--num_tasks", "2",
               "--realistic_lengths", "true", "--max_new_tokens", "300", "--dataset", str(bench_data),
               "--server_timeout", "180"]  # fmt: skip
    home = exp / "cosyvoice3"
    try:
        done = run_sh("0", "0", *options, exp=exp, ports=free_ports(3))
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        done = run_sh("7", "8", "streaming", *options, exp=exp, ports=free_ports(3), timeout=900)
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
        state = json.loads((home / "disagg" / "state.json").read_text())
    finally:
        run_sh("stop", "--model", "cosyvoice3", exp=exp, ports=free_ports(3), timeout=120)
    assert state["llm"]["chat_url"] == f"http://127.0.0.1:{llm_port}/v1/chat/completions"
    bls = _parameters(_parse_repo(Path(state["model_repo"]))["cosyvoice3"])
    assert (bls["llm_api_base"], bls["tensorrt_llm_model"]) == (state["llm"]["chat_url"], "none")
    summaries = list(home.glob("log_disagg_streaming_tasks_2/summary.json"))
    (run,) = json.loads(summaries[0].read_text())["runs"]
    assert (run["succeeded"], run["failed"]) == (4, 0)
