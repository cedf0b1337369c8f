"""Both clients against the real tritonserver (tiny synthetic Spark-TTS), both modes, concurrency 1 and 4."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import soundfile
from conftest import PROMPT_ZH_TEXT
from spark_models import MAX_NEW_TOKENS, build_spark_models
from test_clients_errors import assert_one_clear_line
from triton_stats import assert_counts, success_count
from triton_stubs import signal_stub

TRITON_MODELS = [build_spark_models]
ROOT = Path(__file__).resolve().parents[1]
MODELS = {"streaming": "spark_tts", "offline": "spark_tts_offline"}


@pytest.fixture(scope="module")
def server(triton):
    return triton.load("audio_tokenizer", "vocoder", "tensorrt_llm", "tensorrt_llm_offline", *MODELS.values())


def address(url: str) -> list[str]:
    """A client's --server-addr and --server-port for `url` (host:port)."""
    host, port = url.split(":")
    return ["--server-addr", host, "--server-port", port]


def grpc_client(server, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, str(ROOT / "client_grpc.py"), *address(server.grpc_url), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("tasks", [1, 4])
@pytest.mark.parametrize("mode", ["offline", "streaming"])
def test_benchmark_summary(server, bench_data, tmp_path, mode, tasks):
    done = grpc_client(
        server,
        "--model-name",
        MODELS[mode],
        "--mode",
        mode,
        "--num-tasks",
        str(tasks),
        "--huggingface-dataset",
        str(bench_data),
        "--log-dir",
        str(tmp_path),
    )
    assert done.returncode == 0, done.stderr
    (run,) = json.loads((tmp_path / "summary.json").read_text())["runs"]
    assert (run["concurrency"], run["succeeded"], run["failed"]) == (tasks, 4, 0)
    assert run["audio_seconds"] == pytest.approx(4 * MAX_NEW_TOKENS * 320 / 16000)
    assert run["rtf"] == pytest.approx(run["wall_seconds"] / run["audio_seconds"])
    assert (run["first_chunk_latency"] is not None) == (mode == "streaming")
    assert len(list(tmp_path.rglob("*.wav"))) == 4
    assert (tmp_path / "latency.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| " + mode.capitalize() + " | " + str(tasks) + " |" in (tmp_path / "summary.md").read_text()


def test_http_client_single_utterance(server, prompt_zh, tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "client_http.py"),
            *address(server.http_url),
            "--model-name",
            MODELS["offline"],
            "--reference-audio",
            str(prompt_zh),
            "--reference-text",
            PROMPT_ZH_TEXT,  # the clip's whole transcript: the synthetic LLM's length follows text vs speech
            "--target-text",
            "Hello there, how are you today?",
            "--output-audio",
            str(tmp_path / "one.wav"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert soundfile.info(tmp_path / "one.wav").frames == MAX_NEW_TOKENS * 320


def test_wrong_model_name_is_one_line(server, bench_data, tmp_path):
    done = grpc_client(server, "--model-name", "no_such_model", "--huggingface-dataset", str(bench_data))
    assert_one_clear_line(done, "no_such_model")


def test_mode_that_does_not_match_the_model_is_one_line(server, bench_data):
    done = grpc_client(
        server,
        "--model-name",
        MODELS["offline"],
        "--mode",
        "streaming",
        "--huggingface-dataset",
        str(bench_data),
    )
    assert_one_clear_line(done)


def test_realistic_lengths_ask_for_the_expected_token_count(server, prompt_zh, tmp_path):
    from tritontts.bench.durations import expected_tokens

    target = "身临其境，换新体验。"
    assert expected_tokens(target) < MAX_NEW_TOKENS
    done = grpc_client(
        server,
        "--model-name",
        MODELS["offline"],
        "--realistic-lengths",
        "--reference-audio",
        str(prompt_zh),
        "--reference-text",
        "参考。",
        "--target-text",
        target,
        "--log-dir",
        str(tmp_path),
    )
    assert done.returncode == 0, done.stderr
    (wav,) = list(tmp_path.rglob("*.wav"))
    assert soundfile.info(wav).frames == expected_tokens(target) * 320


def test_warmup_rows_are_sent_but_not_counted(server, bench_data, tmp_path):
    before = success_count(server, MODELS["offline"])
    done = grpc_client(
        server,
        "--model-name",
        MODELS["offline"],
        "--mode",
        "offline",
        "--warmup",
        "2",
        "--huggingface-dataset",
        str(bench_data),
        "--log-dir",
        str(tmp_path),
    )
    assert done.returncode == 0, done.stderr
    assert_counts(server, {MODELS["offline"]: before + 4 + 2}, count=success_count)
    summary = json.loads((tmp_path / "summary.json").read_text())
    (run,) = summary["runs"]
    assert summary["warmup_requests"] == 2
    assert (run["requests"], run["succeeded"]) == (4, 4)
    assert len(list((tmp_path / "warmup").glob("*.wav"))) == 2


def test_sigusr1_prints_every_thread_of_a_model_to_the_server_log(server):
    import signal

    added = signal_stub(server.server, "spark_tts_offline", signal.SIGUSR1, "most recent call first")
    assert "most recent call first" in added, added[-2000:]


def test_every_row_inputs_are_made_once_before_the_first_request(server, bench_data, tmp_path, monkeypatch):
    import importlib.util

    spec = importlib.util.spec_from_file_location("client_grpc_under_test", ROOT / "client_grpc.py")
    client = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(client)
    events = []
    make, send = client.request_arrays, client.Requester.offline
    monkeypatch.setattr(client, "request_arrays", lambda args, utt: events.append("made") or make(args, utt))
    monkeypatch.setattr(
        client.Requester, "offline", lambda self, utt: events.append("sent") or send(self, utt)
    )
    argv = [
        *address(server.grpc_url),
        "--model-name",
        MODELS["offline"],
        "--mode",
        "offline",
        "--num-tasks",
        "2",
    ]
    argv += ["--huggingface-dataset", str(bench_data), "--log-dir", str(tmp_path)]
    assert client.main(argv) == 0
    assert events == ["made"] * 4 + ["sent"] * 4
