"""Where a stream's first chunk spends its time: the BLS's and token2wav's stage metrics on the real tritonserver,
and the benchmark client that reads them (client_grpc.py --metrics-port)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cosyvoice2_dit_models import TOKEN2WAV_DIT, build_cosyvoice2_dit_models
from cosyvoice2_models import PREFIX, build_cosyvoice2_models
from triton_stream import stream_waveforms
from waiting import wait_until

from tritontts.audio import load_wav
from tritontts.bench.server_stages import (
    BLS_COUNT,
    BLS_SECONDS,
    TOKEN2WAV_COUNT,
    TOKEN2WAV_SECONDS,
    model_breakdown,
    parse_samples,
    scrape,
    stage_means_ms,
)
from tritontts.cosyvoice2.service import FIRST_CHUNK_STAGES

TRITON_MODELS = [build_cosyvoice2_models, build_cosyvoice2_dit_models]
ROOT = Path(__file__).resolve().parents[1]
COSYVOICE2, DIT = "cosyvoice2", "cosyvoice2_dit"
TOKEN2WAV = PREFIX + "token2wav"
LEAVES = [PREFIX + m for m in ("audio_tokenizer", "speaker_embedding", "tensorrt_llm")] + [
    TOKEN2WAV,
    TOKEN2WAV_DIT,
]


@pytest.fixture(scope="module")
def server(triton):
    return triton.load(*LEAVES, COSYVOICE2, DIT)


@pytest.fixture(scope="module")
def metrics_url(server) -> str:
    return f"http://127.0.0.1:{server.server.config.metrics_port}/metrics"


@pytest.fixture(scope="module")
def reference(prompt_zh) -> np.ndarray:
    return load_wav(prompt_zh, 16000)[: 16000 * 3]


def request(wav: np.ndarray) -> dict:
    return {
        "target_text": np.array([["身临其境，换新体验。".encode()]], dtype=object),
        "reference_wav": wav.reshape(1, -1).astype(np.float32),
        "reference_wav_len": np.array([[wav.size]], dtype=np.int32),
        "reference_text": np.array([["吃燕窝就选燕之屋".encode()]], dtype=object),
    }


def tokens(count: int) -> dict:
    return {"min_new_tokens": count, "max_new_tokens": count}


def events(before, after, seconds_name: str, count_name: str, where: dict) -> int:
    """The events stage_means_ms counts between two scrapes (0 for none)."""
    means = stage_means_ms(before, after, seconds_name, count_name, where)
    return 0 if means is None else means["count"]


@pytest.mark.parametrize(
    ("bls", "token2wav", "token2wav_stages"),
    [(COSYVOICE2, TOKEN2WAV, {"flow", "vocoder"}), (DIT, TOKEN2WAV_DIT, {"frontend", "flow", "vocoder"})],
)
def test_one_stream_counts_one_first_chunk_with_every_stage(
    server, metrics_url, reference, bls, token2wav, token2wav_stages
):
    before = scrape(metrics_url)
    chunks = stream_waveforms(server.grpc_url, bls, request(reference), tokens(60))
    after = wait_until(  # once the BLS and token2wav have recorded what this test expects (or more)
        lambda: scrape(metrics_url),
        lambda after: (
            events(before, after, BLS_SECONDS, BLS_COUNT, {"model": bls}) >= 1
            and events(
                before, after, TOKEN2WAV_SECONDS, TOKEN2WAV_COUNT, {"model": token2wav, "chunk": "other"}
            )
            >= 2
        ),
        f"a first chunk of {bls} and two other token2wav calls on {metrics_url}",
    )
    assert len(chunks) == 3
    first = stage_means_ms(before, after, BLS_SECONDS, BLS_COUNT, {"model": bls})
    assert first["count"] == 1
    assert list(first["stages_ms"]) == list(FIRST_CHUNK_STAGES)
    assert all(ms >= 0 for ms in first["stages_ms"].values())
    assert first["stages_ms"]["token2wav"] > 0 and first["stages_ms"]["llm_chunk_tokens"] > 0
    flow = stage_means_ms(
        before, after, TOKEN2WAV_SECONDS, TOKEN2WAV_COUNT, {"model": token2wav, "chunk": "first"}
    )
    assert flow["count"] == 1 and set(flow["stages_ms"]) == token2wav_stages
    assert flow["stages_ms"]["flow"] > 0 and flow["stages_ms"]["vocoder"] > 0
    # the BLS's token2wav stage is the whole call, which holds token2wav's own flow and vocoder
    assert first["stages_ms"]["token2wav"] >= flow["stages_ms"]["flow"] + flow["stages_ms"]["vocoder"]
    rest = stage_means_ms(
        before, after, TOKEN2WAV_SECONDS, TOKEN2WAV_COUNT, {"model": token2wav, "chunk": "other"}
    )
    assert rest["count"] == 2


def test_a_stream_shorter_than_its_first_chunk_counts_none(server, metrics_url, reference):
    before = scrape(metrics_url)
    chunks = stream_waveforms(server.grpc_url, COSYVOICE2, request(reference), tokens(10))
    after = scrape(metrics_url)
    assert [c.size for c in chunks] == [10 * 960]
    counted = stage_means_ms(before, after, BLS_SECONDS, BLS_COUNT, {"model": COSYVOICE2})
    assert counted is None, counted


def test_benchmark_reports_the_first_chunk_stages(server, prompt_zh, tmp_path):
    # 6 to 12 syllables: 36 to 72 tokens at 25 a second (--realistic-lengths), past the first chunk's 18
    texts = ["身临其境换新体验", "吃燕窝就选燕之屋", "今天天气很好", "我们一起去看看那边的风景吧"]
    manifest = tmp_path / "manifest.txt"
    manifest.write_text("".join(f"{i:03d}|吃燕窝就选燕之屋|{prompt_zh}|{t}\n" for i, t in enumerate(texts)))
    host, port = server.grpc_url.split(":")
    metrics_port = str(server.server.config.metrics_port)
    command = [sys.executable, str(ROOT / "client_grpc.py"), "--server-addr", host, "--server-port", port]
    command += ["--metrics-port", metrics_port, "--model-name", COSYVOICE2, "--mode", "streaming"]
    command += ["--num-tasks", "2", "--manifest-path", str(manifest), "--realistic-lengths"]
    command += ["--log-dir", str(tmp_path / "log")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "log" / "summary.json").read_text())
    (stages,) = summary["server_stages"]
    assert [r["chunks"] > 1 for r in summary["runs"][0]["records"]] == [True] * 4
    assert stages["concurrency"] == 2 and stages["bls"]["count"] == 4
    assert list(stages["bls"]["stages_ms"]) == list(FIRST_CHUNK_STAGES)
    assert stages["token2wav_first_chunk"]["count"] >= 1
    client_avg_ms = summary["runs"][0]["first_chunk_latency"]["avg"] * 1000
    assert stages["client_beyond_bls_ms"] == pytest.approx(
        client_avg_ms - sum(stages["bls"]["stages_ms"].values())
    )
    bls_row = stages["models"][COSYVOICE2]
    assert bls_row["requests"] == 4 and bls_row["request_ms"] > 0 and bls_row["compute_ms"] > 0
    assert stages["models"][TOKEN2WAV]["requests"] >= 8  # each stream's first chunk and at least one more
    assert "Server stages" in (tmp_path / "log" / "summary.md").read_text()


def test_stage_means_divide_each_stage_by_the_events_between_two_scrapes():
    before = parse_samples(
        '# TYPE s counter\ns_total{model="a",stage="x"} 1.0\n# TYPE n counter\nn_total{model="a"} 2\n'
    )
    after = parse_samples(
        "# TYPE s counter\n"
        's_total{model="a",stage="x"} 1.5\n'
        's_total{model="a",stage="y"} 0.25\n'
        's_total{model="b",stage="x"} 9\n'
        "# TYPE n counter\n"
        'n_total{model="a"} 4\n'
        'n_total{model="b"} 1\n'
    )
    assert stage_means_ms(before, after, "s_total", "n_total", {"model": "a"}) == {
        "count": 2,
        "stages_ms": {"x": 250.0, "y": 125.0},
    }
    assert stage_means_ms(before, before, "s_total", "n_total", {"model": "a"}) is None


def test_model_breakdown_gives_means_per_request_of_the_models_that_served():
    def exposition(requests_a: int, executions_a: int, request_us_a: float) -> str:
        lines = []
        for name, a, b in (
            ("nv_inference_request_success", requests_a, 7),
            ("nv_inference_exec_count", executions_a, 7),
            ("nv_inference_request_duration_us", request_us_a, 70),
            ("nv_inference_queue_duration_us", request_us_a / 10, 0),
            ("nv_inference_compute_infer_duration_us", request_us_a / 2, 70),
        ):
            lines += [f"# TYPE {name} counter", f'{name}{{model="a",version="1"}} {a}']
            lines.append(f'{name}{{model="b",version="1"}} {b}')
        return "\n".join(lines) + "\n"

    rows = model_breakdown(parse_samples(exposition(2, 2, 1000.0)), parse_samples(exposition(10, 4, 41000.0)))
    assert rows == {
        "a": {
            "requests": 8,
            "requests_per_execution": 4.0,
            "request_ms": 5.0,
            "queue_ms": 0.5,
            "compute_ms": 2.5,
        }
    }
