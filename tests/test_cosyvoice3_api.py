"""The OpenAI-compatible speech API (run.sh stage 6) in front of CosyVoice3 on the real tritonserver (tiny synthetic
checkpoint, CPU): the model map (`cosyvoice3=cosyvoice3,cosyvoice3_offline`, 24 kHz from the name), whole files
and streams through the official `openai` client and plain HTTP; and the benchmark client's rates for the name.
Voices beyond cloning through the same code as CosyVoice2's (the BLS's `voice_modes` / `voice_profile_kind`):
`instructions`, `ref_audio` with and without `ref_text`, and a saved voice's `cosyvoice3` profile, which spares the
audio_tokenizer and speaker_embedding (Triton's inference counts)."""

from __future__ import annotations

import base64
import io
import json

import httpx
import numpy as np
import openai
import pytest
import soundfile
from conftest import PROMPT_ZH_TEXT
from cosyvoice3_models import build_cosyvoice3_models
from openai_api_process import api_process, decode, zh_voices
from triton_stats import inference_count
from waiting import scaled
from websockets.sync.client import connect

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
def voices_dir(tmp_path_factory, prompt_zh):
    return zh_voices(tmp_path_factory.mktemp("voices"), prompt_zh, PROMPT_ZH_TEXT)


@pytest.fixture(scope="module")
def api(server, voices_dir, tmp_path_factory):
    args = ["--triton-url", server.grpc_url, "--voices-dir", str(voices_dir), "--api-key", KEY]
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


def test_text_streamed_in_over_the_websocket_is_spoken_sentence_by_sentence(api):
    """`WS /v1/audio/speech/stream` in front of CosyVoice3: text in small deltas, split at sentences, each
    sentence spoken once complete, streamed as 24 kHz PCM frames."""
    url = api.replace("http://", "ws://") + "/v1/audio/speech/stream"
    headers = {"Authorization": f"Bearer {KEY}"}
    text = "身临其境。换新体验。"
    with connect(url, additional_headers=headers, open_timeout=scaled(30), max_size=None) as ws:
        config = {"type": "session.config", "model": "cosyvoice3", "voice": "zh", "response_format": "pcm"}
        ws.send(json.dumps(config | {"stream_audio": True, "split_granularity": "sentence"}))
        for start in range(0, len(text), 3):
            ws.send(json.dumps({"type": "input.text", "text": text[start : start + 3]}))
        ws.send(json.dumps({"type": "session.close"}))
        events, frames = [], []
        while not (events and events[-1].get("type") == "session.done"):
            message = ws.recv(timeout=scaled(300))
            if isinstance(message, bytes):
                frames.append(message)
            else:
                events.append(json.loads(message))
    kinds = [e["type"] for e in events]
    assert kinds == ["session.created", *["audio.start", "audio.done"] * 2, "session.done"], events
    assert [e["sentence_text"] for e in events if e["type"] == "audio.start"] == ["身临其境。", "换新体验。"]
    assert events[0]["sample_rate"] == RATE and events[-1]["closed"] is True
    samples = np.frombuffer(b"".join(frames), dtype=np.int16)
    assert samples.size == sum(e["samples"] for e in events if e["type"] == "audio.done") > 0
    assert len(frames) >= 2  # streamed: more than one PCM frame for two sentences


def test_health_names_the_deployment(api):
    models = httpx.get(f"{api}/health", timeout=30).json()["models"]
    assert models == {
        "cosyvoice3": {"ready": True, "streaming_model": "cosyvoice3", "offline_model": "cosyvoice3_offline",
                       "sample_rate": RATE}
    }  # fmt: skip


# voices beyond cloning

HEADERS = {"Authorization": f"Bearer {KEY}"}
FRONT_END = ("cosyvoice3_audio_tokenizer", "cosyvoice3_speaker_embedding")


@pytest.fixture(scope="module")
def reference_wav(prompt_zh) -> bytes:
    """3 s of the prompt as a WAV file."""
    samples, rate = soundfile.read(prompt_zh, dtype="float32")
    buffer = io.BytesIO()
    soundfile.write(buffer, samples[: 3 * rate], rate, format="WAV")
    return buffer.getvalue()


def speech(api, **body) -> np.ndarray:
    body = {"model": "cosyvoice3", "input": TEXT, "response_format": "wav"} | body
    response = httpx.post(f"{api}/v1/audio/speech", json=body, headers=HEADERS, timeout=300)
    assert response.status_code == 200, response.text
    samples, rate = decode(response.content, "wav", pcm_rate=0)
    assert rate == RATE
    return samples


def front_end_counts(server) -> tuple[int, ...]:
    return tuple(inference_count(server, model) for model in FRONT_END)


def test_instructions_follow_cosyvoice3s_instruct_mode(api):
    client = openai.OpenAI(base_url=f"{api}/v1", api_key=KEY, max_retries=0, timeout=300)
    response = client.audio.speech.create(
        model="cosyvoice3", voice="zh", input=TEXT, instructions="请用广东话表达。", response_format="wav"
    )
    samples, rate = decode(response.content, "wav", pcm_rate=0)
    assert rate == RATE
    assert_speech(samples)


def test_ref_audio_with_and_without_ref_text(api, reference_wav):
    uri = "data:audio/wav;base64," + base64.b64encode(reference_wav).decode()
    assert_speech(speech(api, ref_audio=uri, ref_text=PROMPT_ZH_TEXT[:14]))  # zero-shot
    assert_speech(speech(api, ref_audio=uri))  # no transcript: cross-lingual


def test_a_saved_voice_has_a_cosyvoice3_profile_that_spares_the_front_end(
    api, server, voices_dir, reference_wav
):
    files = {"audio_sample": ("ref.wav", reference_wav, "audio/wav")}
    data = {"name": "bob", "transcript": PROMPT_ZH_TEXT[:14]}
    response = httpx.post(f"{api}/v1/audio/voices", files=files, data=data, headers=HEADERS, timeout=300)
    assert response.status_code == 201, response.text
    assert response.json()["profiles"] == ["cosyvoice3"] and (voices_dir / "bob.cosyvoice3.npz").is_file()
    before = front_end_counts(server)
    assert_speech(speech(api, voice="bob"))
    assert_speech(speech(api, voice="bob", instructions="请用尽可能快地语速说一句话。"))
    body = {
        "model": "cosyvoice3",
        "voice": "bob",
        "input": TEXT,
        "response_format": "pcm",
        "stream_format": "audio",
    }
    with httpx.stream("POST", f"{api}/v1/audio/speech", json=body, headers=HEADERS, timeout=300) as streamed:
        assert streamed.status_code == 200
        samples, _ = decode(b"".join(streamed.iter_raw()), "pcm", RATE)
    assert_speech(samples)
    assert front_end_counts(server) == before
    deleted = httpx.delete(f"{api}/v1/audio/voices/bob", headers=HEADERS, timeout=30)
    assert deleted.status_code == 200 and not list(voices_dir.glob("bob.*"))
