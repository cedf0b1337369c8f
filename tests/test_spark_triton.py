"""Spark-TTS end to end on the real tritonserver with the tiny synthetic checkpoint (CPU, torch engine)."""

import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import soundfile
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from bls_monitor import assert_monitor_runs_from_load, unused_copy
from conftest import PROMPT_ZH_TEXT
from spark_models import MAX_NEW_TOKENS, SPARK_SERVING, build_spark_models
from triton_stats import inference_count, wait_for_counts
from triton_stream import Stream, make_inputs
from tritonclient.utils import InferenceServerException, np_to_triton_dtype
from waiting import wait_until

from tritontts.audio import load_wav
from tritontts.bench.server_stages import BLS_COUNT, BLS_SECONDS, scrape, stage_means_ms
from tritontts.spark.service import FIRST_CHUNK_STAGES
from tritontts.streaming import crossfade_concat
from tritontts.triton.stubs import current_stubs

MONITORED = "spark_tts_monitored"  # a copy of spark_tts_offline that no test sends a request to
TRITON_MODELS = [build_spark_models, unused_copy("spark_tts_offline", MONITORED)]
ROOT = Path(__file__).resolve().parents[1]
TARGET = "身临其境，换新体验。塑造开源语音合成新范式，让智能语音更自然。"
HOP = 320


@pytest.fixture(scope="module")
def server(triton):
    return triton.load(*SPARK_SERVING)


@pytest.fixture(scope="module")
def reference(prompt_zh):
    return load_wav(prompt_zh, 16000)[: 16000 * 4]


def arrays(wav: np.ndarray, reference_text: str = "吃燕窝就选燕之屋。", target_text: str = TARGET) -> dict:
    return {
        "reference_wav": wav.reshape(1, -1).astype(np.float32),
        "reference_wav_len": np.array([[wav.size]], dtype=np.int32),
        "reference_text": np.array([[reference_text.encode()]], dtype=object),
        "target_text": np.array([[target_text.encode()]], dtype=object),
    }


def http_inputs(values: dict) -> list:
    inputs = []
    for name, value in values.items():
        tensor = httpclient.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
        tensor.set_data_from_numpy(value, binary_data=True)
        inputs.append(tensor)
    return inputs


def offline_grpc(server, values: dict) -> np.ndarray:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    return client.infer("spark_tts_offline", make_inputs(values)).as_numpy("waveform").reshape(-1)


def test_offline_over_http_and_grpc(server, reference):
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=300)
    over_http = (
        client.infer("spark_tts_offline", http_inputs(arrays(reference))).as_numpy("waveform").reshape(-1)
    )
    over_grpc = offline_grpc(server, arrays(reference))
    for audio in (over_http, over_grpc):
        # The synthetic LLM speaks until max_new_tokens; every semantic token is 320 samples at 16 kHz.
        assert audio.size == MAX_NEW_TOKENS * HOP
        assert np.all(np.isfinite(audio)) and 0 < np.abs(audio).max() <= 1.0


def test_streaming_chunks_follow_the_schedule(server, reference):
    result = Stream(server.grpc_url, "spark_tts", arrays(reference), ["waveform"]).read()
    assert result.error is None
    chunks = [out["waveform"].reshape(-1) for out in result.outputs]
    # first chunk 50 tokens; the rest (5 overlapping + 70 new) is less than the next size (100): final chunk
    assert [c.size for c in chunks] == [50 * HOP, 75 * HOP]
    assert result.times[0] < result.times[-1]
    joined = crossfade_concat(chunks, overlap_samples=5 * HOP)
    assert joined.size == MAX_NEW_TOKENS * HOP and np.all(np.isfinite(joined))


def test_a_streams_first_chunk_is_timed_stage_by_stage(server, reference):
    metrics_url = f"http://127.0.0.1:{server.server.config.metrics_port}/metrics"
    before = scrape(metrics_url)
    start = time.monotonic()
    result = Stream(server.grpc_url, "spark_tts", arrays(reference), ["waveform"]).read()
    assert result.error is None and len(result.outputs) == 2
    first_chunk_s = result.times[0] - start
    after = wait_until(
        lambda: scrape(metrics_url),
        lambda samples: stage_means_ms(before, samples, BLS_SECONDS, BLS_COUNT, {"model": "spark_tts"}),
        "the BLS's first-chunk stages",
    )
    first = stage_means_ms(before, after, BLS_SECONDS, BLS_COUNT, {"model": "spark_tts"})
    assert first["count"] == 1 and tuple(first["stages_ms"]) == FIRST_CHUNK_STAGES
    assert all(ms > 0 for ms in first["stages_ms"].values()), first
    assert sum(first["stages_ms"].values()) <= 1000 * first_chunk_s


def test_eight_concurrent_requests_all_succeed(server, reference):
    wavs = [reference[: 16000 * (1 + i % 3)] * (0.5 + 0.1 * i) for i in range(8)]
    with ThreadPoolExecutor(8) as pool:
        audios = list(pool.map(lambda w: offline_grpc(server, arrays(w)), wavs))
    assert all(a.size == MAX_NEW_TOKENS * HOP for a in audios)


def voice_cache_counts(server) -> tuple[float, float]:
    text = (
        urllib.request.urlopen(f"http://127.0.0.1:{server.server.config.metrics_port}/metrics", timeout=30)
        .read()
        .decode()
    )
    counts = {}
    for kind in ("hits", "misses"):
        match = re.search(
            rf'^tritontts_voice_cache_{kind}_total{{model="audio_tokenizer"}} (\S+)$', text, re.M
        )
        counts[kind] = float(match.group(1)) if match else 0.0
    return counts["hits"], counts["misses"]


def test_repeated_reference_hits_the_voice_cache(server, reference):
    voice = reference[8000:40000] * 0.7
    hits, misses = voice_cache_counts(server)
    served = inference_count(server, "spark_tts_offline")
    offline_grpc(server, arrays(voice))
    counted = wait_until(  # the tokenizer's metrics, read once they have counted the miss
        lambda: voice_cache_counts(server), lambda c: c[1] >= misses + 1, "the tokenizer's cache miss"
    )
    assert counted == (hits, misses + 1)
    # the two BLS instances share one voice store, so neither asks the audio tokenizer again
    texts = [TARGET, "Another sentence, same voice.", "A third one.", "And a fourth."]
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda text: offline_grpc(server, arrays(voice, target_text=text)), texts))
    wait_for_counts(server, {"spark_tts_offline": served + 5})  # the requests are over: no call was made
    assert voice_cache_counts(server) == (hits, misses + 1)
    store = (
        Path(tempfile.gettempdir())
        / f"tritontts-voices-{os.getuid()}"
        / f"spark_tts_offline-{server.server.pid}"
    )
    assert len(list(store.glob("*.npz"))) >= 1 and not list(store.glob("*.tmp"))
    assert store.stat().st_mode & 0o777 == 0o700


def bad(values: dict, **changes) -> dict:
    return {**values, **changes}


@pytest.mark.parametrize(
    "make, field",
    [
        (lambda v: {k: x for k, x in v.items() if k != "target_text"}, "target_text"),
        (lambda v: bad(v, target_text=np.array([[b""]], dtype=object)), "target_text"),
        (lambda v: bad(v, target_text=np.array([["字" * 301]], dtype=object)), "target_text"),
        (lambda v: bad(v, reference_wav_len=np.array([[0]], np.int32)), "reference_wav_len"),
        (lambda v: bad(v, reference_wav=np.full((1, 16000), np.nan, np.float32)), "reference_wav"),
        (
            lambda v: bad(
                v,
                reference_wav=np.zeros((1, 16000 * 31), np.float32),
                reference_wav_len=np.array([[16000 * 31]], np.int32),
            ),
            "reference_wav",
        ),
        (lambda v: bad(v, reference_wav=v["reference_wav"].astype(np.float64)), "reference_wav"),
    ],
)
def test_bad_request_names_the_field_and_the_server_keeps_serving(server, reference, make, field):
    with pytest.raises(InferenceServerException, match=field):
        offline_grpc(server, make(arrays(reference[:16000])))
    assert offline_grpc(server, arrays(reference[:16000])).size == MAX_NEW_TOKENS * HOP


def test_streaming_bad_request_gets_an_error_response(server, reference):
    result = Stream(
        server.grpc_url,
        "spark_tts",
        bad(arrays(reference), target_text=np.array([[b" "]], dtype=object)),
        ["waveform"],
    ).read()
    assert result.error is not None and "target_text" in result.error


def run_client(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=tmp_path, capture_output=True, text=True, timeout=300)


def test_upstream_client_call_forms(server, prompt_zh, tmp_path):
    host, grpc_port = server.grpc_url.split(":")
    http_port = server.http_url.split(":")[-1]
    common = [
        "--reference-audio",
        str(prompt_zh),
        "--reference-text",
        PROMPT_ZH_TEXT,  # the whole clip's transcript: the synthetic LLM's length follows text vs speech
        "--target-text",
        TARGET,
    ]
    http = run_client(
        [
            str(ROOT / "client_http.py"),
            "--server-url",
            f"{host}:{http_port}",
            "--model-name",
            "spark_tts_offline",
            "--output-audio",
            "out.wav",
            *common,
        ],
        tmp_path,
    )
    assert http.returncode == 0, http.stderr
    audio, rate = soundfile.read(tmp_path / "out.wav")
    assert rate == 16000 and audio.size == MAX_NEW_TOKENS * HOP
    grpc = run_client(
        [
            str(ROOT / "client_grpc.py"),
            "--server-addr",
            host,
            "--server-port",
            grpc_port,
            "--model-name",
            "spark_tts",
            "--mode",
            "streaming",
            "--chunk-overlap-duration",
            "0.1",
            "--log-dir",
            "log",
            *common,
        ],
        tmp_path,
    )
    assert grpc.returncode == 0, grpc.stderr
    wavs = list((tmp_path / "log").rglob("*.wav"))
    assert len(wavs) == 1 and soundfile.info(wavs[0]).frames == MAX_NEW_TOKENS * HOP


def test_request_parameters_set_the_token_budget(server, reference):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    inputs = make_inputs(arrays(reference[:16000]))
    result = client.infer(
        "spark_tts_offline", inputs, parameters={"min_new_tokens": 30, "max_new_tokens": 30}
    )
    assert result.as_numpy("waveform").size == 30 * HOP
    with pytest.raises(InferenceServerException, match="max_new_tokens"):
        client.infer("spark_tts_offline", inputs, parameters={"max_new_tokens": 10**6})


def test_bls_instances_watch_their_callees_from_load(triton, server):
    # the callee monitor's first read of /proc (tens of ms on a busy host) belongs to the load, not to the first
    # request each instance serves
    assert_monitor_runs_from_load(triton, MONITORED, instances=2)  # bls_instance_num


def test_the_bls_stubs_serve_without_torch(triton, server, reference):
    """The BLS only routes arrays (its callees run the models), so its stubs never load torch: its model.py's
    imports took 43 against 229 MiB (peak RSS) and 0.3 against 1.2 s of CPU on CI's machine without torch."""
    grpcclient.InferenceServerClient(server.grpc_url).infer(
        "spark_tts_offline", make_inputs(arrays(reference[:16000]))
    )
    assert Stream(server.grpc_url, "spark_tts", arrays(reference[:16000]), ["waveform"]).read().error is None
    stubs = [
        s for s in current_stubs(triton.server.pid).values() if s.model in ("spark_tts", "spark_tts_offline")
    ]
    assert len(stubs) == 4
    for stub in stubs:
        libraries = Path(f"/proc/{stub.pid}/maps").read_text()
        assert "libtorch" not in libraries, f"{stub.instance} loaded torch"
    vocoder = next(s for s in current_stubs(triton.server.pid).values() if s.model == "vocoder")
    assert "libtorch" in Path(f"/proc/{vocoder.pid}/maps").read_text()
