"""The OpenAI-compatible speech API (run.sh stage 6) in front of CosyVoice2 and CosyVoice2-DiT on the real
tritonserver (tiny synthetic checkpoints, CPU): 24 kHz audio from a voice of the voices dir, whole files and
streams, through the official `openai` client."""

from __future__ import annotations

import json

import httpx
import numpy as np
import openai
import pytest
from conftest import PROMPT_ZH_TEXT
from cosyvoice2_dit_models import TOKEN2WAV_DIT, build_cosyvoice2_dit_models
from cosyvoice2_models import PREFIX, build_cosyvoice2_models
from openai_api_process import api_process, decode, zh_voices
from triton_stats import assert_counts, inference_counts, wait_for_counts
from waiting import scaled
from websockets.sync.client import connect

TRITON_MODELS = [build_cosyvoice2_models, build_cosyvoice2_dit_models]
pytestmark = pytest.mark.slow
KEY = "test-key"
RATE = 24000
SAMPLES_PER_TOKEN = 960
TOKENS = 40  # the API's --max-new-tokens
TEXT = "身临其境，换新体验。"
LEAVES = ("audio_tokenizer", "speaker_embedding", "token2wav", "tensorrt_llm", "tensorrt_llm_offline")
BLS = ("cosyvoice2", "cosyvoice2_offline", "cosyvoice2_dit", "cosyvoice2_dit_offline")
MODELS = {
    "cosyvoice2": "cosyvoice2,cosyvoice2_offline",
    "cosyvoice2-dit": "cosyvoice2_dit,cosyvoice2_dit_offline",
}
TOKEN2WAV = {
    "cosyvoice2": PREFIX + "token2wav",
    "cosyvoice2-dit": TOKEN2WAV_DIT,
}  # the leaf each route ends in


def route(model: str) -> tuple[str, str, str]:
    """The route's streaming BLS, offline BLS and token2wav."""
    streaming, offline = MODELS[model].split(",")
    return streaming, offline, TOKEN2WAV[model]


@pytest.fixture(scope="module")
def server(triton):
    return triton.load(*(PREFIX + leaf for leaf in LEAVES), TOKEN2WAV_DIT, *BLS)


@pytest.fixture(scope="module")
def api(server, tmp_path_factory, prompt_zh):
    voices = zh_voices(tmp_path_factory.mktemp("voices"), prompt_zh, PROMPT_ZH_TEXT)
    args = ["--triton-url", server.grpc_url, "--voices-dir", str(voices), "--api-key", KEY]
    args += [f"--max-new-tokens={TOKENS}"]
    for name, models in MODELS.items():
        args += ["--model", f"{name}={models}"]
    with api_process(*args, log_file=tmp_path_factory.mktemp("api") / "api.log") as url:
        yield url


@pytest.fixture(scope="module")
def client(api):
    return openai.OpenAI(base_url=f"{api}/v1", api_key=KEY, max_retries=0, timeout=300)


def assert_speech(samples) -> None:
    assert 0 < samples.size <= TOKENS * SAMPLES_PER_TOKEN and samples.size % SAMPLES_PER_TOKEN == 0
    assert 0 < abs(samples).max() <= 1.0


@pytest.mark.parametrize("model", MODELS)
def test_a_whole_file_at_24_khz_from_the_offline_model(client, server, model):
    _, offline, token2wav = route(model)
    before = inference_counts(server, route(model))
    response = client.audio.speech.create(model=model, voice="zh", input=TEXT, response_format="wav")
    samples, rate = decode(response.content, "wav", pcm_rate=0)
    assert rate == RATE
    assert_speech(samples)
    once = {offline: before[offline] + 1, token2wav: before[token2wav] + 1}  # one offline token2wav call
    assert_counts(server, before | once)


@pytest.mark.parametrize("model", MODELS)
def test_a_stream_from_the_streaming_model(api, server, model):
    streaming, offline, token2wav = route(model)
    before = inference_counts(server, route(model))
    body = {"model": model, "voice": "zh", "input": TEXT, "response_format": "pcm", "stream_format": "audio"}
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.stream("POST", f"{api}/v1/audio/speech", json=body, headers=headers, timeout=300) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("audio/")
        data = b"".join(response.iter_raw())
    samples, _ = decode(data, "pcm", RATE)
    assert_speech(samples)
    assert_counts(server, {streaming: before[streaming] + 1, offline: before[offline]})
    wait_for_counts(server, {token2wav: before[token2wav] + 1})  # one call a chunk at least


def test_health_names_both_deployments_at_24_khz(api):
    models = httpx.get(f"{api}/health", timeout=30).json()["models"]
    assert models == {
        name: {"ready": True, "streaming_model": streaming, "offline_model": offline, "sample_rate": RATE}
        for name, (streaming, offline) in ((n, m.split(",")) for n, m in MODELS.items())
    }


@pytest.mark.parametrize("model", MODELS)
def test_text_streamed_in_over_the_websocket_is_spoken_clause_by_clause(api, model):
    """`WS /v1/audio/speech/stream` (docs/streaming-text.md) in front of this family: the text arrives character
    by character, each clause is spoken once complete, as 24 kHz PCM."""
    url = api.replace("http://", "ws://") + "/v1/audio/speech/stream"
    headers = {"Authorization": f"Bearer {KEY}"}
    with connect(url, additional_headers=headers, open_timeout=scaled(30), max_size=None) as ws:
        config = {"type": "session.config", "model": model, "voice": "zh"}
        ws.send(json.dumps(config | {"stream_audio": True, "split_granularity": "clause"}))
        for piece in TEXT:
            ws.send(json.dumps({"type": "input.text", "text": piece}))
        ws.send(json.dumps({"type": "session.close"}))
        events, audio = [], bytearray()
        while not (events and events[-1].get("type") == "session.done"):
            message = ws.recv(timeout=scaled(300))
            if isinstance(message, bytes):
                audio += message
            else:
                events.append(json.loads(message))
    kinds = [e["type"] for e in events]
    assert kinds == ["session.created", *["audio.start", "audio.done"] * 2, "session.done"], events
    spoken = [e["sentence_text"] for e in events if e["type"] == "audio.start"]
    assert [text[:4] for text in spoken] == ["身临其境", "换新体验"], (
        spoken
    )  # as the text front end writes them
    assert events[0]["sample_rate"] == RATE and events[-1]["closed"] is True
    samples = np.frombuffer(bytes(audio), dtype=np.int16)
    assert samples.size == sum(e["samples"] for e in events if e["type"] == "audio.done") > 0
