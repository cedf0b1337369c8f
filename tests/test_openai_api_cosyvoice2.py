"""The OpenAI-compatible speech API (run.sh stage 6) in front of CosyVoice2 and CosyVoice2-DiT on the real
tritonserver (tiny synthetic checkpoints, CPU): 24 kHz audio from a voice of the voices dir, whole files and
streams, through the official `openai` client."""

from __future__ import annotations

import shutil

import httpx
import openai
import pytest
from conftest import PROMPT_ZH_TEXT
from cosyvoice2_dit_models import TOKEN2WAV_DIT, build_cosyvoice2_dit_models
from cosyvoice2_models import PREFIX, build_cosyvoice2_models
from openai_api_process import api_process, decode

TRITON_MODELS = [build_cosyvoice2_models, build_cosyvoice2_dit_models]
pytestmark = pytest.mark.slow
KEY = "test-key"
RATE = 24000
SAMPLES_PER_TOKEN = 960
TOKENS = 40  # the API's --max-new-tokens
LEAVES = ("audio_tokenizer", "speaker_embedding", "token2wav", "tensorrt_llm", "tensorrt_llm_offline")
BLS = ("cosyvoice2", "cosyvoice2_offline", "cosyvoice2_dit", "cosyvoice2_dit_offline")
MODELS = {
    "cosyvoice2": "cosyvoice2,cosyvoice2_offline",
    "cosyvoice2-dit": "cosyvoice2_dit,cosyvoice2_dit_offline",
}


@pytest.fixture(scope="module")
def api(triton, tmp_path_factory, prompt_zh):
    server = triton.load(*(PREFIX + leaf for leaf in LEAVES), TOKEN2WAV_DIT, *BLS)
    voices = tmp_path_factory.mktemp("voices")
    shutil.copy(prompt_zh, voices / "zh.wav")
    (voices / "zh.txt").write_text(PROMPT_ZH_TEXT + "\n", encoding="utf-8")
    args = ["--triton-url", server.grpc_url, "--voices-dir", str(voices), "--api-key", KEY]
    args += [f"--max-new-tokens={TOKENS}"]
    for name, models in MODELS.items():
        args += ["--model", f"{name}={models}"]
    with api_process(*args, log_file=tmp_path_factory.mktemp("api") / "api.log") as url:
        yield url


@pytest.fixture(scope="module")
def client(api):
    return openai.OpenAI(base_url=f"{api}/v1", api_key=KEY, max_retries=0, timeout=300)


def assert_speech(data: bytes, response_format: str) -> None:
    samples, rate = decode(data, response_format, RATE)
    assert rate == RATE
    assert 0 < samples.size <= TOKENS * SAMPLES_PER_TOKEN and samples.size % SAMPLES_PER_TOKEN == 0
    assert 0 < abs(samples).max() <= 1.0


@pytest.mark.parametrize("model", MODELS)
def test_a_whole_file(client, model):
    response = client.audio.speech.create(
        model=model, voice="zh", input="身临其境，换新体验。", response_format="wav"
    )
    assert_speech(response.content, "wav")


@pytest.mark.parametrize("model", MODELS)
def test_a_stream(client, model):
    with client.audio.speech.with_streaming_response.create(
        model=model, voice="zh", input="身临其境，换新体验。", response_format="pcm", stream_format="audio"
    ) as response:
        assert response.headers["content-type"].startswith("audio/")
        data = b"".join(response.iter_bytes())
    assert_speech(data, "pcm")


def test_health_names_both_deployments_at_24_khz(api):
    models = httpx.get(f"{api}/health", timeout=30).json()["models"]
    assert models == {
        name: {"ready": True, "streaming_model": streaming, "offline_model": offline, "sample_rate": RATE}
        for name, (streaming, offline) in ((n, m.split(",")) for n, m in MODELS.items())
    }
