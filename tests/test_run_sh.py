"""run.sh: from a synthetic checkpoint to WAV files and a benchmark summary, offline then streaming (CPU); its
--help, option checks, the CosyVoice2 repositories stages 2 and 7 fill, and what stages 7-8 refuse (the
disaggregated run itself is in test_disaggregated.py)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import soundfile
from waiting import python_env, scaled, wait_started

from tritontts.bench.triton_trace import read_traces, timelines, trace_files
from tritontts.triton.server import free_ports

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def run_sh(*args: str, exp: Path, ports: list[int], timeout: int = 600) -> subprocess.CompletedProcess:
    command = [
        "bash",
        "run.sh",
        *args,
        "--exp_dir",
        str(exp),
        "--python",
        sys.executable,
        "--http_port",
        str(ports[0]),
        "--grpc_port",
        str(ports[1]),
        "--metrics_port",
        str(ports[2]),
    ]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def exp(tmp_path_factory):
    return tmp_path_factory.mktemp("exp")


@pytest.mark.parametrize("mode, stages", [("offline", ("0", "5")), ("streaming", ("2", "5"))])
def test_stages_leave_wavs_and_a_summary(exp, bench_data, mode, stages):
    ports = free_ports(3)
    options = [
        "--model_source",
        "synthetic-tiny",
        "--llm_backend",
        "torch",
        "--max_new_tokens",
        "60",
        "--num_tasks",
        "2",
        "--dataset",
        str(bench_data),
        "--reference_audio",
        str(ROOT.parent / "shared/data/prompt_zh.wav"),
    ]
    trace = exp / f"trace_{mode}_{{server}}.json"
    if mode == "streaming":
        tracing = f"--trace-config triton,file={trace} --trace-config rate=1 --trace-config level=TIMESTAMPS"
        options += ["--server_extra_args", tracing]
    try:
        done = run_sh(*stages, mode, *options, exp=exp, ports=ports)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    finally:
        run_sh("stop", exp=exp, ports=ports)
    home = exp / "spark_tts"
    if mode == "streaming":
        assert_trace_times_each_request(Path(str(trace).replace("{server}", "triton")))
    (run,) = json.loads((home / f"log_{mode}_tasks_2" / "summary.json").read_text())["runs"]
    assert (run["mode"], run["succeeded"], run["failed"]) == (mode, 4, 0)
    assert run["audio_seconds"] == pytest.approx(4 * 60 * 320 / 16000)
    wavs = list((home / f"log_{mode}_tasks_2").rglob("*.wav"))
    assert len(wavs) == 4
    single = list((home / f"single_{mode}").glob("*.wav"))
    assert len(single) == 1 and soundfile.info(single[0]).frames == 60 * 320
    assert (
        not (home / "tritonserver.pid").exists()
        or not Path(f"/proc/{(home / 'tritonserver.pid').read_text().strip()}").exists()
    )
    parsed = _parse_repo(home / f"model_repo_torch_{mode}")  # first-chunk priority: the vocoder and the LLM
    assert _parameters(parsed["vocoder"])["first_chunk_priority"] == "true"
    llm = _parameters(parsed["tensorrt_llm"])
    assert (llm["first_chunk_priority"], llm["audio_tokens_per_s"], llm["first_chunk_tokens"]) == (
        "true",
        "50",
        "50",
    )


def test_stage_4_writes_its_default_dataset_from_the_reference_audio(tmp_path, prompt_zh):
    samples, rate = soundfile.read(prompt_zh, dtype="float32")
    reference = tmp_path / "elsewhere" / "voice.wav"
    reference.parent.mkdir()
    soundfile.write(reference, samples[: 2 * rate], rate)
    (dead_grpc,) = free_ports(1)
    command = ["bash", "run.sh", "4", "4", "--exp_dir", str(tmp_path / "exp"), "--python", sys.executable]
    command += [
        "--reference_audio",
        str(reference),
        "--reference_text",
        "两秒",
        "--grpc_port",
        str(dead_grpc),
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300, env=python_env())
    assert done.returncode != 0  # no server answers; the dataset is written before the client runs
    rows = (tmp_path / "exp" / "benchmark_data" / "manifest.txt").read_text().splitlines()
    row = next(line.split("|") for line in rows if line.split("|")[0].endswith("_zh"))
    assert row[1] == "两秒"
    assert soundfile.info(tmp_path / "exp" / "benchmark_data" / row[2]).frames == 2 * rate


def assert_trace_times_each_request(trace: Path) -> None:
    """--server_extra_args reached tritonserver: its trace times each streamed request of the BLS (4 of stage
    4, 1 of stage 5) and the requests it made of the LLM, and trace_summary.py reads it."""
    found = timelines(read_traces(trace_files(trace)), "spark_tts")
    assert len(found) == 5, [t.request_id for t in found]
    for t in found:
        assert t.queue_ms is not None and t.queue_ms >= 0
        assert t.first_response_ms is not None and t.first_response_ms <= t.last_response_ms
        llm = [c for c in t.children if c.model == "tensorrt_llm"]
        assert len(llm) == 1 and llm[0].start_ms < t.first_response_ms, t.children
    done = subprocess.run(
        [sys.executable, "scripts/trace_summary.py", str(trace), "--model", "spark_tts", "--top", "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("5 requests of spark_tts") and "tensorrt_llm x1" in done.stdout, done.stdout


def test_help_names_stage_6_and_its_options():
    done = subprocess.run(["bash", "run.sh", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0
    assert "6  OpenAI-compatible API server in front of the running tritonserver" in done.stdout
    assert "stop ends the server that stage 3 started" in done.stdout
    for option in ("--api_host", "--api_port", "--api_key", "--api_model_name", "--voices_dir"):
        assert f"\n  {option} [" in done.stdout


def test_stage_6_serves_the_api_with_a_seeded_voice(tmp_path, prompt_zh):
    import os
    import signal

    import httpx

    api_port, dead_grpc_port = free_ports(2)
    command = ["bash", "run.sh", "6", "6", "--exp_dir", str(tmp_path), "--python", sys.executable]
    command += [
        "--api_port",
        str(api_port),
        "--grpc_port",
        str(dead_grpc_port),
        "--reference_audio",
        str(prompt_zh),
    ]
    log = tmp_path / "stage6.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=python_env()
        )
    answers = []

    def probe() -> tuple[bool, str]:  # any answer: the API is up (503: no tritonserver on that port)
        try:
            answers.append(httpx.get(f"http://127.0.0.1:{api_port}/health", timeout=scaled(10)))
        except httpx.TransportError as err:
            return False, f"{type(err).__name__}: {err}"
        return True, str(answers[-1].status_code)

    try:
        wait_started(process, probe, "stage 6 of run.sh starting the API", log, timeout=60)
        health = answers[-1]
        assert health.status_code == 503  # no tritonserver on that port
        voices = httpx.get(f"http://127.0.0.1:{api_port}/v1/audio/voices", timeout=10).json()["data"]
        assert [v["id"] for v in voices] == ["default"]
        assert (tmp_path / "voices" / "default.txt").read_text().strip() == voices[0]["transcript"]
    finally:
        try:
            os.killpg(process.pid, signal.SIGTERM)
        except ProcessLookupError:  # the whole session has exited already
            pass
        process.wait(timeout=15)


COSYVOICE2_MODELS = {"cosyvoice2", "audio_tokenizer", "speaker_embedding", "token2wav", "tensorrt_llm"}


def test_help_lists_the_cosyvoice2_knobs():
    done = subprocess.run(["bash", "run.sh", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0
    assert "--model [spark_tts] spark_tts | cosyvoice2 | cosyvoice2_dit" in done.stdout
    for option, default in (
        ("token_hop_len", "15"),
        ("pre_lookahead_len", "3"),
        ("dynamic_chunk_strategy", "exponential"),
        ("token2wav_dtype", "auto"),
        ("token2wav_cuda_graphs", "auto"),
        ("token2wav_graph_batch_sizes", "auto"),
        ("speaker_embedding_instance_num", "1"),
        ("use_spk2info_cache", "false"),
        ("max_new_tokens", "auto"),
        ("llm_decode_attention", "auto"),
        ("llm_decode_linear", "auto"),
        ("llm_decode_pdl", "auto"),
        ("token2wav_compile", "auto"),
        ("token2wav_first_chunks_first", "auto"),
        ("token2wav_voice_prefix_gib", "auto"),
        ("vocoder_compile", "false"),
    ):
        assert f"\n  --{option} [{default}]" in done.stdout


@pytest.mark.parametrize(
    "options, message",
    [
        (["--model", "f5_tts"], "--model must be spark_tts, cosyvoice2, cosyvoice2_dit or cosyvoice3"),
        (["--model", "cosyvoice2", "--dynamic_chunk_strategy", "linear"], "--dynamic_chunk_strategy"),
        (["--model", "cosyvoice2", "--token2wav_dtype", "int8"], "--token2wav_dtype"),
        (["--model", "cosyvoice2", "--token2wav_cuda_graphs", "on"], "--token2wav_cuda_graphs must be"),
        (["--model", "cosyvoice2", "--token2wav_graph_batch_sizes", "1,,4"], "--token2wav_graph_batch_sizes"),
        (["--model", "cosyvoice2", "--use_spk2info_cache", "yes"], "--use_spk2info_cache must be"),
        (["--use_spk2info_cache", "true"], "needs --model cosyvoice2"),
        (["--model", "cosyvoice2", "--token2wav_instance_num", "0"], "--token2wav_instance_num must be"),
        (["--model", "cosyvoice2", "--cuda_mps", "on"], "--cuda_mps must be true or false"),
        (["--model", "cosyvoice2", "--llm_decode_attention", "flash"], "--llm_decode_attention must be"),
        (["--llm_decode_linear", "cutlass"], "--llm_decode_linear must be auto, triton or torch"),
        (["--llm_decode_pdl", "yes"], "--llm_decode_pdl must be auto, true or false"),
        (["--vocoder_compile", "yes"], "--vocoder_compile must be auto, true or false"),
        (
            ["--model", "cosyvoice2", "--token2wav_compile", "yes"],
            "--token2wav_compile must be auto, true or false",
        ),
        (
            ["--model", "cosyvoice2", "--token2wav_first_chunks_first", "yes"],
            "--token2wav_first_chunks_first must be auto, true, queue or false",
        ),
        (
            ["--model", "cosyvoice2", "--token2wav_voice_prefix_gib", "-1"],
            "--token2wav_voice_prefix_gib must be auto, 0 (off) or a number of GiB",
        ),
    ],
)
def test_bad_cosyvoice2_options_exit_2_with_one_line(tmp_path, options, message):
    command = ["bash", "run.sh", "2", "2", *options, "--exp_dir", str(tmp_path), "--python", sys.executable]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "cosyvoice2").exists()


@pytest.mark.skipif(shutil.which("nvidia-cuda-mps-control") is not None, reason="this machine has NVIDIA MPS")
def test_cuda_mps_without_the_driver_utilities_says_what_is_missing(tmp_path):
    command = [
        "bash",
        "run.sh",
        "3",
        "3",
        "--cuda_mps",
        "true",
        "--exp_dir",
        str(tmp_path),
        "--python",
        sys.executable,
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "needs nvidia-cuda-mps-control" in done.stderr
    assert not list(tmp_path.iterdir())


def _parse_repo(repo: Path) -> dict:
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    parsed = {}
    for path in repo.glob("*/config.pbtxt"):
        text = path.read_text()
        assert "${" not in text, f"{path} has an unfilled placeholder"
        parsed[path.parent.name] = text_format.Parse(text, model_config_pb2.ModelConfig())
    return parsed


def _parameters(config) -> dict[str, str]:
    return {key: value.string_value for key, value in config.parameters.items()}


@pytest.fixture(scope="module")
def cosyvoice2_exp(tmp_path_factory) -> Path:
    """Stages 0-1 once: the tiny synthetic checkpoint, checked by the torch engine."""
    exp = tmp_path_factory.mktemp("exp_cosyvoice2")
    command = ["bash", "run.sh", "0", "1", "--model", "cosyvoice2", "--model_source", "synthetic-tiny"]
    command += ["--exp_dir", str(exp), "--python", sys.executable]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return exp


@pytest.mark.parametrize("backend", ["torch", "trtllm"])
@pytest.mark.parametrize("mode", ["streaming", "offline"])
def test_cosyvoice2_stage_2_fills_a_repository_whose_configs_parse(cosyvoice2_exp, mode, backend):
    checkpoint = cosyvoice2_exp / "cosyvoice2" / "checkpoint"
    assert (checkpoint / "CosyVoice2-0.5B" / "spk2info.pt").is_file()
    command = ["bash", "run.sh", "2", "2", mode, "--model", "cosyvoice2", "--model_source", "synthetic-tiny"]
    command += ["--llm_backend", backend, "--exp_dir", str(cosyvoice2_exp), "--python", sys.executable]
    command += ["--dynamic_chunk_strategy", "fixed", "--token_hop_len", "20", "--token2wav_dtype", "float16"]
    command += ["--token2wav_cuda_graphs", "false", "--token2wav_graph_batch_sizes", "1,3"]
    command += ["--token2wav_first_chunks_first", "queue", "--token2wav_voice_prefix_gib", "2.5"]
    command += [
        "--token2wav_instance_num",
        "2",
        "--llm_decode_attention",
        "torch",
        "--llm_decode_linear",
        "triton",
        "--llm_decode_pdl",
        "false",
    ]
    command += ["--token2wav_compile", "true"] if backend == "torch" else []  # trtllm: the default, auto
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    parsed = _parse_repo(cosyvoice2_exp / "cosyvoice2" / f"model_repo_{backend}_{mode}")
    assert set(parsed) == COSYVOICE2_MODELS | ({"text_inbox"} if mode == "streaming" else set())  # bistream
    for name, config in parsed.items():
        assert config.name == name
    for name in ("cosyvoice2", "tensorrt_llm"):
        assert parsed[name].model_transaction_policy.decoupled is (mode == "streaming")
    assert parsed["tensorrt_llm"].backend == ("tensorrtllm" if backend == "trtllm" else "python")
    bls = _parameters(parsed["cosyvoice2"])
    assert bls["model_dir"] == str(checkpoint.resolve() / "CosyVoice2-0.5B")
    assert bls["llm_tokenizer_dir"] == str(checkpoint.resolve() / "cosyvoice2_llm")
    assert (bls["token_hop_len"], bls["pre_lookahead_len"], bls["dynamic_chunk_strategy"]) == (
        "20",
        "3",
        "fixed",
    )
    assert bls["max_new_tokens"] == "750"
    assert (bls["tensorrt_llm_model"], bls["llm_endpoint"]) == ("tensorrt_llm", "")
    assert [bls[f"{role}_model"] for role in ("audio_tokenizer", "speaker_embedding", "token2wav")] == [
        "audio_tokenizer",
        "speaker_embedding",
        "token2wav",
    ]
    token2wav = _parameters(parsed["token2wav"])
    assert (token2wav["dtype"], token2wav["cuda_graphs"], token2wav["cuda_graph_batch_sizes"]) == (
        "float16",
        "false",
        "1,3",
    )
    assert token2wav["flow_compile"] == ("true" if backend == "torch" else "auto")
    assert (token2wav["first_chunks_first"], token2wav["first_chunk_priority"]) == ("queue", "true")
    assert token2wav["voice_prefix_gib"] == "2.5"
    assert token2wav["stream_calls"] == ("true" if mode == "streaming" else "false")
    assert len(parsed["token2wav"].instance_group) == 1 and parsed["token2wav"].instance_group[0].count == 2
    # streams stay on the instance that holds their state: the sequence batcher routes them (offline: no state)
    assert parsed["token2wav"].HasField("sequence_batching") is (mode == "streaming")
    assert parsed["token2wav"].HasField("dynamic_batching") is (mode == "offline")
    for name in ("audio_tokenizer", "speaker_embedding", "token2wav"):
        assert _parameters(parsed[name])["model_dir"] == bls["model_dir"]
    if backend == "torch":
        assert _parameters(parsed["tensorrt_llm"])["model_dir"] == bls["llm_tokenizer_dir"]
        assert _parameters(parsed["tensorrt_llm"])["decode_attention"] == "torch"
        assert _parameters(parsed["tensorrt_llm"])["decode_linear"] == "triton"
        assert _parameters(parsed["tensorrt_llm"])["decode_pdl"] == "false"


def test_cosyvoice2_dit_stages_0_2_write_both_checkpoints_and_a_dit_repository(tmp_path, bench_data):
    from tritontts.dit_token2wav.layout import missing_files

    command = [
        "bash",
        "run.sh",
        "0",
        "2",
        "streaming",
        "--model",
        "cosyvoice2_dit",
        "--model_source",
        "synthetic-tiny",
    ]
    command += ["--exp_dir", str(tmp_path), "--python", sys.executable, "--bls_instance_num", "3"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    checkpoint = (tmp_path / "cosyvoice2_dit" / "checkpoint").resolve()
    assert missing_files(checkpoint) == []
    parsed = _parse_repo(tmp_path / "cosyvoice2_dit" / "model_repo_torch_streaming")
    assert set(parsed) == {"cosyvoice2_dit", "audio_tokenizer", "token2wav_dit", "tensorrt_llm", "text_inbox"}
    bls = _parameters(parsed["cosyvoice2_dit"])
    assert (bls["audio_tokenizer_model"], bls["token2wav_model"], bls["tensorrt_llm_model"]) == (
        "audio_tokenizer",
        "token2wav_dit",
        "tensorrt_llm",
    )
    assert parsed["cosyvoice2_dit"].instance_group[0].count == 3
    assert _parameters(parsed["token2wav_dit"])["model_dir"] == str(
        checkpoint / "Step-Audio-2-mini" / "token2wav"
    )
    assert _parameters(parsed["token2wav_dit"])["cuda_graphs"] == "auto"
    assert _parameters(parsed["token2wav_dit"])["cuda_graph_batch_sizes"] == "1"  # auto, for the DiT
    assert _parameters(parsed["token2wav_dit"])["flow_compile"] == "auto"
    assert _parameters(parsed["audio_tokenizer"])["model_dir"] == str(checkpoint / "CosyVoice2-0.5B")

    command = [
        "bash",
        "run.sh",
        "2",
        "2",
        "streaming",
        "--model",
        "cosyvoice2_dit",
        "--model_source",
        "synthetic-tiny",
    ]
    command += ["--exp_dir", str(tmp_path), "--python", sys.executable]
    command += ["--token2wav_compile", "true", "--token2wav_graph_batch_sizes", "1,2,4"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    token2wav_dit = _parameters(
        _parse_repo(tmp_path / "cosyvoice2_dit" / "model_repo_torch_streaming")["token2wav_dit"]
    )
    assert (token2wav_dit["flow_compile"], token2wav_dit["cuda_graph_batch_sizes"]) == ("true", "1,2,4")

    command = ["bash", "run.sh", "10", "10", "--model", "cosyvoice2_dit", "--model_source", "synthetic-tiny"]
    command += ["--exp_dir", str(tmp_path), "--python", sys.executable, "--dataset", str(bench_data)]
    command += [
        "--split_name",
        "wenetspeech4tts",
        "--token2wav_bench_mode",
        "offline",
        "--model_device",
        "cpu",
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(
        (tmp_path / "cosyvoice2_dit" / "log_token2wav" / "token2wav_cosyvoice2_dit_offline.json").read_text()
    )
    assert report["tokens"] == "synthetic" and len(report["records"]) == 4

    (port,) = free_ports(1)
    command = ["bash", "run.sh", "9", "9", "--model", "cosyvoice2_dit", "--model_source", "synthetic-tiny"]
    command += ["--exp_dir", str(tmp_path), "--python", sys.executable, "--dataset", str(bench_data)]
    command += ["--offline_backend", "openai", "--llm_port", str(port)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert f"cannot reach the LLM endpoint http://127.0.0.1:{port}/v1/chat/completions" in done.stderr


DISAGGREGATED_OPTIONS = {
    "llm_gpus": "0",
    "token2wav_gpus": "1",
    "instances_per_gpu": "2",
    "llm_port": "8010",
    "disagg_http_base_port": "17000",
    "disagg_grpc_base_port": "18000",
    "disagg_metrics_base_port": "16000",
    "llm_server_max_batch_size": "64",
    "llm_server_kv_cache_fraction": "0.4",
    "trtllm_serve_prefix": '"mpirun -np 1 --allow-run-as-root --oversubscribe"',
    "llm_server_extra_args": '""',
}


def test_help_names_stages_7_8_and_their_options_only():
    done = subprocess.run(["bash", "run.sh", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0
    assert "7  disaggregated serving (cosyvoice2, cosyvoice2_dit, cosyvoice3)" in done.stdout
    assert "8  benchmark client (gRPC) spread over the token2wav servers of stage 7" in done.stdout
    for option, default in DISAGGREGATED_OPTIONS.items():
        assert f"\n  --{option} [{default}] stage 7" in done.stdout
    for internal in ("model_home", "pid_file", "disagg_state", "option_names"):
        assert f"--{internal} [" not in done.stdout


@pytest.mark.parametrize(
    "args, code, message",
    [
        (
            ["7", "8", "--model", "spark_tts"],
            2,
            "stages 7-8 (disaggregated serving) are for --model cosyvoice2",
        ),
        (["0", "8"], 2, "stages 7-8 (disaggregated serving) are for --model cosyvoice2"),
        (["8", "8", "--model", "cosyvoice2"], 1, "stage 8 needs the servers of stage 7"),
        (["2", "2", "--pid_file", "x"], 2, "unknown option --pid_file"),
    ],
)
def test_stages_7_8_refuse_what_they_cannot_serve(tmp_path, args, code, message):
    command = ["bash", "run.sh", *args, "--exp_dir", str(tmp_path), "--python", sys.executable]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == code and message in done.stderr, done.stderr
    assert not (tmp_path / "spark_tts").exists()


def test_stage_7_with_trtllm_says_where_trtllm_serve_runs(cosyvoice2_exp):
    if shutil.which("trtllm-serve"):
        pytest.skip("trtllm-serve is installed here")
    command = ["bash", "run.sh", "7", "7", "--model", "cosyvoice2", "--llm_backend", "trtllm"]
    command += ["--exp_dir", str(cosyvoice2_exp), "--python", sys.executable]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "trtllm-serve is not on PATH" in done.stderr and "use llm backend torch" in done.stderr
    bls = _parameters(
        _parse_repo(cosyvoice2_exp / "cosyvoice2" / "model_repo_disagg_streaming")["cosyvoice2"]
    )
    assert (bls["llm_endpoint"], bls["tensorrt_llm_model"]) == (
        "http://127.0.0.1:8010/v1/chat/completions",
        "none",
    )
    assert not (cosyvoice2_exp / "cosyvoice2" / "disagg" / "state.json").exists()


def stage_3_with_stub(tmp_path: Path, *options: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """Stage 3 against an empty repository: the server never starts, since the stub is checked first."""
    if shutil.which("tritonserver") or Path("/opt/tritonserver/bin/tritonserver").exists():
        pytest.skip("a tritonserver outside the nvidia-pytriton bundle is used as it is: no stub to choose")
    (tmp_path / "repo").mkdir(exist_ok=True)
    command = [
        "bash",
        "run.sh",
        "3",
        "3",
        *options,
        "--model_repo",
        str(tmp_path / "repo"),
        "--exp_dir",
        str(tmp_path),
    ]
    command += ["--python", sys.executable]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60, env=env)


def test_python_stub_names_the_stub_and_auto_finds_the_built_one(tmp_path):
    missing = Path(os.path.realpath(tmp_path)) / "python_stub" / "nope"
    done = stage_3_with_stub(tmp_path, "--python_stub", str(missing))
    assert done.returncode == 1 and f"TRITONTTS_PYTHON_STUB={missing}: no such file" in done.stderr
    built = Path(os.path.realpath(tmp_path)) / "python_stub" / "triton_python_backend_stub"
    built.parent.mkdir()
    built.write_bytes(b"\x7fELF...libpython3.99.so.1.0\0")  # auto takes it; the bundle refuses its Python
    done = stage_3_with_stub(tmp_path)
    assert done.returncode == 1 and f"TRITONTTS_PYTHON_STUB={built} was built for Python 3.99" in done.stderr
    done = stage_3_with_stub(tmp_path, env={**os.environ, "TRITONTTS_PYTHON_STUB": str(missing)})
    assert done.returncode == 1 and f"TRITONTTS_PYTHON_STUB={missing}: no such file" in done.stderr


def test_build_python_stub_takes_auto_true_or_false():
    done = subprocess.run(
        ["bash", "run.sh", "-1", "-1", "--build_python_stub", "yes"], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 2 and "--build_python_stub must be auto, true or false" in done.stderr
