"""The OpenAI-compatible speech API (run.sh stage 6) in front of CosyVoice3 on the real tritonserver (tiny synthetic
checkpoint, CPU): the model map (`cosyvoice3=cosyvoice3,cosyvoice3_offline`, 24 kHz from the name), whole files
and streams through the official `openai` client and plain HTTP; and the benchmark client's rates for the name."""

from __future__ import annotations

import shutil

import httpx
import openai
import pytest
from conftest import PROMPT_ZH_TEXT
from cosyvoice3_models import build_cosyvoice3_models
from openai_api_process import api_process, decode

from tritontts.bench import triton_io
from tritontts.openai_api.settings import parse_model_spec

TRITON_MODELS = [build_cosyvoice3_models]
pytestmark = pytest.mark.slow
KEY = "test-key"
RATE = 24000
SAMPLES_PER_TOKEN = 960
TOKENS = 40
TEXT = "身临其境，换新体验。"
MODELS = "cosyvoice3,cosyvoice3_offline"
LEAVES = (
    "audio_tokenizer",
    "speaker_embedding",
    "token2wav",
    "vocoder",
    "tensorrt_llm",
    "tensorrt_llm_offline",
)


@pytest.fixture(scope="module")
def server(triton):
    return triton.load(*(f"cosyvoice3_{leaf}" for leaf in LEAVES), "cosyvoice3", "cosyvoice3_offline")


@pytest.fixture(scope="module")
def api(server, tmp_path_factory, prompt_zh):
    voices = tmp_path_factory.mktemp("voices")
    shutil.copy(prompt_zh, voices / "zh.wav")
    (voices / "zh.txt").write_text(PROMPT_ZH_TEXT + "\n", encoding="utf-8")
    args = ["--triton-url", server.grpc_url, "--voices-dir", str(voices), "--api-key", KEY]
    args += [f"--max-new-tokens={TOKENS}", "--model", f"cosyvoice3={MODELS}"]
    with api_process(*args, log_file=tmp_path_factory.mktemp("api") / "api.log") as url:
        yield url


def assert_speech(samples) -> None:
    assert 0 < samples.size <= TOKENS * SAMPLES_PER_TOKEN and samples.size % SAMPLES_PER_TOKEN == 0
    assert 0 < abs(samples).max() <= 1.0


def test_the_name_maps_to_24_khz_and_25_tokens_a_second() -> None:
    assert parse_model_spec("cosyvoice3=cosyvoice3").sample_rate == RATE
    assert (triton_io.token_rate("cosyvoice3"), triton_io.chunk_overlap_seconds("cosyvoice3_offline")) == (
        25,
        0.0,
    )


def test_a_whole_file(api):
    client = openai.OpenAI(base_url=f"{api}/v1", api_key=KEY, max_retries=0, timeout=300)
    response = client.audio.speech.create(model="cosyvoice3", voice="zh", input=TEXT, response_format="wav")
    samples, rate = decode(response.content, "wav", pcm_rate=0)
    assert rate == RATE
    assert_speech(samples)


def test_a_stream(api):
    body = {
        "model": "cosyvoice3",
        "voice": "zh",
        "input": TEXT,
        "response_format": "pcm",
        "stream_format": "audio",
    }
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.stream("POST", f"{api}/v1/audio/speech", json=body, headers=headers, timeout=300) as response:
        assert response.status_code == 200
        data = b"".join(response.iter_raw())
    samples, _ = decode(data, "pcm", RATE)
    assert_speech(samples)


def test_health_names_the_deployment(api):
    models = httpx.get(f"{api}/health", timeout=30).json()["models"]
    assert models == {
        "cosyvoice3": {"ready": True, "streaming_model": "cosyvoice3", "offline_model": "cosyvoice3_offline",
                       "sample_rate": RATE}
    }  # fmt: skip
